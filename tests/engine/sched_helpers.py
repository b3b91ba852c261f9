"""A fake runner for scheduler tests: computes nothing, samples a fixed token."""

from __future__ import annotations

from worker.engine.block_manager import BlockManager
from worker.engine.config import SchedulerConfig
from worker.engine.sampling_params import SamplingParams
from worker.engine.scheduler import Scheduler
from worker.engine.scheduler_output import SchedulerOutput
from worker.engine.sequence import FinishReason, Sequence

SAMPLED_TOKEN = 7


class Harness:
    def __init__(self, num_blocks: int, block_size: int, max_seqs: int, max_tokens: int) -> None:
        self.config = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=max_tokens)
        self.bm = BlockManager(num_blocks, block_size)
        self.scheduler = Scheduler(self.config, self.bm)
        self.seqs: dict[str, Sequence] = {}
        self.finished: dict[str, Sequence] = {}
        self.count = 0

    def add(self, prompt_len: int, max_tokens: int) -> Sequence:
        rid = f"r{self.count}"
        seq = Sequence(
            rid, list(range(1, prompt_len + 1)), SamplingParams(max_tokens=max_tokens), self.count
        )
        self.count += 1
        self.seqs[rid] = seq
        self.scheduler.add(seq)
        return seq

    def abort(self, rid: str) -> None:
        seq = self.seqs.pop(rid)
        self.scheduler.finish(seq, FinishReason.ABORT)
        self.finished[rid] = seq

    def step(self) -> SchedulerOutput:
        out = self.scheduler.schedule()
        self.check_output(out)
        self.scheduler.update(out)
        for item in out.scheduled:
            if not item.samples:
                continue
            seq = self.seqs[item.request_id]
            seq.append_token(SAMPLED_TOKEN)
            if seq.num_output_tokens >= seq.params.max_tokens:
                self.scheduler.finish(seq, FinishReason.LENGTH)
                self.finished[seq.request_id] = self.seqs.pop(seq.request_id)
        self.bm.assert_invariants(self.seqs.values())
        return out

    def check_output(self, out: SchedulerOutput) -> None:
        assert out.num_batched_tokens <= self.config.max_num_batched_tokens
        assert out.num_batched_tokens == sum(s.num_scheduled_tokens for s in out.scheduled)
        assert len(out.scheduled) <= self.config.max_num_seqs
        assert len({s.request_id for s in out.scheduled}) == len(out.scheduled)
        seen_decode_end = False
        for item in out.scheduled:
            seq = self.seqs[item.request_id]
            start = item.num_computed_tokens
            assert seq.token_ids[start : start + item.num_scheduled_tokens] == list(item.token_ids)
            assert item.block_ids == tuple(seq.block_ids)
            last_pos = start + item.num_scheduled_tokens - 1
            assert last_pos // self.bm.block_size < len(item.block_ids)
            assert item.samples == (start + item.num_scheduled_tokens == seq.num_tokens)
            # decodes first, then prefill chunks
            if not item.is_decode:
                seen_decode_end = True
            assert not (seen_decode_end and item.is_decode)
        self.bm.assert_invariants(self.seqs.values())
