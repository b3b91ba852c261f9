"""A fake runner for scheduler tests: computes nothing, samples a fixed token.

It does keep a fake KV pool: each slot holds the (salt, prefix) whose last token was written
there, so every step can check that what a sequence attends to is its own prefix (a wrong prefix
hit, a write into a shared block or an evicted block still in use all show up as a mismatch).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from worker.engine.block_manager import BlockManager
from worker.engine.config import SchedulerConfig
from worker.engine.sampling_params import SamplingParams
from worker.engine.scheduler import Scheduler
from worker.engine.scheduler_output import SchedulerOutput
from worker.engine.sequence import FinishReason, Sequence

SAMPLED_TOKEN = 7

SlotContent = tuple[str | None, tuple[int, ...]]


class Harness:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        max_seqs: int,
        max_tokens: int,
        *,
        prefix_caching: bool = False,
        **policy: Any,
    ) -> None:
        self.config = SchedulerConfig(
            max_num_seqs=max_seqs, max_num_batched_tokens=max_tokens, **policy
        )
        self.bm = BlockManager(num_blocks, block_size, enable_prefix_caching=prefix_caching)
        self.scheduler = Scheduler(self.config, self.bm)
        self.seqs: dict[int, Sequence] = {}  # unfinished, by seq_id
        self.finished: dict[int, Sequence] = {}
        self.kv: dict[int, SlotContent] = {}  # slot -> what was written there
        self.count = 0

    def add(
        self, prompt_len: int, max_tokens: int, *, priority: int = 0, tenant: str = "default"
    ) -> Sequence:
        prompt = list(range(1, prompt_len + 1))
        return self.add_tokens(prompt, max_tokens, priority=priority, tenant=tenant)[0]

    def add_tokens(
        self,
        prompt: Seq[int],
        max_tokens: int,
        *,
        salt: str | None = None,
        n: int = 1,
        priority: int = 0,
        tenant: str = "default",
    ) -> list[Sequence]:
        """A request of ``n`` choices; its sequences, choice 0 first."""
        rid = f"r{self.count}"
        params = SamplingParams(max_tokens=max_tokens)
        seqs = [
            Sequence(
                rid,
                list(prompt),
                params,
                self.count,
                index=i,
                cache_salt=salt,
                priority=priority,
                tenant=tenant,
            )
            for i in range(n)
        ]
        self.count += 1
        for seq in seqs:
            self.seqs[seq.seq_id] = seq
        self.scheduler.add(seqs[0], seqs[1:])
        return seqs

    def seq(self, seq_id: int) -> Sequence:
        """A sequence by id, finished or not."""
        return self.seqs.get(seq_id) or self.finished[seq_id]

    def abort(self, rid: str) -> None:
        """Abort every unfinished choice of request ``rid``."""
        for seq in [s for s in self.seqs.values() if s.request_id == rid]:
            self.scheduler.finish(seq, FinishReason.ABORT)
            self.finished[seq.seq_id] = self.seqs.pop(seq.seq_id)

    def step(self) -> SchedulerOutput:
        out = self.scheduler.schedule()
        self.check_output(out)
        self.run(out)
        self.scheduler.update(out)
        for item in out.scheduled:
            if not item.samples:
                continue
            seq = self.seqs[item.seq_id]
            seq.append_token(SAMPLED_TOKEN)
            if seq.num_output_tokens >= seq.params.max_tokens:
                self.scheduler.finish(seq, FinishReason.LENGTH)
                self.finished[seq.seq_id] = self.seqs.pop(seq.seq_id)
        self.bm.assert_invariants(self.seqs.values())
        return out

    def run(self, out: SchedulerOutput) -> None:
        """What the runner would do: read the context, then write each scheduled token's K/V."""
        bs = self.bm.block_size
        for item in out.scheduled:
            seq = self.seqs[item.seq_id]
            start = item.num_computed_tokens
            for pos in range(start):  # attention reads these: they must be this prefix's
                slot = item.block_ids[pos // bs] * bs + pos % bs
                assert self.kv.get(slot) == self.content(seq, pos), f"{seq}: bad K/V at {pos}"
            for pos in range(start, start + item.num_scheduled_tokens):
                block_id = item.block_ids[pos // bs]
                assert self.bm.ref_counts[block_id] == 1, f"{seq} writes shared block {block_id}"
                self.kv[block_id * bs + pos % bs] = self.content(seq, pos)

    @staticmethod
    def content(seq: Sequence, pos: int) -> SlotContent:
        return seq.cache_salt, tuple(seq.token_ids[: pos + 1])

    def check_output(self, out: SchedulerOutput) -> None:
        assert out.num_batched_tokens <= self.config.max_num_batched_tokens
        assert out.num_batched_tokens == sum(s.num_scheduled_tokens for s in out.scheduled)
        assert len(out.scheduled) <= self.config.max_num_seqs
        assert len({s.seq_id for s in out.scheduled}) == len(out.scheduled)
        seen_decode_end = False
        for item in out.scheduled:
            seq = self.seqs[item.seq_id]
            assert item.request_id == seq.request_id
            assert item.num_scheduled_tokens >= 1  # the runner has nothing to run otherwise
            start = item.num_computed_tokens
            assert seq.token_ids[start : start + item.num_scheduled_tokens] == list(item.token_ids)
            assert item.block_ids == seq.block_ids
            last_pos = start + item.num_scheduled_tokens - 1
            assert last_pos // self.bm.block_size < len(item.block_ids)
            assert item.samples == (start + item.num_scheduled_tokens == seq.num_tokens)
            # decodes first, then prefill chunks
            if not item.is_decode:
                seen_decode_end = True
            assert not (seen_decode_end and item.is_decode)
        self.bm.assert_invariants(self.seqs.values())


class HarnessMachine(RuleBasedStateMachine):
    """Step / abort rules and the block invariants shared by the scheduler state machines;
    subclasses set ``self.h`` and add their own ``add`` rule and ``check_end``."""

    h: Harness

    @rule()
    def step(self) -> None:
        self.h.step()

    @precondition(lambda self: bool(self.h.seqs))
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted({s.request_id for s in self.h.seqs.values()})))
        self.h.abort(rid)

    @invariant()
    def blocks_consistent(self) -> None:
        self.h.bm.assert_invariants(self.h.seqs.values())
        for seq in self.h.finished.values():
            assert seq.block_ids == ()

    def teardown(self) -> None:
        # Everything left finishes: no request is starved by preemption cycles.
        for _ in range(2000):
            if not self.h.seqs:
                break
            self.h.step()
        assert not self.h.seqs and self.h.scheduler.num_unfinished == 0
        assert self.h.bm.num_free_blocks == self.h.bm.num_blocks
        self.check_end()
        for seq in self.h.finished.values():
            if seq.finish_reason is not None and seq.finish_reason.value == "length":
                assert seq.output_token_ids == [SAMPLED_TOKEN] * seq.params.max_tokens

    def check_end(self) -> None:
        """More checks once every request has finished."""
