"""The client side of ``job_plane.py``, run as its own process as a web app would be: submits
every job of a workload file at once, follows all their result streams with one XREAD loop, and
writes the tokens and timings as JSON. Imports only the producer library (no torch).

    python ops/bench/job_client.py WORKLOAD.json OUT.json --redis-url URL --prefix P
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import redis

from producer import Producer
from producer.protocol import TokenEvent, is_terminal, parse_event


def follow_all(client: redis.Redis, keys: dict[str, str], outputs: dict[str, list[int]]) -> int:
    """One reader for every job's stream, until each has its terminal event; returns reads."""
    last = dict.fromkeys(keys.values(), "0")
    by_key = {v: k for k, v in keys.items()}
    reads = 0
    while last:
        reply: Any = client.xread(last, count=1024, block=1000)
        reads += 1
        for key, entries in reply or []:
            for entry_id, fields in entries:
                event = parse_event(entry_id, fields)
                last[key] = entry_id
                if isinstance(event, TokenEvent):
                    outputs[by_key[key]].extend(event.token_ids)
                if is_terminal(event):
                    if event.type != "done":
                        raise RuntimeError(f"{by_key[key]} ended {event.type}: {event}")
                    del last[key]
    return reads


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("workload", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--redis-url", required=True)
    p.add_argument("--prefix", required=True)
    args = p.parse_args()
    jobs = json.loads(args.workload.read_text())
    producer = Producer(args.redis_url, prefix=args.prefix)
    reader = redis.Redis.from_url(args.redis_url, decode_responses=True)
    outputs: dict[str, list[int]] = {j["id"]: [] for j in jobs}
    keys = {j["id"]: producer.keys.events(j["id"]) for j in jobs}
    start = time.perf_counter()
    for j in jobs:
        producer.submit(
            job_id=j["id"],
            prompt_token_ids=j["prompt_ids"],
            max_tokens=j["output_len"],
            temperature=0.0,
            ignore_eos=True,
        )
    reads = follow_all(reader, keys, outputs)
    wall = time.perf_counter() - start
    args.out.write_text(json.dumps({"wall_s": wall, "reads": reads, "outputs": outputs}))


if __name__ == "__main__":
    main()
