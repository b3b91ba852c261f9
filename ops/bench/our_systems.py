"""Our engine's bench systems, each one row: the engine settings it changes from the default.

Torch-free, so `peers/run_peers.py` can check ``--local`` names before it loads the engine;
`our_engine.run_ours` builds each system's config from its row, and engine.py's and
run_peers.py's lists of systems are these names.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OurSystem:
    """What a system sets; None keeps what the bench's flags and the engine default to."""

    dtype: str | None = None  # EngineConfig.dtype's; None: the bench's --dtype
    quantization: str | None = None  # EngineConfig.quantization's
    activations: str | None = None  # EngineConfig.quant_activations'
    kv_dtype: str | None = None  # CacheConfig.dtype's


OUR_SYSTEMS: dict[str, OurSystem] = {
    # The engine's default: `auto`, the file's own blocks for a quantized GGUF on the CPU; it
    # and the HF peers take --dtype (fp32 on the CPU, bf16 on CUDA unless told otherwise).
    "ours": OurSystem(),
    # The GGUF's blocks dequantized to fp32 at load (exact HF parity).
    "ours-fp32": OurSystem(quantization="none"),
    # The file's blocks dequantized, then per-channel int8 at load (`--quantization int8`, the
    # mode for a float checkpoint).
    "ours-int8": OurSystem(quantization="int8"),
    # The default's blocks with x rounded to 8 bits (`--quant-activations int8`).
    "ours-a8": OurSystem(activations="int8"),
    # The default's blocks with steps of 48+ rows multiplied in bf16.
    "ours-abf16": OurSystem(activations="bfloat16"),
    # Both, x rounded to 8 bits below those rows.
    "ours-a8bf16": OurSystem(activations="int8+bfloat16"),
    # The default with its K/V cache in bf16 (`--kv-cache-dtype bfloat16`), as vLLM's auto
    # cache dtype is for its bf16 model.
    "ours-kvbf16": OurSystem(kv_dtype="bfloat16"),
    # ours-a8's activations and a bf16 cache: ours-a8bf16-kvbf16 where a CPU lacks bf16
    # arithmetic (AVX2: `bfloat16` falls back to exact x there, with a warning), under a name
    # that says what runs.
    "ours-a8-kvbf16": OurSystem(activations="int8", kv_dtype="bfloat16"),
    "ours-a8bf16-kvbf16": OurSystem(activations="int8+bfloat16", kv_dtype="bfloat16"),
    # bf16 weights and K/V (AVX512-BF16 CPUs run bf16 GEMMs at ~2x fp32).
    "ours-bf16": OurSystem(dtype="bfloat16"),
}
