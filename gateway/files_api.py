"""OpenAI's Files API, as far as batches need it: ``/v1/files`` upload, list, get, content,
delete. Only ``purpose=batch`` is taken; the files a batch produces have ``batch_output``."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response

from gateway.auth import Caller, caller
from gateway.batch_store import BatchStore
from gateway.bodies import StrictJsonRoute
from gateway.config import GatewayConfig
from gateway.errors import ApiError
from gateway.files_store import FileObject, FileStore, new_file_id
from gateway.files_upload import parse_multipart

router = APIRouter(prefix="/v1/files", tags=["batch"], route_class=StrictJsonRoute)
CallerDep = Annotated[Caller, Depends(caller)]
# OpenAI's bounds for an upload's expires_after[seconds]: an hour to 30 days.
MIN_EXPIRES_AFTER_S, MAX_EXPIRES_AFTER_S = 3600, 30 * 24 * 3600
MAX_LIST_LIMIT = 10_000  # OpenAI's largest page of files


def page(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """OpenAI's cursor page: the objects and the ids a client pages on."""
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    return {"object": "list", "data": data, "first_id": first, "last_id": last,
            "has_more": has_more}  # fmt: skip


def files_of(request: Request) -> FileStore:
    store: FileStore = request.app.state.files
    return store


def _ttl_s(fields: dict[str, str], default_s: int) -> int:
    """The upload's lifetime: ``expires_after[seconds]`` (anchored at creation) or the
    gateway's ``files_ttl_s``."""
    given = fields.get("expires_after[seconds]")
    if given is None:
        return default_s
    if fields.get("expires_after[anchor]", "created_at") != "created_at":
        raise ApiError(422, "expires_after.anchor: only created_at", param="expires_after")
    if not given.isdigit() or not MIN_EXPIRES_AFTER_S <= int(given) <= MAX_EXPIRES_AFTER_S:
        raise ApiError(
            422,
            f"expires_after.seconds: {MIN_EXPIRES_AFTER_S} to {MAX_EXPIRES_AFTER_S}",
            param="expires_after",
        )
    return int(given)


# The body as OpenAPI has it: the route reads it itself (``files_upload``), not through FastAPI.
UPLOAD_SCHEMA = {
    "type": "object",
    "required": ["file", "purpose"],
    "properties": {
        "file": {"type": "string", "format": "binary", "description": "JSONL, UTF-8"},
        "purpose": {"type": "string", "enum": ["batch"]},
        "expires_after[seconds]": {"type": "integer"},
    },
}
UPLOAD_BODY = {"required": True, "content": {"multipart/form-data": {"schema": UPLOAD_SCHEMA}}}


@router.post(
    "",
    responses={413: {"description": "the file is larger than max_file_bytes"}},
    openapi_extra={"requestBody": UPLOAD_BODY},
)
async def create_file(request: Request, who: CallerDep) -> dict[str, Any]:
    """Upload a JSONL file (multipart ``file`` and ``purpose=batch``)."""
    config: GatewayConfig = request.app.state.config
    upload = parse_multipart(request.headers.get("content-type", ""), await request.body())
    if upload.content is None:
        raise ApiError(422, "file: a multipart part named file is required", param="file")
    purpose = upload.fields.get("purpose")
    if purpose != "batch":
        raise ApiError(422, f"purpose: only batch is supported, not {purpose!r}", param="purpose")
    if len(upload.content) > config.max_file_bytes:
        raise ApiError(413, f"file larger than {config.max_file_bytes} bytes",
                       code="file_too_large", param="file")  # fmt: skip
    try:
        upload.content.decode()
    except UnicodeDecodeError as exc:
        raise ApiError(422, f"file: not UTF-8 ({exc.reason} at byte {exc.start})",
                       param="file") from None  # fmt: skip
    now = int(time.time())
    meta = FileObject(
        new_file_id(),
        bytes=len(upload.content),
        created_at=now,
        expires_at=now + _ttl_s(upload.fields, config.files_ttl_s),
        filename=upload.filename or "upload.jsonl",
        purpose=purpose,
        owner=who.tenant or "",
    )
    return (await files_of(request).create(meta, upload.content)).body()


@router.get("")
async def list_files(
    request: Request,
    who: CallerDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST_LIMIT)] = MAX_LIST_LIMIT,
    purpose: str | None = None,
) -> dict[str, Any]:
    """The caller's files of ``purpose`` (any when not given), newest first; ``after`` an id
    of the previous page."""
    found, more = await files_of(request).list(who, limit, after, purpose)
    return page([f.body() for f in found], more)


@router.get("/{file_id}")
async def get_file(file_id: str, request: Request, who: CallerDep) -> dict[str, Any]:
    return (await files_of(request).get(file_id, who)).body()


@router.get("/{file_id}/content", response_class=Response)
async def file_content(file_id: str, request: Request, who: CallerDep) -> Response:
    """The file's bytes (JSONL)."""
    store = files_of(request)
    content = await store.content(await store.get(file_id, who))
    return Response(content, media_type="application/jsonl")


@router.delete("/{file_id}")
async def delete_file(file_id: str, request: Request, who: CallerDep) -> dict[str, Any]:
    store = files_of(request)
    meta = await store.get(file_id, who)
    batches: BatchStore = request.app.state.batches
    if (batch_id := await batches.uses_input(meta.id)) is not None:
        raise ApiError(409, f"file {file_id} is the input of batch {batch_id}, not yet ended",
                       code="file_in_use", param="file_id")  # fmt: skip
    await store.delete(meta)
    return {"id": file_id, "object": "file", "deleted": True}
