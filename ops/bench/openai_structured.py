"""Structured outputs and tool calls through the gateway with the official ``openai`` client,
on the bundled model: how many outputs parse and validate (issue 20's measurement).

    python ops/bench/openai_structured.py --seeds 20 --out ops/bench/results/openai_structured.json
    python ops/bench/openai_structured.py --seeds 2                    # smoke, about a minute
    python ops/bench/openai_structured.py --modes tool_choice_required  # one mode again

A redis-server of its own, one worker (``paternoster worker``, the bundled SmolLM2 unless
``--model``) and a gateway. For each of ten schemas of different shapes (flat, enums, nested
objects, arrays with min/max items, number ranges, string patterns, optional fields, arrays of
objects, deep nesting, mixed) and each seed, at ``--temperature``: ``chat.completions.parse``
with the Pydantic model (parsed must be an instance), and plain ``response_format`` json_schema
with its schema (the text must parse and validate, ``jsonschema``). Then ``tool_choice:
required`` over three strict function tools, per seed: every call must name one of them with
arguments its model validates.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx
import jsonschema
import openai
from pydantic import BaseModel, Field

from ops.bench.common import write_report
from ops.bench.redis_server import RedisServer, free_port

Name = Field(min_length=1, max_length=24)


class Person(BaseModel):
    name: str = Name
    age: int = Field(ge=0, le=120)
    member: bool


class Shirt(BaseModel):
    color: Literal["red", "green", "blue"]
    size: Literal["S", "M", "L", "XL"]


class Address(BaseModel):
    street: str = Name
    city: str = Name
    zip: str = Field(pattern=r"^[0-9]{5}$")


class Customer(BaseModel):
    name: str = Name
    address: Address


class Tagged(BaseModel):
    tags: list[Literal["news", "sport", "tech", "art"]] = Field(min_length=1, max_length=3)


class Place(BaseModel):
    lat: float = Field(ge=-90, le=90)
    lon: float = Field(ge=-180, le=180)


class Flight(BaseModel):
    code: str = Field(pattern=r"^[A-Z]{3}-[0-9]{3}$")
    date: str = Field(pattern=r"^20[0-9]{2}-[01][0-9]-[0-3][0-9]$")


class Book(BaseModel):
    title: str = Name
    subtitle: str | None = None


class Item(BaseModel):
    name: str = Name
    qty: int = Field(ge=1, le=10)


class Order(BaseModel):
    items: list[Item] = Field(min_length=1, max_length=4)


class Leaf(BaseModel):
    depth: int = Field(ge=0, le=9)


class Branch(BaseModel):
    leaf: Leaf


class Tree(BaseModel):
    branch: Branch


class Verdict(BaseModel):
    answer: Literal["yes", "no"]
    confidence: int = Field(ge=0, le=100)
    reasons: list[str] = Field(max_length=2)


SCHEMAS: list[type[BaseModel]] = [Person, Shirt, Customer, Tagged, Place, Flight, Book, Order,
                                  Tree, Verdict]  # fmt: skip
TOOLS: list[type[BaseModel]] = [Shirt, Place, Verdict]
# The token budget per output. The longest bounded answer (Order: 4 items of 24-character names)
# is about 100 tokens in compact JSON; Verdict's reasons and Book's subtitle are unbounded strings
# that SmolLM2-135M at 0.7 sometimes never closes (every miss of 48/50 and 29/30 at 200 tokens).
# A cut output legitimately ends `length`: the report counts those apart.
DEFAULT_MAX_TOKENS = 512


def ask(model: type[BaseModel]) -> list[Any]:
    return [{"role": "user", "content": f"Give an example {model.__name__} as JSON."}]


def check_parse(client: openai.OpenAI, args: argparse.Namespace, model: type[BaseModel],
                seed: int) -> tuple[bool, str, str]:  # fmt: skip
    try:
        out = client.chat.completions.parse(model="m", messages=ask(model), response_format=model,
                                            temperature=args.temperature, seed=seed,
                                            max_tokens=args.max_tokens)  # fmt: skip
    except openai.LengthFinishReasonError as exc:  # parse() raises where the budget ran out
        return False, "length", f"{model.__name__}: {exc.completion.choices[0].message.content}"
    choice = out.choices[0]
    text = f"{model.__name__}: {choice.message.content}"
    return isinstance(choice.message.parsed, model), str(choice.finish_reason), text


def check_plain(client: openai.OpenAI, args: argparse.Namespace, model: type[BaseModel],
                seed: int) -> tuple[bool, str, str]:  # fmt: skip
    schema = model.model_json_schema()
    named = {"name": model.__name__, "schema": schema, "strict": True}
    fmt: Any = {"type": "json_schema", "json_schema": named}
    out = client.chat.completions.create(model="m", messages=ask(model), response_format=fmt,
                                         temperature=args.temperature, seed=seed,
                                         max_tokens=args.max_tokens)  # fmt: skip
    text = out.choices[0].message.content or ""
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False, str(out.choices[0].finish_reason), f"{model.__name__}: {text}"
    return True, str(out.choices[0].finish_reason), text


def check_tools(client: openai.OpenAI, args: argparse.Namespace, _: Any,
                seed: int) -> tuple[bool, str, str]:  # fmt: skip
    tools = [openai.pydantic_function_tool(m) for m in TOOLS]
    out = client.chat.completions.create(model="m", messages=ask(Verdict), tools=tools,
                                         tool_choice="required", temperature=args.temperature,
                                         seed=seed, max_tokens=args.max_tokens)  # fmt: skip
    message = out.choices[0].message
    by_name = {m.__name__: m for m in TOOLS}
    calls = message.tool_calls or []
    try:
        ok = bool(calls) and all(by_name[c.function.name].model_validate_json(  # type: ignore[union-attr]
            c.function.arguments) for c in calls)  # type: ignore[union-attr]  # fmt: skip
    except (KeyError, ValueError):
        ok = False
    shown = json.dumps([c.model_dump() for c in calls]) if calls else str(message.content)
    return ok, str(out.choices[0].finish_reason), shown


Check = Callable[[openai.OpenAI, argparse.Namespace, Any, int], tuple[bool, str, str]]


MODES: dict[str, Check] = {"parse": check_parse, "plain_response_format": check_plain,
                           "tool_choice_required": check_tools}  # fmt: skip


def run_all(client: openai.OpenAI, args: argparse.Namespace) -> dict[str, Any]:
    """Every mode's cases, seed by seed (a run stopped early has its first seeds whole): each
    schema through ``parse`` and plain ``response_format``, and one ``tool_choice`` call."""
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    cases = [(mode, model, seed) for seed in seeds for mode in args.modes
             for model in (SCHEMAS if mode != "tool_choice_required" else [None])]  # fmt: skip
    start = time.perf_counter()

    def one(case: tuple[str, Any, int]) -> tuple[str, bool, str, str]:
        mode, model, seed = case
        try:
            ok, reason, text = MODES[mode](client, args, model, seed)
        except openai.APIError as exc:  # a timeout under load is a result, not the run's end
            ok, reason, text = False, type(exc).__name__, f"{mode} seed {seed}: {exc}"
        # A line per output as it ends: a run stopped early still says how far it got.
        print(json.dumps({"mode": mode, "seed": seed, "ok": ok, "finish": reason}), flush=True)
        return mode, ok, reason, text

    with ThreadPoolExecutor(args.concurrency) as pool:
        results = list(pool.map(one, cases))
    report: dict[str, Any] = {}
    for mode in args.modes:
        mine = [(ok, reason, text) for m, ok, reason, text in results if m == mode]
        report[mode] = {"total": len(mine), "ok": sum(ok for ok, _, _ in mine),
                        "finish_reasons": dict(Counter(r for _, r, _ in mine)),
                        "failures": [text[:300] for ok, _, text in mine if not ok][:5]}  # fmt: skip
    report["wall_s"] = round(time.perf_counter() - start, 1)
    return report


def start(command: str, flags: list[str], url: str, log_dir: Path) -> subprocess.Popen[bytes]:
    """``paternoster <command>`` on ``url`` in a process of its own, logging to ``log_dir``."""
    cmd = [sys.executable, "-m", "worker.cli", command, "--redis-url", url, "--prefix",
           "bench-structured", "--log-level", "warning", *flags]  # fmt: skip
    log = open(log_dir / f"{command}.log", "wb")  # the child keeps it open
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def wait_ready(base: str, log_dir: Path, timeout_s: float = 900) -> None:
    """Until the gateway answers and the worker has its model loaded (it heartbeats from then):
    a request sent before would spend the load's minutes of its client timeout queued (at load
    ~12 the first jobs of a --seeds 1 run waited 348 s for the worker, and three timed out)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            status = httpx.get(f"{base}/v1/status")
            if status.status_code == 200 and status.json()["workers"]:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"gateway or worker did not start: see {log_dir}"
        time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--model", default=None, help="default: the bundled SmolLM2")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--modes", nargs="+", choices=tuple(MODES), default=list(MODES), help="default: all"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="openai-structured-"))
    redis_server = RedisServer(work)
    redis_server.start()
    port, procs = free_port(), []
    try:
        model = ["--model", args.model] if args.model else []
        procs.append(start("worker", ["--max-num-seqs", str(args.concurrency), *model],
                           redis_server.url, work))  # fmt: skip
        procs.append(start("gateway", ["--port", str(port)], redis_server.url, work))
        base = f"http://127.0.0.1:{port}"
        wait_ready(base, work)
        client = openai.OpenAI(api_key="x", base_url=f"{base}/v1", max_retries=0, timeout=600)
        report = {
            "args": vars(args) | {"out": str(args.out)},
            "schemas": [m.__name__ for m in SCHEMAS],
            **run_all(client, args),
        }
        write_report(report, args.out)
        print(json.dumps(report, indent=2))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
        redis_server.stop()


if __name__ == "__main__":
    main()
