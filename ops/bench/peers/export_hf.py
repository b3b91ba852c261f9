"""Save the bundled SmolLM2 GGUF as a Hugging Face directory that peer engines (vLLM) can load.

    python ops/bench/peers/export_hf.py                    # prints the directory (fp32)
    python ops/bench/peers/export_hf.py --dtype bfloat16   # a second copy with bf16 weights

transformers dequantizes the GGUF (Q4_1) and ``save_pretrained`` writes safetensors, config.json,
generation_config.json and the tokenizer. The directory lives under our cache
(``PATERNOSTER_CACHE_DIR`` or ``~/.cache/paternoster``) in ``peers/``, keyed by the GGUF's path,
size and mtime and by the dtype, and is written once: later calls only print it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

# Run as a script: put the repository first so `worker` imports without an install.
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from worker import envs
from worker.models.loader import bundled_model_path, write_once

DTYPES = ("float32", "bfloat16")
EXPORT_VERSION = "1"  # bump when the layout changes, so stale exports are not reused


def export_dir(gguf: Path, dtype: str, cache_root: Path) -> Path:
    stat = gguf.stat()
    key = f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{dtype}:{EXPORT_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return cache_root / "peers" / f"{gguf.stem}-{dtype}-{digest}"


def export(
    gguf: Path | None = None, dtype: str = "float32", cache_root: Path | None = None
) -> Path:
    """The HF directory for ``gguf`` (default: the bundled one), written on first use."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = gguf or bundled_model_path()
    target = export_dir(gguf, dtype, cache_root or envs.cache_dir())

    def write(out: Path) -> None:
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=getattr(torch, dtype)
        )
        # The weights are plain floats once loaded; GGUF's quantizer only refuses to save them.
        model.hf_quantizer = None  # type: ignore[assignment]
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(str(out))
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tokenizer.save_pretrained(str(out))

    return write_once(target, write)


def vllm_model(dtype: str) -> Path:
    """The HF directory vLLM loads for its ``--dtype``: ``auto`` (vLLM's own choice, bfloat16 on
    x86) reads the float32 export, as a user's float32 checkpoint would be."""
    return export(dtype="float32" if dtype == "auto" else dtype)


def export_gguf_f32(
    quantize: Path, gguf: Path | None = None, cache_root: Path | None = None
) -> Path:
    """An F32 copy of ``gguf`` for llama.cpp, made once by ``llama-quantize``: the same dequantized
    weights that transformers (and so ours and vLLM) load, in llama.cpp's own format."""
    import subprocess

    gguf = gguf or bundled_model_path()
    stem = export_dir(gguf, "F32", cache_root or envs.cache_dir())
    target = stem.with_name(stem.name + ".gguf")
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        cmd = [str(quantize), "--allow-requantize", str(gguf), str(staging), "F32"]
        subprocess.run(cmd, check=True, capture_output=True)
        staging.rename(target)
    finally:
        staging.unlink(missing_ok=True)
    return target


def main(argv: Sequence[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gguf", type=Path, help="default: the bundled SmolLM2-135M GGUF")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--cache-dir", type=Path, help="default: our model cache")
    args = p.parse_args(argv)
    out = export(args.gguf, args.dtype, args.cache_dir)
    print(out)
    return out


if __name__ == "__main__":
    main()
