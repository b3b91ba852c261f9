"""Turns the scheduler's decision into tensors and runs one packed forward pass.

The runner owns the device state: the model's weights, the per-layer paged KV caches, the
persistent batch (`InputBatch`), the static input buffers (`DeviceInputs`) and the decode graphs
(`DecodeGraphs`). It knows nothing of requests beyond what `SchedulerOutput` says.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

import structlog
import torch

from worker.attention import get_attention_backend
from worker.engine.config import EngineConfig
from worker.engine.cuda_graphs import DecodeGraphs, graph_batch_sizes, size_for
from worker.engine.device_inputs import DeviceInputs, StepInputs
from worker.engine.input_batch import InputBatch
from worker.engine.kv_pool import DTYPES, make_kv_caches
from worker.engine.logits_buffer import LogitsBuffer
from worker.engine.scheduler_output import ScheduledSequence, SchedulerOutput
from worker.engine.sequence import PLACEHOLDER
from worker.engine.step_layout import FieldViews, HostStep
from worker.models.base import CausalLM, StepContext

log = structlog.get_logger("paternoster.engine")
_COMPUTED = attrgetter("num_computed_tokens")
_REQUEST_ID, _SEQ_ID = attrgetter("request_id"), attrgetter("seq_id")


@dataclass(frozen=True)
class RunnerOutput:
    """Logits ``(num_sampling, vocab)`` float32, one row per sequence that samples, in order."""

    request_ids: tuple[str, ...]
    logits: torch.Tensor
    seq_ids: tuple[int, ...]  # the same rows by sequence (a request with n > 1 has n of them)


class SampledFeed:
    """A launched step's sampled ids where the device has them, by sequence id: what the
    next step's `PLACEHOLDER` inputs read (the overlapped loop schedules that step before the
    ids reach the host)."""

    def __init__(self, seq_ids: tuple[int, ...], ids: torch.Tensor) -> None:
        self.seq_ids = seq_ids
        self.ids = ids  # (rows,) int64, never negative: a failed row's id reads as 0

    def rows(self, seq_ids: Sequence[int]) -> list[int]:
        """The rows of ``seq_ids``; a sequence the step gave no id (its runner or sampler
        failed, so the resolve ends it) reads row 0: its next row computes nothing kept."""
        row_of = dict(zip(self.seq_ids, range(len(self.seq_ids)), strict=True))
        return [row_of.get(s, 0) for s in seq_ids]


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


class ModelRunner:
    def __init__(self, config: EngineConfig, model: CausalLM, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.block_size = config.cache.block_size
        self.backend = get_attention_backend(config.attention_backend, device)
        mc = model.config
        self.kv_caches = make_kv_caches(config.cache, model, device, self.backend)
        self.num_blocks = self.kv_caches[0].k_cache.shape[0]
        # The engine's bound (`LLMEngine.max_model_len`): no block table is longer.
        limit = config.scheduler.max_model_len or mc.max_position
        self.max_model_len = min(limit, mc.max_position, self.num_blocks * self.block_size)
        self._setup_inputs(config)
        self.compute_logits = LogitsBuffer(model)  # the model's, into a kept buffer if large
        self.feed: SampledFeed | None = None  # the last launched step's ids (`StepLauncher`)

    def _setup_inputs(self, config: EngineConfig) -> None:
        """The persistent batch, and where graphs or padding apply, static buffers and graphs."""
        device, sched = self.device, config.scheduler
        graphs = (
            device.type == "cuda" and not config.enforce_eager and self.backend.supports_cuda_graphs
        )
        pad = graphs if config.pad_decode_batches is None else config.pad_decode_batches
        self.pad_sizes = graph_batch_sizes(sched.max_num_seqs) if pad else ()
        largest = self.pad_sizes[-1] if self.pad_sizes else 0
        self.batch = InputBatch(
            max_seqs=max(sched.max_num_seqs, largest),
            max_tokens=max(sched.max_num_batched_tokens, largest),
            width=-(-self.max_model_len // self.block_size),
            block_size=self.block_size,
            pin=device.type == "cuda",
        )
        # On CPU the staging buffers are the step's tensors, unless the padded path is tested.
        static = device.type != "cpu" or pad
        self.inputs = DeviceInputs(self.batch, device, self.max_model_len) if static else None
        self.graphs = DecodeGraphs(self.pad_sizes, device) if graphs and pad else None
        self._host_views = FieldViews(self.batch.stage64, self.batch.stage32)

    @staticmethod
    def batch_order(output: SchedulerOutput) -> list[ScheduledSequence]:
        """Decodes longest first, then prefill chunks: the order rows are packed in.

        Decode attention pads each group of sequences to its longest; sorted neighbours waste
        little where running order would pad a 20-token chat to a 2k-token document.
        """
        d = output.num_decodes
        # reverse keeps equal keys in running order, as a key of -num_computed_tokens did.
        decodes = sorted(output.scheduled[:d], key=_COMPUTED, reverse=True)
        return decodes + list(output.scheduled[d:])

    def padded_size(self, items: Sequence[ScheduledSequence]) -> int | None:
        """The graph size a decode-only step of ``items`` pads to; None: run it as it is."""
        if not self.pad_sizes or any(len(s.token_ids) != 1 for s in items):
            return None
        return size_for(self.pad_sizes, len(items))

    def prepare(self, items: Sequence[ScheduledSequence], pad_to: int | None = None) -> StepInputs:
        """Packed ``input_ids``, ``positions``, attention metadata and logits row indices,
        padded to ``pad_to`` rows (a decode-only step; see `padded_size`)."""
        if self.inputs is not None:
            self.inputs.wait()
        step = self.batch.stage(items, pad_to)
        if self.inputs is not None:
            return self.inputs.load(step)
        return self._host_inputs(step)

    def _host_inputs(self, step: HostStep) -> StepInputs:
        """The staged step as CPU tensors: views of the staging buffers, no copy."""
        b = self.batch
        if self._host_views.i64 is not b.stage64:  # the staging buffers grew
            self._host_views = FieldViews(b.stage64, b.stage32)
        f = self._host_views(step.num_tokens, step.num_seqs, step.num_logits)
        return StepInputs.of(step, f, torch.from_numpy(b.gather_tables(step)))

    def _read_placeholders(self, decodes: Sequence[ScheduledSequence], ids: torch.Tensor) -> None:
        """Write each decode row whose token is still in flight from ``feed``, on the device
        (rows are packed decodes first, one token each; only a decode can hold one: its step
        sampled it, so it is the one token left to compute)."""
        rows = [j for j, s in enumerate(decodes) if s.token_ids[0] == PLACEHOLDER]
        if not rows:
            return
        feed = self.feed
        if feed is None:
            raise RuntimeError("a token in flight, and no launched step to read it from")
        seq_ids = [decodes[j].seq_id for j in rows]
        if len(rows) == len(decodes) == len(feed.seq_ids) and feed.seq_ids == tuple(seq_ids):
            # The steady state: every row reads the id the launched step sampled in the same
            # row (the batch order keeps a decode-only batch's order). One copy on the device,
            # where the general path builds two index lists, copies them to the device and
            # gathers: the whole stubbed step 0.95x at 256 rows, 0.93x at 64 (two engines in one
            # process, BENCHMARKS.md "twelfth pass"; the general path took ~0.18 ms at 256).
            ids[: len(rows)].copy_(feed.ids)
            return
        src = feed.rows(seq_ids)
        pin = self.device.type == "cuda"  # non-blocking copies: the host must not wait here
        both = torch.tensor([rows, src], dtype=torch.int64, pin_memory=pin)
        dst_t, src_t = both.to(self.device, non_blocking=pin)
        ids.index_copy_(0, dst_t, feed.ids.index_select(0, src_t))

    @torch.inference_mode()
    def capture_graphs(self) -> None:
        """Capture the decode graphs now: at start-up, once the model's kernels are attached.
        `run` does it before the first decode step otherwise; a no-op without graphs."""
        if self.graphs is None or self.inputs is None:
            return
        inputs = self.inputs

        def forward(size: int) -> torch.Tensor:
            ids, pos, meta = inputs.graph_views(size)
            return self.model(ids, pos, StepContext(meta, self.backend, self.kv_caches))

        try:
            self.graphs.capture(forward, inputs.fill_padding, self.batch.generation)
        except Exception:
            # Inside a step, a raise would fail every request of every decode step after it
            # (`step_faults` retries each alone, and each would capture again): run eagerly.
            log.exception("cuda_graph_capture_failed")
            self.graphs = None

    @torch.inference_mode()
    def run(self, output: SchedulerOutput) -> RunnerOutput:
        items = self.batch_order(output)
        self.batch.forget(frozenset(output.preempted_ids))
        pad_to = self.padded_size(items)
        graphs = self.graphs if pad_to is not None else None
        if graphs is not None and not graphs.ready(self.batch.generation):
            self.capture_graphs()
        step = self.prepare(items, pad_to)
        self._read_placeholders(items[: output.num_decodes], step.input_ids)
        if graphs is not None and pad_to is not None and graphs.ready(self.batch.generation):
            hidden = graphs.replay(pad_to)
        else:
            ctx = StepContext(meta=step.meta, backend=self.backend, kv_caches=self.kv_caches)
            hidden = self.model(step.input_ids, step.positions, ctx)
        sampling = [s for s in items if s.samples]
        request_ids = tuple(map(_REQUEST_ID, sampling))
        seq_ids = tuple(map(_SEQ_ID, sampling))
        if not sampling:
            empty = hidden.new_empty((0, self.model.config.vocab_size)).float()
            return RunnerOutput(request_ids, empty, seq_ids)
        return RunnerOutput(request_ids, self.compute_logits(hidden[step.logits_rows]), seq_ids)
