"""How much reserved KV memory holds tokens, on one load run's trace: paged blocks against a
contiguous allocator that reserves each sequence's maximum length at admission.

    python ops/bench/kv_memory.py ops/bench/results/load/report.json [--block-size 16]

The vLLM paper (Kwon et al., 2023, fig. 2) measured 20-38% of KV memory holding tokens in
systems that reserve contiguous max-length buffers, against under 4% waste with paged blocks.
This replays the same comparison on our jobs' own token timelines (``load_client.py``):

- a job holds ``prompt + k`` tokens once its k-th output token has arrived (the slot of the
  token just sampled is written at the next step, and the paged engine allocates it then), from
  its first token until its terminal event;
- ``paged``: ``ceil(held / block_size)`` blocks, so only the last block is partly empty;
- ``contiguous_max_tokens``: ``prompt + max_tokens`` reserved for the whole life (what a server
  that knows each request's cap does); lengths are forced here, so this wastes only the not yet
  generated tail, and the whole tail of jobs cancelled early;
- ``contiguous_context``: the model's context length per job (what a server that does not know
  the cap reserves; the paper's worst case).

Reported per allocator: ``useful_fraction`` = time integral of held tokens / time integral of
reserved slots, and the peak reserved slots (the KV a pool needs to run this trace unchanged).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ALLOCATORS = ("paged", "contiguous_max_tokens", "contiguous_context")


@dataclass(frozen=True)
class JobTrace:
    prompt_tokens: int
    max_tokens: int
    token_times_s: tuple[float, ...]  # arrival of each output token, in order
    end_s: float  # the terminal event: every slot is freed

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> JobTrace | None:
        """From a ``load_client.JobRecord`` as JSON; None for a job that produced no token."""
        if not rec["token_times_s"] or rec["end_s"] is None:
            return None
        times = tuple(rec["token_times_s"])
        return cls(rec["prompt_tokens"], rec["max_tokens"], times, max(rec["end_s"], times[-1]))


def _levels(
    trace: JobTrace, block_size: int, context_len: int
) -> Iterable[tuple[float, float, tuple[int, ...]]]:
    """(start, end, (held, paged, contiguous max, contiguous context)) per constant stretch."""
    times = trace.token_times_s
    reserve_max = trace.prompt_tokens + trace.max_tokens
    for k, start in enumerate(times, start=1):
        end = times[k] if k < len(times) else trace.end_s
        held = trace.prompt_tokens + k
        paged = math.ceil(held / block_size) * block_size
        yield start, end, (held, paged, reserve_max, max(context_len, reserve_max))


def kv_usage(
    traces: Sequence[JobTrace], *, block_size: int = 16, context_len: int = 8192
) -> dict[str, Any]:
    """Useful fraction and peak reserved slots of each allocator over the traces' timeline."""
    events: list[tuple[float, tuple[int, ...]]] = []  # (time, change of each level)
    for trace in traces:
        previous: tuple[int, ...] = (0, 0, 0, 0)
        for start, _end, now in _levels(trace, block_size, context_len):
            events.append((start, tuple(a - b for a, b in zip(now, previous, strict=True))))
            previous = now
        events.append((trace.end_s, tuple(-x for x in previous)))
    events.sort(key=lambda e: (e[0], e[1][0]))  # at one instant, frees before growth
    integral = [0.0] * 4
    peak = [0] * 4
    level = [0] * 4
    last_t = events[0][0] if events else 0.0
    for t, delta in events:
        for i in range(4):
            integral[i] += level[i] * (t - last_t)
        last_t = t
        level = [a + b for a, b in zip(level, delta, strict=True)]
        peak = [max(p, x) for p, x in zip(peak, level, strict=True)]
    held = integral[0]
    out: dict[str, Any] = {
        "block_size": block_size,
        "context_len": context_len,
        "jobs": len(traces),
        "held_token_seconds": held,
        "peak_held_tokens": peak[0],
    }
    for i, name in enumerate(ALLOCATORS, start=1):
        useful = held / integral[i] if integral[i] > 0 else None
        out[name] = {
            "reserved_token_seconds": integral[i],
            "useful_fraction": useful,
            "waste_fraction": None if useful is None else 1 - useful,
            "peak_reserved_tokens": peak[i],
        }
    return out


def from_run(
    records: Sequence[dict[str, Any]], *, block_size: int = 16, context_len: int = 8192
) -> dict[str, Any]:
    """``kv_usage`` of one load run's job records (jobs without a token are left out)."""
    traces = [t for t in map(JobTrace.from_record, records) if t is not None]
    return kv_usage(traces, block_size=block_size, context_len=context_len)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def describe(usage: dict[str, Any]) -> str:
    lines = [f"{usage['jobs']} jobs, block {usage['block_size']}, context {usage['context_len']}"]
    for name in ALLOCATORS:
        a = usage[name]
        lines.append(
            f"  {name:<22} useful {_pct(a['useful_fraction']):>6}  waste "
            f"{_pct(a['waste_fraction']):>6}  peak {a['peak_reserved_tokens']} slots"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("report", type=Path, help="a load.py report JSON")
    p.add_argument("--block-size", type=int, default=None, help="default: the report's")
    p.add_argument("--context-len", type=int, default=None, help="default: the report's")
    args = p.parse_args(argv)
    report = json.loads(args.report.read_text())
    for run in report["runs"]:
        saved = run["kv_memory"]
        usage = from_run(
            run["jobs"],
            block_size=args.block_size or saved["block_size"],
            context_len=args.context_len or saved["context_len"],
        )
        print(f"rate {run['rate_per_s']} jobs/s: {describe(usage)}")


if __name__ == "__main__":
    main()
