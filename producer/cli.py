"""The producer's subcommands of ``paternoster``: submit, status, stream, result, cancel, and
``limits`` (``producer/limits_cli.py``).

They need only redis and pydantic, so they work in a web app's install without torch. Exit codes:
0 success; 1 the job ended without ``done`` (error, cancelled, expired), a timeout, or no Redis;
2 bad input (an invalid job spec, an unknown job id); 75 (``EX_TEMPFAIL``) an admission limit
refused the job: nothing was enqueued, try again later. ``--json`` output goes to stdout only;
messages go to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import redis

from producer.client import Producer
from producer.errors import InvalidJob, JobEnded, JobNotFound, JobTimeout, NoRedis, Overloaded
from producer.limits_cli import add_limits_command
from producer.protocol import JobState, TokenEvent
from producer.reconnect import DEFAULT_RECONNECT
from producer.results import JobResult
from producer.sampling_args import add_sampling_arguments, sampling_fields
from producer.status_cli import add_status_command
from producer.top import add_top_command
from producer.webhook_args import add_webhook_arguments, webhook_fields


def add_producer_commands(sub: Any) -> None:
    """Register submit/status/stream/result/cancel on ``paternoster``'s subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--redis-url", default=None, help="default: $REDIS_URL, else an embedded Redis"
    )
    common.add_argument(
        "--prefix", default=None, help="key prefix (default: $PATERNOSTER_PREFIX, else paternoster)"
    )
    common.add_argument("--json", action="store_true", help="machine-readable output")
    following = argparse.ArgumentParser(add_help=False)
    following.add_argument(
        "--reconnect-s",
        type=_seconds,
        default=DEFAULT_RECONNECT.max_wait_s,
        metavar="S",
        help="reconnect to a Redis that went away for up to S s, then exit 1 (default %(default)g)",
    )
    follows = [common, following]  # the commands that follow a job's events

    _add_submit_command(sub, follows)
    add_status_command(sub, common, _guarded)

    stream = sub.add_parser("stream", parents=follows, help="follow a job's events until it ends")
    stream.add_argument("job_id", metavar="ID")
    stream.add_argument(
        "--from-event", default="0", metavar="EVENT_ID", help="resume after this event id"
    )
    stream.set_defaults(func=_guarded(cmd_stream))

    result = sub.add_parser("result", parents=follows, help="wait for a job and print its text")
    result.add_argument("job_id", metavar="ID")
    result.add_argument("--timeout-s", type=float, default=None, help="default: wait forever")
    result.set_defaults(func=_guarded(cmd_result))

    cancel = sub.add_parser("cancel", parents=[common], help="cancel a queued or running job")
    cancel.add_argument("job_id", metavar="ID")
    cancel.set_defaults(func=_guarded(cmd_cancel))

    add_limits_command(sub, common, _guarded)
    add_top_command(sub, common, _guarded)


def _add_submit_command(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    submit = sub.add_parser("submit", parents=parents, help="enqueue a job and print its id")
    submit.add_argument("prompt", metavar="PROMPT")
    submit.add_argument("--chat", action="store_true", help="wrap PROMPT as one user message")
    submit.add_argument("--stream", action="store_true", help="follow its events until it ends")
    submit.add_argument("--id", dest="job_id", metavar="ID", help="job id (default: random)")
    submit.add_argument(
        "--priority",
        default=None,
        help="-100..100, lower runs first, or interactive (-10), default (0), batch (10)",
    )
    submit.add_argument("--tenant", default=None, help="default: 'default'")
    submit.add_argument(
        "--deadline-s", type=float, default=None, help="not started within S seconds: expired"
    )
    submit.add_argument(
        "--cache-salt",
        default=None,
        help="only jobs with the same salt share cached prompt blocks (by default a worker also "
        "salts by tenant, so tenants never share)",
    )
    add_sampling_arguments(submit)
    add_webhook_arguments(submit)
    submit.set_defaults(func=_guarded(cmd_submit))


Command = Callable[[argparse.Namespace], int]
EX_TEMPFAIL = 75  # sysexits.h: "try again later", what a refused submit asks for


def _guarded(command: Command) -> Command:
    """Expected failures as one line on stderr: exit 2 for bad input, 75 for an admission limit,
    1 for the rest."""

    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except (InvalidJob, JobNotFound) as err:
            return _error(args, str(err), 2)
        except Overloaded as err:
            return _error(args, f"{err} (nothing was enqueued)", EX_TEMPFAIL)
        except JobTimeout as err:
            return _error(args, str(err), 1)
        except (NoRedis, redis.ConnectionError, redis.TimeoutError) as err:
            return _error(args, f"cannot reach Redis: {err}", 1)

    return run


def _error(args: argparse.Namespace, message: str, code: int) -> int:
    print(f"paternoster {args.command}: error: {message}", file=sys.stderr)
    return code


def _seconds(text: str) -> float:
    if float(text) < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {text}")
    return float(text)


def _producer(args: argparse.Namespace) -> Producer:
    max_wait_s = getattr(args, "reconnect_s", DEFAULT_RECONNECT.max_wait_s)  # commands that follow
    reconnect = replace(DEFAULT_RECONNECT, max_wait_s=max_wait_s)
    return Producer(args.redis_url, prefix=args.prefix, reconnect=reconnect)


def cmd_submit(args: argparse.Namespace) -> int:
    if args.chat:
        prompt: dict[str, Any] = {"messages": [{"role": "user", "content": args.prompt}]}
    else:
        prompt = {"prompt": args.prompt}
    with _producer(args) as producer:
        handle = producer.submit(
            **prompt,
            sampling=sampling_fields(args),
            job_id=args.job_id,
            priority=args.priority,
            tenant=args.tenant,
            deadline_s=args.deadline_s,
            cache_salt=args.cache_salt,
            webhook=webhook_fields(args),
        )
        if not handle.created:
            print(f"job {handle.job_id} exists already; nothing was added", file=sys.stderr)
        if not args.stream:
            print(
                _json({"job_id": handle.job_id, "created": handle.created})
                if args.json
                else handle.job_id
            )
            return 0
        if handle.created:
            print(f"job {handle.job_id}", file=sys.stderr)
        return _follow(args, producer, handle.job_id, "0")


def cmd_stream(args: argparse.Namespace) -> int:
    with _producer(args) as producer:
        return _follow(args, producer, args.job_id, args.from_event)


def cmd_result(args: argparse.Namespace) -> int:
    with _producer(args) as producer:
        try:
            result, code = producer.result(args.job_id, timeout_s=args.timeout_s), 0
        except JobEnded as ended:
            result, code = ended.result, 1
    if args.json:
        print(_json(_result_fields(result)))
    elif result.text or code == 0:
        print(result.text)
    if code:
        print(f"paternoster result: {_ending(result)}", file=sys.stderr)
    return code


def cmd_cancel(args: argparse.Namespace) -> int:
    with _producer(args) as producer:
        outcome = producer.cancel(args.job_id)
    print(_json({"job_id": args.job_id, "outcome": outcome}) if args.json else outcome)
    return 0


def _follow(args: argparse.Namespace, producer: Producer, job_id: str, from_event: str) -> int:
    """Print events as they come (JSON lines, or the text deltas); exit 0 only on ``done``."""
    result = JobResult(job_id)
    wrote_text = False
    try:
        for event in producer.stream(job_id, from_event):
            from_event = event.event_id or from_event
            result.apply(event)
            if args.json:
                fields = event.model_dump(mode="json", exclude_none=True)
                print(_json({"event_id": event.event_id, **fields}), flush=True)
            elif isinstance(event, TokenEvent) and event.text:
                sys.stdout.write(event.text)
                sys.stdout.flush()
                wrote_text = True
    except KeyboardInterrupt:
        resume = f"paternoster stream {job_id} --from-event {from_event}"
        print(f"\ninterrupted; the job goes on. Resume with: {resume}", file=sys.stderr)
        return 130
    if wrote_text:
        print()
    if result.state is not JobState.DONE:
        print(f"paternoster {args.command}: {_ending(result)}", file=sys.stderr)
        return 1
    if not args.json:
        print(_summary(result), file=sys.stderr)
    return 0


def _ending(result: JobResult) -> str:
    """Why a job ended without ``done``, in one line."""
    if result.state is JobState.ERROR:
        return f"job {result.job_id} failed: {result.error_code}: {result.error_message}"
    if result.state is JobState.EXPIRED:
        return f"job {result.job_id} expired: {result.error_message}"
    done = f" after {len(result.token_ids)} tokens" if result.token_ids else ""
    return f"job {result.job_id} was {result.state.value}{done}"


def _summary(result: JobResult) -> str:
    """The ``done`` line: finish reason, token counts, timings."""
    parts = [f"[{result.finish_reason}]"]
    if result.usage is not None:
        u = result.usage
        parts.append(f"{u.completion_tokens} tokens (prompt {u.prompt_tokens});")
    if result.timings is not None:
        t = result.timings
        ttft = "-" if t.ttft_s is None else f"{t.ttft_s:.3f} s"
        parts.append(f"queued {t.queued_s:.3f} s, first token {ttft}, total {t.total_s:.3f} s")
    return " ".join(parts)


def _result_fields(result: JobResult) -> dict[str, Any]:
    return {
        "job_id": result.job_id,
        "state": result.state.value,
        "text": result.text,
        "token_ids": result.token_ids,
        "finish_reason": result.finish_reason,
        "usage": None if result.usage is None else result.usage.model_dump(),
        "timings": None if result.timings is None else result.timings.model_dump(),
        "worker": result.worker,
        "error_code": result.error_code,
        "error_message": result.error_message,
        "choices": [
            {
                "choice": c.choice,
                "text": c.text,
                "token_ids": c.token_ids,
                "finish_reason": c.finish_reason,
            }
            for c in result.choices
        ],
    }


def _json(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)
