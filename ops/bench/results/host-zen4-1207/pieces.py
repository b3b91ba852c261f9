"""Each piece this pass changed, timed old against new on a live engine's 256 decode rows.

The old forms are copied here as they were at `11d6d83`; each is timed with `timeit` in the
thread's CPU time (best of 3 repeats of 2,000 calls), on the rows of an engine decoding 256
requests on the stubbed device (`host-1207/inproc_ab.build`, greedy). Run from the repository
root:
    python ops/bench/results/host-zen4-1207/pieces.py /tmp/bw
(/tmp/bw: the earlier tree's `worker` package copied as `worker_before`, as `inproc_ab.py` says.)
"""

from __future__ import annotations

import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from itertools import chain
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
sys.path.insert(0, str(ROOT))
import kernels.quant_reference  # noqa: E402, F401  (the package, before ops/bench's kernels.py)
import torch  # noqa: E402

sys.path[1:1] = [str(HERE.parent / "host-1207"), str(ROOT / "ops" / "bench")]
import host_overhead as ho  # noqa: E402
import inproc_ab  # noqa: E402

from worker.engine.batch_cap import BATCH_FLOOR, is_batch  # noqa: E402
from worker.engine.first_token import in_lane  # noqa: E402
from worker.engine.request_state import sampling_rows  # noqa: E402
from worker.engine.sampling_rows import SamplingRequest, SamplingRows  # noqa: E402
from worker.engine.sequence import PLACEHOLDER  # noqa: E402

_tuple_new = tuple.__new__
_P, _T, _F = attrgetter("priority"), attrgetter("token_ids"), attrgetter("samples")


def us(fn: Callable[[], Any]) -> float:
    fn()
    return 1e6 * min(timeit.repeat(fn, number=2000, repeat=3, timer=time.thread_time)) / 2000


def old_sampling_rows(states: list[Any]) -> SamplingRows:
    rows = SamplingRows()
    add, flags = rows.append, 0
    for state in states:
        add(_tuple_new(SamplingRequest, (state.params, len(state._token_ids) - state._num_prompt, state.seq)))
        flags |= state.flags
    rows.flags = flags
    return rows


def old_lane_split(running: list[Any]) -> Any:
    kept, held, kept_decodes = [], [], 0
    for s in running:
        n = len(s.token_ids) - s.num_computed_tokens
        if n > 1 or in_lane(s):
            kept.append(s)
            kept_decodes += n == 1
        else:
            held.append(s)
    return kept, held


def old_decodes(decodes: list[Any], by_priority: dict[int, float]) -> tuple[int, int]:
    num = context = 0
    for seq in decodes:
        num += 1
        context += seq.num_tokens
        if seq.priority not in by_priority:
            by_priority[seq.priority] = 1.0
    return num, context


def new_decodes(decodes: list[Any], by_priority: dict[int, float]) -> tuple[int, int]:
    for priority in set(map(_P, decodes)):
        if priority not in by_priority:
            by_priority[priority] = 1.0
    return len(decodes), sum(map(len, map(_T, decodes)))


def main() -> None:
    if len(sys.argv) > 1:  # the earlier tree's copy (inproc_ab.py's --before-root)
        sys.path.insert(0, sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        tok = ho.resolve_model_dir(None)
        model_dir = ho.write_random_model("host-overhead", tok, Path(tmp), torch.float32, "cpu")
        ho.in_worker_thread(lambda: measure(model_dir))


def measure(model_dir: Path) -> None:
    engine = inproc_ab.build("worker", model_dir, 256, 400, 0, "off", temperature=0.0)
    running = engine.scheduler.running
    states = [engine._states[s.seq_id] for s in running]
    items = engine.runner.batch_order(engine.scheduler.schedule())
    tokens = [it.token_ids for it in items]
    a64 = np.zeros(4096, np.int64)
    first = itemgetter(0)
    pairs = {
        "sampling_rows, greedy": (lambda: old_sampling_rows(states), lambda: sampling_rows(states)),
        "lane split, no lane row": (
            lambda: old_lane_split(running),
            lambda: min(map(_P, running), default=0) >= 0,
        ),
        "batch rows test": (
            lambda: any(is_batch(s) for s in running),
            lambda: max(map(_P, running), default=0) >= BATCH_FLOOR,
        ),
        "allowance's decode pass": (lambda: old_decodes(running, {}), lambda: new_decodes(running, {})),
        "decode ids staged": (
            lambda: a64.__setitem__(slice(0, 256), list(chain.from_iterable(tokens))),
            lambda: a64.__setitem__(slice(0, 256), np.fromiter(map(first, tokens), np.int64, 256)),
        ),
        "rows that sample (not kept)": (
            lambda: [s for s in items if s.samples],
            lambda: list(__import__("itertools").compress(items, map(_F, items))),
        ),
        "placeholder search (not kept)": (
            lambda: [j for j, s in enumerate(items) if s.token_ids[0] == PLACEHOLDER],
            lambda: PLACEHOLDER in list(map(first, map(_T, items))),
        ),
    }
    for name, (old, new) in pairs.items():
        print(f"{name:28s} old {us(old):7.1f} us   new {us(new):7.1f} us")
    print(f"{'claim, 256 steady decodes':28s} old {claim_us('worker_before', items):7.1f} us   "
          f"new {claim_us('worker', items):7.1f} us")


def claim_us(pkg: str, items: list[Any], steps: int = 2000) -> float:
    """`BlockTables.claim` of ``pkg`` (``worker_before``: a copy of the earlier tree, on
    ``--before-root``'s path) over ``steps`` consecutive decode steps of ``items``' rows: each
    step one token further, their tables unchanged (the fast path of 15 steps in 16)."""
    tables_mod = __import__(f"{pkg}.engine.block_tables", fromlist=["BlockTables"])
    runs = [[it._replace(num_computed_tokens=it.num_computed_tokens + k) for it in items]
            for k in range(steps)]
    best = float("inf")
    for _ in range(3):
        tables = tables_mod.BlockTables(len(items), 64)
        start = time.thread_time()
        for step_items in runs:
            tables.claim(step_items)
        best = min(best, time.thread_time() - start)
    return 1e6 * best / steps


if __name__ == "__main__":
    main()
