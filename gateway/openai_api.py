"""OpenAI-compatible routes: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``.

Each request becomes one job on the same jobs stream the native API feeds, so OpenAI clients
share the workers, priorities and tenants with everyone else. The response id is the job id with
OpenAI's prefix (``cmpl-``, ``chatcmpl-``); ``X-Paternoster-Job-Id`` carries it bare (behind
auth, the id in the caller's namespace, as the native API takes it: ``tenancy``).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import JSONResponse, StreamingResponse

from gateway.auth import Caller, caller
from gateway.bodies import StrictJsonRoute
from gateway.config import GatewayConfig
from gateway.errors import ApiError
from gateway.events import SSE_HEADERS
from gateway.jobs import jobs_of
from gateway.openai_logprobs import read_logprobs
from gateway.openai_models import ChatCompletionRequest, CompletionRequest, OpenAIRequest
from gateway.openai_stream import Shape, openai_sse
from producer import JobTimeout
from producer.requests import build_spec

router = APIRouter(prefix="/v1", tags=["openai"], route_class=StrictJsonRoute)
CallerDep = Annotated[Caller, Depends(caller)]
KeepHeader = Annotated[
    str | None,
    Header(
        alias="X-Paternoster-Keep-On-Disconnect",
        description="1: a streaming client that disconnects leaves its job running",
    ),
]
STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}, "description": "JSON, or SSE chunks if stream"}
}


@router.get("/models")
async def list_models(request: Request, who: CallerDep) -> dict[str, Any]:
    """The one model this deployment serves, under its configured name."""
    config: GatewayConfig = request.app.state.config
    model = {"id": config.model_name, "object": "model", "created": 0, "owned_by": "paternoster"}
    return {"object": "list", "data": [model]}


@router.post("/completions", responses=STREAM_RESPONSES)
async def completions(
    body: CompletionRequest, request: Request, who: CallerDep, keep: KeepHeader = None
) -> Any:
    """Text completion of one prompt; ``stream: true`` for SSE chunks ending ``[DONE]``."""
    return await run_openai(request, who, body, body.prompt_fields(), body.token_limit, keep)


@router.post("/chat/completions", responses=STREAM_RESPONSES)
async def chat_completions(
    body: ChatCompletionRequest, request: Request, who: CallerDep, keep: KeepHeader = None
) -> Any:
    """Chat completion through the model's chat template; ``stream: true`` for SSE chunks."""
    return await run_openai(request, who, body, body.prompt_fields(), body.token_limit, keep)


async def run_openai(
    request: Request,
    who: Caller,
    body: OpenAIRequest,
    prompt: dict[str, Any],
    max_tokens: int | None,
    keep: str | None,
) -> Any:
    """Submit the job, then stream its chunks or wait for its whole response."""
    config: GatewayConfig = request.app.state.config
    sampling = body.sampling(max_tokens, config.default_max_tokens)
    jobs = jobs_of(request, who)
    tenant = who.tenant_for(body.user)
    spec = build_spec(
        **prompt, job_id=jobs.new_job_id(None), tenant=tenant, webhook=body.webhook, **sampling
    )
    job_id, _ = await jobs.submit(spec)  # a fresh random id: always created
    shape = Shape.of(body, job_id, config.model_name)
    headers = {"X-Paternoster-Job-Id": job_id}
    if body.stream:
        frames = openai_sse(
            jobs.producer,
            spec.id,
            shape,
            include_usage=body.include_usage,
            cancel_on_disconnect=keep not in ("1", "true", "yes"),
            idle_s=config.sse_ping_s,
        )
        return StreamingResponse(
            frames, media_type="text/event-stream", headers={**SSE_HEADERS, **headers}
        )
    try:
        result = await jobs.result(job_id, timeout_s=config.request_timeout_s)
    except JobTimeout as exc:
        await jobs.cancel(job_id)  # nobody will read it now
        raise ApiError(504, str(exc), type_="timeout", code="timeout", job_id=job_id) from exc
    logprobs = await read_logprobs(jobs.producer, spec.id) if shape.logprobs else None
    return JSONResponse(shape.whole(result, logprobs), headers=headers)
