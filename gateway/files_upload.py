"""``multipart/form-data`` bodies, as ``POST /v1/files`` receives them from OpenAI's clients.

Parsed here rather than through Starlette's form parser, which needs the ``python-multipart``
package the gateway does not install: an upload is one small body already bounded by
``BodyLimit`` (read whole before the route runs), so splitting it at its boundary is enough.
Header parameters (``name``, ``filename``, quoting) are read by the standard library's
``email.message``, which implements RFC 2231/7578's rules for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from email.message import Message

from gateway.errors import ApiError

CRLF = b"\r\n"


@dataclass(frozen=True)
class Upload:
    """The form's text fields by name, and its one file part."""

    fields: dict[str, str] = field(default_factory=dict)
    filename: str | None = None
    content: bytes | None = None


def _params(header_name: str, value: str) -> Message:
    message = Message()
    message[header_name] = value
    return message


def boundary_of(content_type: str) -> bytes:
    """The boundary of a ``multipart/form-data`` Content-Type; a 422 for anything else."""
    header = _params("content-type", content_type)
    boundary = header.get_param("boundary")
    if header.get_content_type() != "multipart/form-data" or not isinstance(boundary, str):
        raise ApiError(422, "expected a multipart/form-data body with a boundary", param="file")
    return boundary.encode("latin-1")


def _part(chunk: bytes) -> tuple[str, str | None, bytes]:
    """One part's form name, filename and bytes."""
    head, sep, content = chunk.partition(CRLF + CRLF)
    if not sep:
        raise ApiError(422, "malformed multipart body: a part without headers", param="file")
    disposition = Message()
    for line in head.split(CRLF):
        header, _, value = line.decode("latin-1").partition(":")
        if header.strip().lower() == "content-disposition":
            disposition = _params("content-disposition", value.strip())
    name = disposition.get_param("name", header="content-disposition")
    if not isinstance(name, str):
        raise ApiError(422, "malformed multipart body: a part without a name", param="file")
    return name, disposition.get_filename(), content


def parse_multipart(content_type: str, body: bytes) -> Upload:
    """The fields and the file of a form body. The delimiter is CRLF ``--boundary``, so a
    boundary string that appears inside a line of the file does not split it."""
    delimiter = CRLF + b"--" + boundary_of(content_type)
    chunks = (CRLF + body).split(delimiter)
    if len(chunks) < 3 or not chunks[-1].startswith(b"--"):
        raise ApiError(422, "malformed multipart body: no closing boundary", param="file")
    fields: dict[str, str] = {}
    filename, content = None, None
    for chunk in chunks[1:-1]:
        name, part_filename, data = _part(chunk.removeprefix(CRLF))
        if part_filename is not None or name == "file":
            filename, content = part_filename or name, data
        else:
            fields[name] = data.decode("utf-8", errors="replace")
    return Upload(fields, filename, content)
