"""The static-buffer decode path on the CPU: same tokens as the plain path, graphs or not.

CUDA graphs need a GPU, but what they depend on does not: decode steps padded to a graph size,
padding rows that write nowhere and read nothing, inputs at the same addresses every step, and
(for a graph) metadata frozen at capture. `pad_decode_batches=True` runs the first three on the
CPU; `RerunGraphs` adds the fourth by replaying a "graph" as the same forward over the same
buffers with the metadata built at capture.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.engine.test_engine import PROMPTS as ENGINE_PROMPTS
from worker.attention import AttentionMetadata, KVCache, get_attention_backend
from worker.attention.backend import BackendName
from worker.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from worker.engine.cuda_graphs import DecodeGraphs, Forward, graph_batch_sizes, size_for
from worker.engine.device_inputs import StepInputs
from worker.engine.llm_engine import LLMEngine
from worker.engine.model_runner import RunnerOutput
from worker.engine.sampling_params import SamplingParams
from worker.engine.scheduler_output import ScheduledSequence, SchedulerOutput

PROMPTS = ENGINE_PROMPTS[:5]  # the engine tests' prompts, less the longest
# Over 64 tokens (one Triton decode tile): a split-K grid sized for less would drop its tail.
LONG = "It was the best of times, it was the worst of times, it was the age of wisdom, " * 4


def make_engine(
    model_dir: Path,
    backend: BackendName,
    pad: bool,
    num_blocks: int = 512,
    budget: int = 64,
    seqs: int = 8,
) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=str(model_dir),
            attention_backend=backend,
            pad_decode_batches=pad,
            cache=CacheConfig(block_size=4, num_blocks=num_blocks),
            scheduler=SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=budget),
        )
    )


class PrepareSpy:
    """Records what each step's `prepare` returned (wraps the runner's own)."""

    def __init__(self, engine: LLMEngine) -> None:
        self.steps: list[StepInputs] = []
        self._prepare = engine.runner.prepare
        engine.runner.prepare = self  # type: ignore[method-assign]

    def __call__(self, items: list[ScheduledSequence], pad_to: int | None = None) -> StepInputs:
        step = self._prepare(items, pad_to)
        self.steps.append(step)
        return step


def outputs(engine: LLMEngine, params: list[SamplingParams]) -> list[Any]:
    done = engine.generate(PROMPTS, params)
    return [[c.token_ids for c in d.choices] or d.token_ids for d in done]


PARAMS = [
    SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True),
    SamplingParams(temperature=0.8, seed=7, n=3, max_tokens=10, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True),
]


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_padded_static_decode_gives_the_plain_paths_tokens(
    tiny_model_dir: Path, backend: BackendName
) -> None:
    """Roomy and tight (preemption, chunked prefill) pools; n > 1 with a seed."""
    for blocks, budget, seqs in [(512, 64, 8), (16, 8, 4)]:
        plain = make_engine(tiny_model_dir, backend, False, blocks, budget, seqs)
        padded = make_engine(tiny_model_dir, backend, True, blocks, budget, seqs)
        assert padded.runner.backend.name == plain.runner.backend.name == backend
        spy = PrepareSpy(padded)
        assert outputs(padded, PARAMS) == outputs(plain, PARAMS)
        padded_steps = [s for s in spy.steps if s.meta.num_padding]
        assert padded_steps, "some decode step must have been padded to a bucket"
        assert all(s.meta.num_seqs in padded.runner.pad_sizes for s in padded_steps)
        # Every step read the same static buffers.
        d64 = padded.runner.inputs.d64 if padded.runner.inputs else None
        assert d64 is not None
        assert {s.input_ids.data_ptr() for s in spy.steps} == {d64.data_ptr()}
        assert {s.meta.seq_lens.data_ptr() for s in spy.steps} == {
            padded.runner.inputs.d32.data_ptr()
        }
        if blocks == 16:
            assert padded.scheduler.num_preemptions > 0
        assert padded.block_manager.num_free_blocks == padded.block_manager.num_blocks


class RerunGraphs(DecodeGraphs):
    """A CUDA graph's contract on the CPU: a replay reruns the captured forward over the same
    buffers with the metadata of capture (max_model_len, no padding count)."""

    replays = 0

    def _capture_one(self, size: int, forward: Forward) -> Callable[[], torch.Tensor]:
        forward(size)

        def replay() -> torch.Tensor:
            RerunGraphs.replays += 1
            return forward(size)

        return replay


class RunSpy:
    """Records the logits of each step's `run` (wraps the runner's own)."""

    def __init__(self, engine: LLMEngine) -> None:
        self.logits: list[torch.Tensor] = []
        self._run = engine.runner.run
        engine.runner.run = self  # type: ignore[method-assign]

    def __call__(self, output: SchedulerOutput) -> RunnerOutput:
        result = self._run(output)
        self.logits.append(result.logits.clone())
        return result


def test_replayed_graph_path_gives_the_eager_logits_with_triton(tiny_model_dir: Path) -> None:
    """The Triton kernels (under the interpreter) see padding only through slot -1 and seq_len
    0, and a split-K grid sized for max_model_len, as in a captured graph."""
    params = [SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)] * 3
    prompts = [PROMPTS[0], LONG, PROMPTS[2]]
    eager = make_engine(tiny_model_dir, "triton", False)
    graphed = make_engine(tiny_model_dir, "triton", True)
    assert graphed.runner.backend.supports_cuda_graphs
    graphed.runner.graphs = RerunGraphs(graphed.runner.pad_sizes, torch.device("cpu"))
    RerunGraphs.replays = 0
    eager_run, graphed_run, spy = RunSpy(eager), RunSpy(graphed), PrepareSpy(graphed)
    want = [c.token_ids for c in eager.generate(prompts, params)]
    assert [c.token_ids for c in graphed.generate(prompts, params)] == want
    assert len(graphed_run.logits) == len(eager_run.logits)
    for got, expected in zip(graphed_run.logits, eager_run.logits, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    replayed = [s for s in spy.steps if s.meta.num_decodes == s.meta.num_seqs]
    assert RerunGraphs.replays == len(replayed) >= 4  # every decode-only step
    assert any(s.meta.num_padding for s in replayed)  # 3 rows padded to 4
    assert max(s.meta.max_seq_len for s in replayed) > 64  # past the first split of the grid
    assert graphed.runner.graphs.ready(graphed.runner.batch.generation)


def test_graphs_only_for_backends_that_support_them(tiny_model_dir: Path) -> None:
    for backend in ("torch", "cpu"):
        engine = make_engine(tiny_model_dir, backend, True)  # type: ignore[arg-type]
        assert not engine.runner.backend.supports_cuda_graphs
        assert engine.runner.graphs is None  # and none on CPU anyway


def test_graph_batch_sizes() -> None:
    assert graph_batch_sizes(1) == (1,)
    assert graph_batch_sizes(3) == (1, 2, 4)
    assert graph_batch_sizes(8) == (1, 2, 4, 8)
    assert graph_batch_sizes(20) == (1, 2, 4, 8, 16, 24)
    assert graph_batch_sizes(64)[-3:] == (48, 56, 64)
    big = graph_batch_sizes(1000)
    assert big[-1] == 512 and len(big) == 4 + 63
    assert size_for((1, 2, 4, 8), 3) == 4 and size_for((1, 2, 4, 8), 9) is None


@pytest.mark.parametrize("backend", ["torch", "cpu", "triton"])
def test_backends_write_nowhere_and_read_nothing_for_padding_rows(backend: BackendName) -> None:
    """Three decodes plus two padding rows (slot -1, context 0, table row of zeros): the cache
    changes only at the real slots, padding rows come out zero, real rows as without them."""
    attn = get_attention_backend(backend, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    cache_shape = (6, 2, 4, 8)  # blocks, KV heads, block size, head size
    k_cache, v_cache = (torch.randn(cache_shape, generator=gen) for _ in range(2))
    q, key, value = (torch.randn(5, n, 8, generator=gen) for n in (4, 2, 2))
    tables = torch.tensor(
        [[1, 5, 2], [3, 0, 0], [4, 0, 0], [0, 0, 0], [0, 0, 0]], dtype=torch.int32
    )
    lens = [10, 3, 1, 0, 0]

    def meta(n: int, padding: int) -> AttentionMetadata:
        slots = [2 * 4 + 1, 3 * 4 + 2, 4 * 4 + 0, -1, -1][:n]
        return AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            block_tables=tables[:n],
            seq_lens=torch.tensor(lens[:n], dtype=torch.int32),
            query_start_loc=torch.arange(n + 1, dtype=torch.int32),
            num_decodes=n,
            max_seq_len=10,
            max_query_len=1,
            seq_lens_host=tuple(lens[:n]),
            num_padding=padding,
        )

    k_plain, v_plain = k_cache.clone(), v_cache.clone()
    want = attn.forward(q[:3], key[:3], value[:3], KVCache(k_plain, v_plain), meta(3, 0), 0.3)
    got = attn.forward(q, key, value, KVCache(k_cache, v_cache), meta(5, 2), 0.3)
    assert torch.equal(k_cache, k_plain) and torch.equal(v_cache, v_plain)
    torch.testing.assert_close(got[:3], want)
    assert not got[3:].any()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_cuda_graphs_give_the_eager_tokens(tiny_model_dir: Path) -> None:
    """On a GPU: captured graphs against --enforce-eager, greedy, in float32 (near-ties of
    bf16 could flip a token between split-K plans: the graph's grid is sized for max_model_len)."""

    def cuda_engine(eager: bool) -> LLMEngine:
        return LLMEngine(
            EngineConfig(
                model=str(tiny_model_dir),
                device="cuda",
                dtype="float32",
                enforce_eager=eager,
                cache=CacheConfig(block_size=16, num_blocks=256),
                scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64),
            )
        )

    params = [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)] * 5
    eager, graphed = cuda_engine(True), cuda_engine(False)
    assert eager.runner.graphs is None and graphed.runner.graphs is not None
    want = [c.token_ids for c in eager.generate([*PROMPTS[:4], LONG], params)]
    assert [c.token_ids for c in graphed.generate([*PROMPTS[:4], LONG], params)] == want
    assert graphed.runner.graphs is not None  # capture did not fail over to eager
    assert graphed.runner.graphs.ready(graphed.runner.batch.generation)
