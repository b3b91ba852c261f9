"""Priority preemption on the tiny real model: preempted requests resume with identical output."""

from __future__ import annotations

from pathlib import Path

from tests.engine.test_engine import PROMPTS, make_engine
from worker.engine.outputs import RequestOutput
from worker.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def test_preempted_requests_finish_exactly_as_if_never_preempted(tiny_model_dir: Path) -> None:
    expected = make_engine(tiny_model_dir).generate(PROMPTS, GREEDY)
    engine = make_engine(tiny_model_dir, seqs=3)
    streams: dict[str, list[RequestOutput]] = {}
    for i, prompt in enumerate(PROMPTS[:3]):
        engine.add_prompt(f"batch-{i}", prompt, GREEDY, priority=10)
    for _ in range(4):
        for out in engine.step():
            streams.setdefault(out.request_id, []).append(out)
    for i, prompt in enumerate(PROMPTS[3:], start=3):
        engine.add_prompt(f"urgent-{i}", prompt, GREEDY, priority=-10)
    preempted: set[str] = set()
    first_urgent_token_step = None
    step = 0
    while engine.has_unfinished():
        step += 1
        outs = engine.step()
        preempted.update(engine.last_preempted)
        for out in outs:
            streams.setdefault(out.request_id, []).append(out)
            if out.request_id.startswith("urgent") and first_urgent_token_step is None:
                first_urgent_token_step = step
    assert first_urgent_token_step == 1  # the step after they arrived
    assert preempted == {"batch-0", "batch-1", "batch-2"}
    assert engine.scheduler.preemptions_by_reason["priority"] == 3
    for i, rid in enumerate(["batch-0", "batch-1", "batch-2", "urgent-3", "urgent-4", "urgent-5"]):
        tokens = [t for o in streams[rid] for t in o.new_token_ids]
        assert tokens == list(expected[i].token_ids), rid  # no token repeated or lost
        assert "".join(o.text_delta for o in streams[rid]) == expected[i].text
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
