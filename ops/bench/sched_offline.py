"""An offline run through the scheduler alone: what TPOT targets cost a run of one band.

engine.py's seeded 64-request mix (``engine_workload.make_workload``: prompts 32-2,048 tokens,
outputs 16-640), every request at one priority and added at once as ``LLMEngine.generate`` and
run_peers.py's engine path do, is scheduled to completion with nothing computed: each step
takes the step-cost prior's time (``step_cost.PRIOR``, SmolLM2-135M on the 2-core CPU) on a
fake clock, which the scheduler's own cost model and targets read. Reports steps and
simulated seconds per ``--tpot-target-ms`` setting: a target that binds spreads prefill over
more steps and pays the step's base more often.

    .venv/bin/python -m ops.bench.sched_offline --targets default interactive=150,default=400 off
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from ops.bench.engine_workload import make_workload
from worker.engine.block_manager import BlockManager
from worker.engine.config import DEFAULT_TPOT_TARGET_MS, SchedulerConfig
from worker.engine.sampling_params import SamplingParams
from worker.engine.scheduler import Scheduler
from worker.engine.sequence import FinishReason, Sequence
from worker.engine.step_cost import PRIOR, StepCost, StepFeatures
from worker.engine.step_targets import format_tpot_targets, parse_tpot_targets

BLOCK_SIZE = 16


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def run(
    targets: str, n: int, seed: int, priority: int, max_seqs: int, scale: float
) -> dict[str, object]:
    """Steps and simulated seconds of the mix under ``targets`` (``--tpot-target-ms``) on a
    machine ``scale`` times slower than the prior in every term."""
    machine = StepCost(*(scale * term for term in dataclasses.astuple(PRIOR)))
    workload = make_workload(n, seed, 1.0, list(range(10, 30_000)))
    config = SchedulerConfig(max_num_seqs=max_seqs, tpot_target_ms=parse_tpot_targets(targets))
    need = sum(len(r.prompt_ids) + r.output_len for r in workload) // BLOCK_SIZE + 2 * n
    clock = FakeClock()
    scheduler = Scheduler(config, BlockManager(need, BLOCK_SIZE), clock=clock)
    seqs = {}
    for i, r in enumerate(workload):
        seq = Sequence(
            r.request_id,
            list(r.prompt_ids),
            SamplingParams(max_tokens=r.output_len),
            i,
            priority=priority,
        )
        seqs[seq.seq_id] = seq
        scheduler.add(seq)
    steps = 0
    while scheduler.num_unfinished:
        out = scheduler.schedule()
        scheduler.update(out)
        clock.now_s += machine.predict_s(StepFeatures.of(out.scheduled))
        steps += 1
        for item in out.scheduled:
            seq = seqs[item.seq_id]
            if item.samples:
                seq.append_token(7)
                if seq.num_output_tokens >= seq.params.max_tokens:
                    scheduler.finish(seq, FinishReason.LENGTH)
    return {"steps": steps, "simulated_s": round(clock.now_s, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", default=["default", "off"])
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--priority", type=int, default=0, help="every request's (0: default)")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    # ~6.7: the loaded 2-core EPYC of tpot_burst.py's runs, ~5 ms a prefill token against 0.75.
    parser.add_argument("--machine-scale", type=float, default=1.0, help="x the prior's time")
    args = parser.parse_args()
    for targets in args.targets:
        text = format_tpot_targets(DEFAULT_TPOT_TARGET_MS) if targets == "default" else targets
        result = run(text, args.n, args.seed, args.priority, args.max_num_seqs, args.machine_scale)
        print(json.dumps({**result, **vars(args), "targets": text}))


if __name__ == "__main__":
    main()
