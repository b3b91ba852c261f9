"""The overlapped loop schedules and launches step N+1 before step N's ids are back.

A decode row of N+1 then holds a `PLACEHOLDER`, written on the device from N's sampled ids
(`ModelRunner._read_placeholders`). These tests count those rows, so they fail if the loop
stops scheduling ahead, and check that doing so changes no token, text, finish or count.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.engine.test_overlap import (
    MODES,
    PROMPTS,
    free_when_idle,
    greedy,
    make,
    run_mix,
    the_plan,
    varied_model_dir,  # noqa: F401 (a fixture)
)
from worker.engine.llm_engine import LLMEngine
from worker.engine.outputs import RequestOutput
from worker.engine.scheduler_output import ScheduledSequence
from worker.engine.sequence import PLACEHOLDER


def watch(engine: LLMEngine) -> tuple[list[int], dict[tuple[str, int], int]]:
    """Rows read from the device per step, and each choice's last reported output count."""
    fed: list[int] = []
    counts: dict[tuple[str, int], int] = {}
    runner = engine.runner
    read: Callable[..., None] = runner._read_placeholders

    def counting_read(decodes: Sequence[ScheduledSequence], ids: Any) -> None:
        fed.append(sum(1 for s in decodes if s.token_ids[0] == PLACEHOLDER))
        read(decodes, ids)

    step = engine.step

    def counting_step() -> list[RequestOutput]:
        outs = step()
        for out in outs:
            counts[(out.request_id, out.index)] = out.num_output_tokens
        return outs

    runner._read_placeholders = counting_read  # type: ignore[method-assign]
    engine.step = counting_step  # type: ignore[method-assign]
    return fed, counts


def run(
    model_dir: Path, mode: str, plan: Any, num_blocks: int = 24, pad: bool = False
) -> tuple[Any, ...]:
    engine = make(model_dir, mode, num_blocks=num_blocks)  # 96 tokens: preempts
    if pad:  # the static buffers and padded decode batches of the graph path, on the CPU
        config = dataclasses.replace(engine.config, pad_decode_batches=True)
        engine = LLMEngine(config)
        assert engine.runner.inputs is not None and engine.runner.pad_sizes
    fed, counts = watch(engine)
    result = run_mix(engine, plan, {"cancel": 4})
    free_when_idle(engine)
    return result, counts, sum(fed), engine.scheduler.num_preemptions


@pytest.mark.parametrize(("mode", "pad"), [("async", False), ("thread", False), ("async", True)])
def test_steps_launched_ahead_give_the_plain_loops_outputs(
    varied_model_dir: Path,  # noqa: F811
    mode: str,
    pad: bool,
) -> None:
    reference = run_mix(
        make(varied_model_dir, "off"),
        [(f"p{i}", p, greedy(20)) for i, p in enumerate(PROMPTS)],
        {},
    )
    # test_overlap's mix (stop id, stop string, a cancel, n=2 seeded, sampled, preemption)
    # without its logprobs row, which would make every step wait for the ids.
    plan = [
        (rid, p, greedy(18) if rid == "long" else params) for rid, p, params in the_plan(reference)
    ]
    plain, plain_counts, plain_fed, _ = run(varied_model_dir, "off", plan)
    ahead, counts, fed, preemptions = run(varied_model_dir, mode, plan, pad=pad)
    assert plain_fed == 0  # the plain loop never holds a token's place
    assert fed > 20, fed  # most decode rows read their token on the device
    assert preemptions > 0
    assert plain[("stop-id", 0)][2] == "stop" and plain[("stop-str", 0)][2] == "stop_string"
    assert ahead == plain
    assert counts == plain_counts  # a token computed in flight and dropped is never counted


@pytest.mark.parametrize("mode", MODES)
def test_a_step_whose_rows_need_their_ids_is_not_scheduled_ahead(
    varied_model_dir: Path,  # noqa: F811
    mode: str,
) -> None:
    plan = [("lp", PROMPTS[1], greedy(10, logprobs=1)), ("p", PROMPTS[2], greedy(10))]
    plain, plain_counts, _, _ = run(varied_model_dir, "off", plan, num_blocks=512)
    ahead, counts, fed, _ = run(varied_model_dir, mode, plan, num_blocks=512)
    assert fed == 0  # every step has a logprobs row: each waits for the last one's ids
    assert ahead == plain and counts == plain_counts


def test_a_step_whose_rows_follow_the_launched_ones_row_for_row_copies_their_ids() -> None:
    import types

    import torch

    from worker.engine.model_runner import ModelRunner, SampledFeed

    def read(order: tuple[int, ...], tokens: dict[int, int], rows_called: bool) -> list[int]:
        feed = SampledFeed((7, 3, 9), torch.tensor([11, 12, 13]))
        called: list[Sequence[int]] = []
        general = feed.rows

        def rows(seq_ids: Sequence[int]) -> list[int]:
            called.append(seq_ids)
            return general(seq_ids)

        feed.rows = rows  # type: ignore[method-assign]
        runner = types.SimpleNamespace(feed=feed, device=torch.device("cpu"))
        decodes = [
            ScheduledSequence("r", (tokens.get(s, PLACEHOLDER),), 5, (1,), True, s) for s in order
        ]
        ids = torch.tensor([tokens.get(s, -1) for s in order])
        ModelRunner._read_placeholders(runner, decodes, ids)  # type: ignore[arg-type]
        assert bool(called) == rows_called
        return ids.tolist()

    assert read((7, 3, 9), {}, rows_called=False) == [11, 12, 13]  # one copy
    assert read((3, 7, 9), {}, rows_called=True) == [12, 11, 13]  # reordered: gathered
    assert read((7, 3, 9), {3: 5}, rows_called=True) == [11, 5, 13]  # a token on the host
    assert read((7, 3), {}, rows_called=True) == [11, 12]  # a row left
