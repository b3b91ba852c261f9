"""A Hugging Face Llama or Qwen3 directory of random weights in a named shape, for benchmarks.

    python ops/bench/random_model.py --shape llama-3.2-1b --tokenizer DIR --out /tmp/llama-1b
    python ops/bench/random_model.py --shape qwen3-0.6b --tokenizer DIR --out /tmp/qwen3-0.6b
    python ops/bench/random_model.py --shape llama-3.2-1b --tokenizer DIR --out D --fp8

Throughput does not depend on what the weights say, and a lent GPU machine cannot reach a hub, so
GPU benchmarks run on random weights of a real model's shape. Only the tokenizer files travel (a
few MB): the vocabulary is the tokenizer's (qwen3-0.6b keeps its own, larger one), so workloads
draw real token ids. Embeddings are drawn from N(0, 1) as in the tests' tiny model: larger logits,
fewer greedy near-ties, so a parity check between two systems says something. ``--fp8`` saves
the projections as an FP8 checkpoint (compressed-tensors: e4m3 codes, one scale a row, the LM
head and embeddings kept), as the FP8 checkpoints worker/models/quant_fp8.py loads.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

# Run as a script, this folder is sys.path[0] and its kernels.py would shadow the kernels package.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# Llama-family shapes as Hugging Face config keys; ``model_type`` defaults to llama, the
# vocabulary to the tokenizer's and ``tie_word_embeddings`` to True. llama-3.2-1b: 16 layers of
# GQA 32/8 at head size 64, 0.97 B non-embedding weights.
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {  # for tests: the script's path in milliseconds
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rope_theta": 10000.0,
    },
    # ops/bench/host_overhead.py: 16 layers whose matmuls are negligible (0.59 M non-embedding
    # weights) beside the real 49,152-token vocabulary, so a step times the host's work per layer.
    "host-overhead": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 16,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rope_theta": 10000.0,
    },
    "smollm2-135m": {
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "rope_theta": 100000.0,
    },
    "llama-3.2-1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "rope_theta": 500000.0,
    },
    "llama-3-8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "rope_theta": 500000.0,
    },
    # For tests: Qwen3's path (q/k RMSNorm per head, head_dim 32 where hidden / heads is 16).
    "tiny-qwen3": {
        "model_type": "qwen3",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "rope_theta": 1000000.0,
    },
    # Qwen3-0.6B, nano-vllm's benchmark model: 28 layers of GQA 16/8 at head size 128 (not
    # 1024 / 16 = 64), q/k norm, tied embeddings, 0.44 B non-embedding weights. Its own 151,936-
    # token vocabulary, so the LM head weighs what the real one does (0.16 B of the 0.6 B): the
    # tokenizer's ids are the first 49,152, prompts are drawn from them, and sampled ids above
    # them decode to nothing (ignore_eos runs never read the text).
    "qwen3-0.6b": {
        "model_type": "qwen3",
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rope_theta": 1000000.0,
        "vocab_size": 151936,
    },
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def hf_config(shape: str, source: dict[str, Any], dtype: torch.dtype) -> Any:
    """The Hugging Face config of ``shape``, with the token ids of ``source`` (the tokenizer
    directory's config.json)."""
    from transformers import AutoConfig

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose from {', '.join(SHAPES)}")
    spec = dict(SHAPES[shape])
    model_type = spec.pop("model_type", "llama")
    spec.setdefault("vocab_size", source["vocab_size"])
    spec.setdefault("tie_word_embeddings", True)
    return AutoConfig.for_model(
        model_type,
        **spec,
        max_position_embeddings=8192,
        bos_token_id=source.get("bos_token_id"),
        eos_token_id=source.get("eos_token_id"),
        torch_dtype=str(dtype).removeprefix("torch."),
    )


def write_random_model(
    shape: str, tokenizer_dir: Path, out: Path, dtype: torch.dtype, device: str, seed: int = 0
) -> Path:
    from transformers import AutoModelForCausalLM

    source = json.loads((tokenizer_dir / "config.json").read_text())
    config = hf_config(shape, source, dtype)
    torch.manual_seed(seed)
    with torch.device(device):  # initialise where it will run: a 1 B model inits in seconds
        model = AutoModelForCausalLM.from_config(config).to(dtype)
    with torch.no_grad():
        model.get_input_embeddings().weight.normal_(0.0, 1.0)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, out / name)
    return out


def to_fp8(out: Path, device: str = "cpu") -> int:
    """Rewrite the checkpoint in ``out`` with its decoder projections as e4m3 codes and an
    ``(N, 1)`` float32 ``weight_scale`` each (quantized on ``device``); how many were
    converted."""
    from safetensors.torch import load_file, save_file

    from kernels.triton_quant import quantize_fp8
    from worker.models.quant_fp8 import COMPRESSED_TENSORS_FP8

    converted = 0
    for file in sorted(out.glob("*.safetensors")):
        state = load_file(str(file))
        for name in [n for n in state if n.endswith("_proj.weight")]:
            codes, scale = quantize_fp8(state[name].to(device))
            state[name] = codes.cpu()
            state[name.removesuffix("weight") + "weight_scale"] = scale[:, None].cpu()
            converted += 1
        save_file(state, str(file), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = COMPRESSED_TENSORS_FP8
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return converted


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.2-1b")
    p.add_argument(
        "--tokenizer", type=Path, required=True, help="a model dir with config.json + tokenizer"
    )
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="bfloat16")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fp8", action="store_true", help="projections as an FP8 checkpoint")
    args = p.parse_args(argv)
    start = time.perf_counter()
    out = write_random_model(
        args.shape, args.tokenizer, args.out, getattr(torch, args.dtype), args.device, args.seed
    )
    if args.fp8:
        print(f"{to_fp8(out, args.device)} projections as FP8 (e4m3, a scale a row)")
    size_gb = sum(f.stat().st_size for f in out.iterdir()) / 1e9
    print(f"{args.shape}: {out} ({size_gb:.2f} GB) in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
