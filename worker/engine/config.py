"""Engine configuration: frozen dataclasses passed down once, validated at construction."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Literal, get_args, get_type_hints

from producer.keys import BANDS
from worker import envs
from worker.engine.fair_share import parse_tenant_weights
from worker.engine.step_targets import parse_tpot_targets

# TPOT targets by band (``producer.keys.BANDS``; a band not named has none). 150 ms keeps chats
# under vLLM's chat TPOT p50 on the CPU serving path (0.21 s, BENCHMARKS.md) while leaving prefill
# ~100 ms a step there (~130 tokens). The default band has none, so an offline run (all priority
# 0: LLMEngine.generate, run_peers.py) plans the steps it planned before targets: a default=400
# target cost its 64-request mix +9% of time on a machine 3x the CPU prior, +47% at 6.7x (the
# loaded 2-core EPYC), 0.1% at 1x (ops/bench/sched_offline.py). GPU steps are far under 150 ms.
DEFAULT_TPOT_TARGET_MS = {"interactive": 150.0}

# ``SchedulerConfig.urgent_step_max`` by device. CPU: a step costs what its rows cost, so a chat
# waits for the batch step in progress. SmolLM2 Q4_1, 2 one-thread workers on 2 cores, 1,000-line
# batch, native interactive TTFT p99 during it over idle (ops/bench/batch_api.py): 6.0x off,
# 1.82x and 2.11x at 1.0, 1.53x at 0.75; batch lines/s 9.16, 6.2-6.8, 5.52 (BENCHMARKS.md). 0.75
# meets the 2x of issue 22 with room, at the price of batch throughput while chats are about.
# CUDA: a decode step of Llama-3.2-1B's shape on an H200 took 1.17 ms at 1 row, 1.62 at 64,
# 6.34 at 256 (ops/bench/gpu_steps.py, 2026-12-04), so 2.0 lets a step grow to about twice a
# chat's own before batch work is cut; not measured with chats on a GPU yet.
DEFAULT_URGENT_STEP_MAX = {"cpu": 0.75, "cuda": 2.0}

# 2 GiB of KV on CPU holds ~46k tokens of SmolLM2-135M (46 KB/token in fp32): far more than a
# 2-core machine can keep busy, and small enough to leave room for a second process.
DEFAULT_CPU_KV_BYTES = 2 * 1024**3


# The dtypes the engine's tensors may take, by name; auto is each setting's own default.
DtypeName = Literal["auto", "float32", "bfloat16", "float16"]


class InvalidConfigError(ValueError):
    """An engine setting is out of range; the message names the setting."""


@dataclass(frozen=True)
class CacheConfig:
    """The paged KV pool's size (``num_blocks``, else ``memory_bytes``, else the fraction) and
    whether full blocks are kept and shared by content (automatic prefix caching)."""

    block_size: int = 16  # tokens per block
    num_blocks: int | None = None
    memory_bytes: int | None = None
    # On CUDA: share of the memory free after loading weights (activations need the rest).
    memory_fraction: float = 0.85
    # Requests sharing a prefix (a system prompt, earlier chat turns, the n choices of one request)
    # compute its full blocks once; off, the pool behaves exactly as it did without the cache.
    enable_prefix_caching: bool = True
    # The K/V a step reads; auto: the model's dtype (float32 on CPU: exact HF parity). bfloat16
    # halves the bytes a decode reads and the pool's bytes a token, as vLLM's auto does for a
    # bf16 model; keys and values are rounded once as they are written. On CPU decodes widen
    # them to float32 as they read; prefill chunks attend in bf16 where the CPU multiplies bf16
    # (AMX, AVX-512 BF16), else widen them too (`CpuAttentionBackend`). The triton backend takes
    # only its model's dtype.
    dtype: DtypeName = "auto"

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise InvalidConfigError("block_size must be >= 1")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise InvalidConfigError("num_blocks must be >= 1")
        if not 0.0 < self.memory_fraction <= 1.0:
            raise InvalidConfigError("memory_fraction must be in (0, 1]")


@dataclass(frozen=True)
class SchedulerConfig:
    """Per-step budgets of the continuous batch."""

    max_num_seqs: int = 64  # sequences in one step at most
    # Tokens computed in one step at most, summed over decodes and prefill chunks: a long prompt
    # is split across steps so decodes keep producing a token every step.
    max_num_batched_tokens: int = 512
    max_model_len: int | None = None  # prompt + output cap; default: the model's and cache's
    # A waiting sequence that cannot start (no batch slot, no KV blocks) preempts running ones
    # of strictly less urgent priority. Strictly: two sequences can never preempt each other.
    preempt_for_priority: bool = True
    # A sequence preempted this many times to make room for urgency is no longer a victim, so
    # a steady trickle of urgent jobs cannot restart the same long job forever.
    max_priority_preemptions: int = 3
    # Fair-share weights by tenant (unlisted: 1.0): a tenant of weight 3 gets three times the
    # tokens of one of weight 1 when both have work waiting.
    tenant_weights: Mapping[str, float] = field(default_factory=dict)
    max_running_per_tenant: int | None = None  # running sequences per tenant; None: no cap
    # Each step's prefill is cut so the running decodes of the most demanding band present meet
    # its target, as the step cost model predicts (step_targets.py); empty: full budget always.
    tpot_target_ms: Mapping[str, float] = field(default_factory=DEFAULT_TPOT_TARGET_MS.copy)
    # ... and at most this many times what its decodes alone cost (the cost model's prediction),
    # so a fast machine does not spend a fixed target's room on prefill. Measured steps overrun
    # the prediction by ~5%: in a burst of long prompts 1.5 gave chats 1.57x and 1.58x their TPOT
    # alone, 1.4 gave 1.37x (ops/bench/tpot_burst.py, 1 thread), under the 1.5x asked. 0: off.
    tpot_slowdown_max: float = 1.4
    # Prefill tokens a step gives the oldest running prompt whatever the target (and a chat's
    # first admission): a 2k-token prompt still ends within 128 steps under a stream of chats.
    # One block: on a loaded 2-core AMD EPYC (prefill ~5 ms a token) 64 put the floor, not the
    # target, in charge: chat TPOT in a burst 3.0x alone, 1.9x at 16 (ops/bench/tpot_burst.py).
    min_prefill_chunk_tokens: int = 16
    # Priority points a job gains per second in the engine (aging.py); 0: off. 0.2 puts a batch
    # job (10) before interactive jobs (-10) that arrive more than 100 s after it.
    aging_per_s: float = 0.2
    # Consecutive steps that may leave less urgent running rows out so an interactive prompt
    # gets its first token in a step of its own cost (first_token.py); 0: off. 2: two chats
    # arriving together both get the lane, and batch decodes skip at most 2 steps in 3.
    first_token_lane_steps: int = 2
    # While a job more urgent than batch runs, waits at the head, or ran less than 10 s ago,
    # batch work fills a step only up to about this many times a chat's own step, as measured
    # (batch_cap.py), so a chat arriving mid-step waits about one of its own steps. 0: off;
    # None: the engine's device's ``DEFAULT_URGENT_STEP_MAX`` (a bare Scheduler: off).
    urgent_step_max: float | None = None

    @cached_property  # read every step
    def tpot_targets_s(self) -> dict[str, float]:
        return {band: ms / 1000 for band, ms in self.tpot_target_ms.items()}

    def resolved(self, device_type: str) -> SchedulerConfig:
        """This config with the defaults that depend on the device (``cpu``, ``cuda``) set."""
        if self.urgent_step_max is not None:
            return self
        return replace(self, urgent_step_max=DEFAULT_URGENT_STEP_MAX.get(device_type, 0.0))

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise InvalidConfigError("max_num_seqs must be >= 1")
        if self.max_priority_preemptions < 0:
            raise InvalidConfigError("max_priority_preemptions must be >= 0")
        if any(w <= 0 for w in self.tenant_weights.values()):
            raise InvalidConfigError("tenant_weights must be > 0")
        if self.max_running_per_tenant is not None and self.max_running_per_tenant < 1:
            raise InvalidConfigError("max_running_per_tenant must be >= 1")
        if any(band not in BANDS or ms <= 0 for band, ms in self.tpot_target_ms.items()):
            raise InvalidConfigError(f"tpot_target_ms takes bands of {BANDS} and values > 0")
        if self.tpot_slowdown_max != 0 and self.tpot_slowdown_max <= 1:
            raise InvalidConfigError("tpot_slowdown_max must be > 1 (or 0: off)")
        if self.min_prefill_chunk_tokens < 1:
            raise InvalidConfigError("min_prefill_chunk_tokens must be >= 1")
        if self.aging_per_s < 0:
            raise InvalidConfigError("aging_per_s must be >= 0")
        if self.first_token_lane_steps < 0:
            raise InvalidConfigError("first_token_lane_steps must be >= 0")
        if self.urgent_step_max is not None and self.urgent_step_max < 0:
            raise InvalidConfigError("urgent_step_max must be >= 0 (0: off)")
        # Every running decode must fit in one step's budget, or decodes would stall.
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise InvalidConfigError("max_num_batched_tokens must be >= max_num_seqs")


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # HF directory or .gguf file; None: the bundled SmolLM2-135M
    device: str = "auto"  # auto: cuda when available, else cpu
    dtype: DtypeName = "auto"  # auto: fp32 CPU, bf16 CUDA
    attention_backend: Literal["auto", "torch", "cpu", "triton"] = "auto"
    # CPU projections: auto packs weights for oneDNN where it supports the dtype and sends steps
    # of few rows to our C++ kernel, keeping a second, plain copy of the weights for it (see
    # worker/models/cpu_linear.py); onednn insists on oneDNN alone; torch keeps F.linear.
    linear_backend: Literal["auto", "torch", "onednn"] = "auto"
    # Projection weights (worker/models/quant_loader.py): gguf keeps a GGUF file's Q8_0/Q4_0/Q4_1
    # blocks for our C++ kernels (the bundled Q4_1 file: 96 MB instead of 540 MB fp32); int8
    # makes per-channel int8 from float weights at load; none: float weights (exact HF parity);
    # auto: gguf for a quantized GGUF on a float32 CPU model, else none. gguf runs on the CPU
    # only; int8 on CUDA too (a Triton GEMM, worker/models/quant_cuda.py).
    quantization: Literal["auto", "none", "gguf", "int8"] = "auto"
    # GGUF blocks: int8 rounds x to 8 bits a 32-value block and multiplies integers, as
    # llama.cpp always does (every step, VNNI or AVX2; worker/models/quant.py): 1.3x tokens/s
    # on the offline mix, +0.4% perplexity. bfloat16: steps of 48 rows and more (prefill
    # chunks) multiply in bf16, x and the weight rounded (oneDNN's bf16 GEMM: AMX tiles where
    # the CPU has them; none without AVX-512, where they stay exact; quant_paths.py
    # BF16_GEMM_MIN_ROWS); fewer rows stay exact. int8+bfloat16: int8 below the rows where bf16
    # overtakes it (BF16_OVER_INT8_MIN_ROWS), at every row count without AMX (where it never does).
    # float32 keeps x exact (the same logits as the float weights, whatever a step's rows).
    quant_activations: Literal["float32", "int8", "bfloat16", "int8+bfloat16"] = "float32"
    seed: int = 0  # seeds unseeded sampling, so a whole run is reproducible
    num_threads: int | None = None  # torch intra-op threads on CPU; None: all cores
    # CUDA: decode-only steps replay CUDA graphs captured at padded batch sizes
    # (worker/engine/cuda_graphs.py); True runs every step eagerly, as CPU steps always run.
    enforce_eager: bool = False
    # Decode-only steps pad to a graph batch size and run from static buffers (padding rows:
    # slot -1, context 0). None: exactly when graphs are captured. True on CPU runs that path
    # without capture, which is how the tests check it gives the unpadded path's tokens.
    pad_decode_batches: bool | None = None
    # One step in flight (worker/engine/overlap.py): step N's text and publishing overlap step
    # N+1's compute. async: on the calling thread (CUDA launches return at once); thread: the
    # forward and sampling on a background thread; auto: overlap.DEFAULT_MODES by device.
    overlap_steps: Literal["auto", "off", "async", "thread"] = "auto"
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """The engine's command-line flags, beside the fields they fill so each default is
        said once (the fields'); ``from_args`` builds the config from them."""
        hints = get_type_hints(EngineConfig)
        g = parser.add_argument_group("engine")
        g.add_argument(
            "--model",
            default=None,
            help="HF directory or .gguf (default: PATERNOSTER_MODEL, else the bundled SmolLM2)",
        )
        g.add_argument("--device", default=EngineConfig.device)
        g.add_argument("--dtype", default=EngineConfig.dtype, choices=get_args(DtypeName))
        backends = get_args(hints["attention_backend"])
        g.add_argument(
            "--attention-backend", default=EngineConfig.attention_backend, choices=backends
        )
        g.add_argument(
            "--linear-backend",
            default=EngineConfig.linear_backend,
            choices=get_args(hints["linear_backend"]),
            help="CPU projections: auto packs weights for oneDNN where the dtype allows and runs "
            "steps of up to 8 rows through our C++ kernel (a second copy of the weights); onednn: "
            "oneDNN alone",
        )
        g.add_argument(
            "--quantization",
            default=EngineConfig.quantization,
            choices=get_args(hints["quantization"]),
            help="CPU projection weights: gguf keeps the file's blocks (auto's choice for a "
            "quantized GGUF), int8 quantizes float weights at load, none keeps them float",
        )
        g.add_argument(
            "--quant-activations",
            default=EngineConfig.quant_activations,
            choices=get_args(hints["quant_activations"]),
            help="GGUF blocks: int8 rounds activations to 8 bits as llama.cpp does (faster, "
            "+0.4%% perplexity); bfloat16 multiplies steps of 48+ rows in bf16 (prefill; for "
            "CPUs with AMX or AVX-512 BF16); int8+bfloat16 does both, int8 below 80 rows "
            "(every step without AMX); float32 keeps them exact",
        )
        g.add_argument(
            "--enforce-eager",
            action="store_true",
            help="CUDA: run every step eagerly instead of replaying captured CUDA graphs",
        )
        g.add_argument(
            "--overlap-steps",
            default=EngineConfig.overlap_steps,
            choices=get_args(hints["overlap_steps"]),
            help="make step N's text while step N+1 computes (auto: per device, overlap.py)",
        )
        g.add_argument(
            "--kv-cache-dtype",
            default=CacheConfig.dtype,
            choices=get_args(DtypeName),
            help="K/V cache dtype (auto: the model's); bfloat16 halves what decodes read",
        )
        g.add_argument("--block-size", type=int, default=CacheConfig.block_size)
        g.add_argument(
            "--num-blocks", type=int, default=None, help="KV blocks (default: from memory)"
        )
        g.add_argument("--kv-cache-bytes", type=int, default=None)
        g.add_argument("--max-num-seqs", type=int, default=SchedulerConfig.max_num_seqs)
        batched = SchedulerConfig.max_num_batched_tokens
        g.add_argument("--max-num-batched-tokens", type=int, default=batched)
        g.add_argument("--max-model-len", type=int, default=None)
        g.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all)")
        from worker.engine.policy_flags import add_policy_arguments  # it reads these defaults

        add_policy_arguments(parser)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EngineConfig:
        """The config of parsed ``add_arguments`` flags (``--model`` unset: PATERNOSTER_MODEL)."""
        return cls(
            model=args.model or envs.default_model(),
            device=args.device,
            dtype=args.dtype,
            attention_backend=args.attention_backend,
            linear_backend=args.linear_backend,
            quantization=args.quantization,
            quant_activations=args.quant_activations,
            num_threads=args.threads,
            enforce_eager=args.enforce_eager,
            overlap_steps=args.overlap_steps,
            cache=CacheConfig(
                block_size=args.block_size,
                num_blocks=args.num_blocks,
                memory_bytes=args.kv_cache_bytes,
                dtype=args.kv_cache_dtype,
            ),
            scheduler=SchedulerConfig(
                max_num_seqs=args.max_num_seqs,
                max_num_batched_tokens=args.max_num_batched_tokens,
                max_model_len=args.max_model_len,
                preempt_for_priority=not args.no_priority_preemption,
                max_priority_preemptions=args.max_priority_preemptions,
                tenant_weights=parse_tenant_weights(args.tenant_weight),
                max_running_per_tenant=args.max_running_per_tenant,
                tpot_target_ms=parse_tpot_targets(args.tpot_target_ms),
                min_prefill_chunk_tokens=args.min_prefill_chunk_tokens,
                tpot_slowdown_max=args.tpot_slowdown_max,
                aging_per_s=args.aging_per_s,
                first_token_lane_steps=args.first_token_lane_steps,
                urgent_step_max=args.urgent_step_max,
            ),
        )
