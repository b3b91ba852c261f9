"""`LLMEngine.generate`: offline, every prompt through one continuous batch, whole completions out.

The convenience path of the CLI's ``generate``, tests and benchmarks; the job worker calls
``step`` itself and streams each step's outputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING

from worker.engine.outputs import Completion, RequestOutput
from worker.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from worker.engine.llm_engine import LLMEngine, Messages


def generate(
    engine: LLMEngine,
    prompts: Iterable[str | Messages],
    params: SamplingParams | Seq[SamplingParams] | None = None,
) -> list[Completion]:
    """Run all prompts through one continuous batch; one completion per prompt, in input order
    (with ``n > 1``, its ``choices`` hold all n)."""
    prompts = list(prompts)
    if params is None or isinstance(params, SamplingParams):
        per_prompt = [params or SamplingParams()] * len(prompts)
    else:
        per_prompt = list(params)
    ids = [f"generate-{next(engine._arrivals)}" for _ in prompts]
    for rid, prompt, p in zip(ids, prompts, per_prompt, strict=True):
        engine.add_prompt(rid, prompt, p)
    collected: dict[tuple[str, int], list[RequestOutput]] = {
        (rid, i): [] for rid, p in zip(ids, per_prompt, strict=True) for i in range(p.n)
    }
    done: dict[tuple[str, int], Completion] = {}
    while len(done) < len(collected):
        for out in engine.step():
            key = (out.request_id, out.index)
            if key not in collected:
                continue
            collected[key].append(out)
            if out.finished:
                done[key] = Completion.of(collected[key])
    results = []
    for rid, p in zip(ids, per_prompt, strict=True):
        choices = tuple(done[(rid, i)] for i in range(p.n))
        results.append(choices[0] if p.n == 1 else dataclasses.replace(choices[0], choices=choices))
    return results
