"""``paternoster gateway``: the subcommand, kept light (fastapi and uvicorn import on use)."""

from __future__ import annotations

import argparse
from typing import Any


def add_gateway_command(sub: Any) -> None:
    """Register ``gateway`` on the ``paternoster`` subparsers."""
    gw: argparse.ArgumentParser = sub.add_parser(
        "gateway", help="serve the HTTP API (native jobs and OpenAI-compatible) over Redis"
    )
    gw.add_argument("--host", default="127.0.0.1")
    gw.add_argument("--port", type=int, default=8000)
    gw.add_argument("--redis-url", default=None, help="default: REDIS_URL, else an embedded Redis")
    gw.add_argument(
        "--prefix", default=None, help="key prefix (default: PATERNOSTER_PREFIX or paternoster)"
    )
    gw.add_argument(
        "--tokens-file",
        default=None,
        help="JSON {token: tenant}; turns bearer auth on (default: PATERNOSTER_GATEWAY_TOKENS)",
    )
    gw.add_argument(
        "--model-name", default=None, help="the model /v1/models lists (default: paternoster)"
    )
    gw.add_argument(
        "--max-body-bytes",
        type=int,
        default=None,
        help="larger request bodies are a 413 (default: PATERNOSTER_GATEWAY_MAX_BODY_BYTES, "
        "else 4 MiB)",
    )
    gw.add_argument(
        "--files-dir", default=None, help="Batch API files' bytes here (default: in Redis)"
    )
    gw.add_argument(
        "--webhooks", action="store_true", help="also deliver job webhooks (docs/webhooks.md)"
    )
    gw.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    gw.set_defaults(func=cmd_gateway)


def cmd_gateway(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.app import create_app
    from gateway.config import GatewayConfig

    config = GatewayConfig.from_env(
        args.tokens_file,
        redis_url=args.redis_url,
        prefix=args.prefix,
        model_name=args.model_name,
        max_body_bytes=args.max_body_bytes,
        files_dir=args.files_dir,
        webhooks=args.webhooks or None,
    )
    uvicorn.run(create_app(config), host=args.host, port=args.port, log_level=args.log_level)
    return 0
