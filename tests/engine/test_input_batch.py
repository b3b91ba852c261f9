"""The persistent batch builds exactly the tensors the per-token Python `prepare` built.

`reference_prepare` is the runner's input preparation before `InputBatch`, kept as the oracle.
Random schedules mix prefill chunks and decodes, sequences joining, leaving and coming back,
preemption (a sequence's num_computed_tokens back to 0 or to a cached prefix, with new blocks),
n > 1 choices sharing blocks with a copy-on-write last block, and steps redone one sequence at
a time (as `step_faults` does), with buffers too small at first so that they grow.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
import torch

from worker.attention import AttentionMetadata
from worker.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from worker.engine.model_runner import ModelRunner
from worker.engine.scheduler_output import ScheduledSequence, SchedulerOutput
from worker.models.config import ModelConfig, RopeConfig
from worker.models.llama import LlamaForCausalLM

BLOCK = 4


def reference_prepare(
    items: Sequence[ScheduledSequence], bs: int
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    seq_lens: list[int] = []
    query_start = [0]
    logits_rows: list[int] = []
    max_blocks = max(len(s.block_ids) for s in items)
    tables = []
    for item in items:
        start = item.num_computed_tokens
        end = start + item.num_scheduled_tokens
        input_ids.extend(item.token_ids)
        positions.extend(range(start, end))
        table = item.block_ids
        slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
        seq_lens.append(end)
        query_start.append(query_start[-1] + item.num_scheduled_tokens)
        if item.samples:
            logits_rows.append(query_start[-1] - 1)
        tables.append(list(table) + [0] * (max_blocks - len(table)))
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        block_tables=torch.tensor(tables, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        query_start_loc=torch.tensor(query_start, dtype=torch.int32),
        num_decodes=sum(1 for s in items if s.is_decode),
        max_seq_len=max(seq_lens),
        max_query_len=max(s.num_scheduled_tokens for s in items),
        seq_lens_host=tuple(seq_lens),
    )
    ids = torch.tensor(input_ids, dtype=torch.int64)
    pos = torch.tensor(positions, dtype=torch.int64)
    return ids, pos, meta, logits_rows


def tiny_config(max_position: int = 64, tie: bool = True) -> ModelConfig:
    """A one-layer model of hidden size 8 and 97 tokens."""
    return ModelConfig(
        model_type="llama",
        vocab_size=97,
        hidden_size=8,
        intermediate_size=16,
        num_layers=1,
        num_q_heads=2,
        num_kv_heads=1,
        head_size=4,
        rms_norm_eps=1e-5,
        max_position=max_position,
        tie_word_embeddings=tie,
        qkv_bias=False,
        o_bias=False,
        mlp_bias=False,
        qk_norm=False,
        rope=RopeConfig(),
        eos_token_ids=(2,),
        bos_token_id=1,
    )


def make_runner(pad: bool, max_position: int = 64, seqs: int = 3, budget: int = 8) -> ModelRunner:
    """A one-layer model; max_position, seqs and budget below what the schedules use, so every
    buffer and the block-table width have to grow."""
    mc = tiny_config(max_position)
    config = EngineConfig(
        attention_backend="torch",
        pad_decode_batches=pad,
        cache=CacheConfig(block_size=BLOCK, num_blocks=4096),
        scheduler=SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=budget),
    )
    return ModelRunner(config, LlamaForCausalLM(mc), torch.device("cpu"))


@dataclass
class FakeSeq:
    seq_id: int
    tokens: list[int]
    blocks: list[int] = field(default_factory=list)
    num_computed: int = 0


class Schedules:
    """Random steps over a changing set of sequences; block ids drawn fresh from a counter."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.seqs: list[FakeSeq] = []
        self.next_id = 100
        self.next_block = 0

    def block(self) -> int:
        self.next_block += 1
        return self.next_block % 4000

    def join(self) -> None:
        rng = self.rng
        if self.seqs and rng.random() < 0.3:  # another choice of a running request: fork
            parent = rng.choice(self.seqs)
            full = parent.num_computed // BLOCK
            child = FakeSeq(self.next_id, list(parent.tokens), parent.blocks[:full], full * BLOCK)
        else:
            child = FakeSeq(self.next_id, [rng.randrange(97) for _ in range(rng.randint(1, 40))])
        self.next_id += 1
        self.seqs.append(child)

    def churn(self) -> None:
        rng = self.rng
        while len(self.seqs) < 2 or rng.random() < 0.3:
            self.join()
        for seq in list(self.seqs):
            r = rng.random()
            if r < 0.05:
                self.seqs.remove(seq)  # finished or aborted
            elif r < 0.1:  # preempted: recompute from scratch, or from a cached prefix
                keep = rng.choice([0, min(len(seq.blocks), seq.num_computed // BLOCK)])
                seq.blocks = seq.blocks[:keep]
                seq.num_computed = keep * BLOCK

    def step(self) -> list[ScheduledSequence]:
        self.churn()
        rng = self.rng
        items = []
        for seq in self.seqs:
            if rng.random() < 0.1:
                continue  # not scheduled this step: leaves the batch, comes back later
            left = len(seq.tokens) - seq.num_computed
            n = 1 if left == 1 else rng.randint(1, min(left, 12))
            end = seq.num_computed + n
            while len(seq.blocks) * BLOCK < end:
                seq.blocks.append(self.block())
            if seq.num_computed % BLOCK and rng.random() < 0.05:  # copy-on-write of the tail
                seq.blocks[seq.num_computed // BLOCK] = self.block()
            items.append(
                ScheduledSequence(
                    request_id=f"r{seq.seq_id}",
                    token_ids=tuple(seq.tokens[seq.num_computed : end]),
                    num_computed_tokens=seq.num_computed,
                    block_ids=tuple(seq.blocks),
                    samples=end == len(seq.tokens),
                    seq_id=seq.seq_id,
                )
            )
        return items

    def commit(self, items: list[ScheduledSequence]) -> None:
        by_id = {s.seq_id: s for s in self.seqs}
        for item in items:
            seq = by_id[item.seq_id]
            seq.num_computed += item.num_scheduled_tokens
            if item.samples:
                seq.tokens.append(self.rng.randrange(97))


def ordered(items: list[ScheduledSequence]) -> list[ScheduledSequence]:
    items = sorted(items, key=lambda s: not s.is_decode)
    n = sum(s.num_scheduled_tokens for s in items)
    return ModelRunner.batch_order(SchedulerOutput(tuple(items), n, ()))


def assert_same(runner: ModelRunner, items: list[ScheduledSequence]) -> None:
    ids, pos, meta, rows = runner.prepare(items)
    want_ids, want_pos, want, want_rows = reference_prepare(items, BLOCK)
    for got_t, want_t in [
        (ids, want_ids),
        (pos, want_pos),
        (meta.slot_mapping, want.slot_mapping),
        (meta.block_tables, want.block_tables),
        (meta.seq_lens, want.seq_lens),
        (meta.query_start_loc, want.query_start_loc),
    ]:
        assert got_t.dtype == want_t.dtype and torch.equal(got_t, want_t)
    assert rows.dtype == torch.int64 and rows.tolist() == want_rows
    got_host = (meta.num_decodes, meta.max_seq_len, meta.max_query_len, meta.seq_lens_host)
    assert got_host == (want.num_decodes, want.max_seq_len, want.max_query_len, want.seq_lens_host)
    assert meta.num_padding == 0


@pytest.mark.parametrize("mode", ["host", "static", "overflow"])
@pytest.mark.parametrize("seed", range(4))
def test_random_schedules_build_the_reference_tensors(mode: str, seed: int) -> None:
    """Host path (CPU default), static path (device mirror of the tables, on CPU), and the
    static path with table changes too many to stage (sent the slow way)."""
    runner = make_runner(pad=mode != "host")
    sched = Schedules(seed)
    for step in range(120):
        items = ordered(sched.step())
        if not items:
            continue
        if mode == "overflow":
            runner.batch.max_diffs = 3
        assert_same(runner, items)
        if step % 17 == 5:  # a failed step redone one sequence at a time, then in full
            for item in items:
                assert_same(runner, [item])
            assert_same(runner, items)
        sched.commit(items)
    assert runner.batch.generation > 1  # rows, staging and width all had to grow


def test_a_seq_id_repeated_in_one_step_gets_its_own_row() -> None:
    """Callers that leave seq_id at its default (tests, probes) still get every table."""
    runner = make_runner(pad=False)
    items = [
        ScheduledSequence("a", (5,), 6, (3, 9), True),
        ScheduledSequence("b", (1, 2, 3), 0, (7,), True),
        ScheduledSequence("c", (4,), 0, (11,), True),
    ]
    for _ in range(2):
        assert_same(runner, ordered(items))


def test_padded_decode_step_has_inert_padding_rows() -> None:
    runner = make_runner(pad=True, max_position=256, seqs=8)
    items = ordered(
        [
            ScheduledSequence("a", (5,), 6, (3, 9), True, seq_id=1),
            ScheduledSequence("b", (7,), 12, (4, 8, 10, 2), True, seq_id=2),
            ScheduledSequence("c", (9,), 0, (1,), False, seq_id=3),
        ]
    )
    size = runner.padded_size(items)
    assert size == 4 and runner.pad_sizes == (1, 2, 4, 8)
    ids, pos, meta, rows = runner.prepare(items, size)
    want_ids, want_pos, want, want_rows = reference_prepare(items, BLOCK)
    assert torch.equal(ids[:3], want_ids) and ids[3] == 0
    assert torch.equal(pos[:3], want_pos) and pos[3] == 0
    assert torch.equal(meta.slot_mapping[:3], want.slot_mapping) and meta.slot_mapping[3] == -1
    assert meta.seq_lens.tolist() == [*want.seq_lens.tolist(), 0]
    assert meta.query_start_loc.tolist() == [0, 1, 2, 3, 4]
    width = runner.batch.width  # a graph's tables have every column
    assert meta.block_tables.shape == (4, width)
    assert torch.equal(meta.block_tables[:3, :4], want.block_tables)
    assert not meta.block_tables[:, 4:].any() and not meta.block_tables[3].any()
    assert rows.tolist() == want_rows == [0, 1]
    assert (meta.num_decodes, meta.num_padding, meta.max_seq_len) == (4, 1, 13)
    with pytest.raises(ValueError, match="decode-only"):
        runner.prepare([ScheduledSequence("d", (1, 2), 0, (5,), True, seq_id=4)], 2)


def test_preempted_requests_rows_are_rewritten() -> None:
    """A continuing row reads only its table's tail; a preempted request's rows are forgotten,
    so a recompute that lands where it left off with other blocks in the middle is seen."""
    runner = make_runner(pad=True)
    first = [ScheduledSequence("a", (1, 2, 3, 4, 5), 0, (7, 8), True, seq_id=1)]
    assert_same(runner, first)
    again = [ScheduledSequence("a", (6,), 5, (9, 8), True, seq_id=1)]
    runner.batch.forget({"a"})
    assert_same(runner, again)
