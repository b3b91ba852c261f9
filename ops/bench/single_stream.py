"""Single-stream decode: one request, forced length, our engine against Hugging Face ``generate``.

    python ops/bench/single_stream.py [--tokens 128] [--dtype float32|bfloat16] [--repeats 3]

Both load the same weights (the bundled SmolLM2-135M unless ``--model``) in the same dtype and
thread count, generate greedily with EOS disabled, and report output tokens/s (median of
``--repeats``) and whether the token ids agree.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

# Run as a script, this folder is sys.path[0] and its kernels.py would shadow the kernels package.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

PROMPT = "Tell me a long story about a lift that never stops."


def time_ours(args: argparse.Namespace) -> tuple[float, list[int]]:
    from worker.engine.config import EngineConfig
    from worker.engine.llm_engine import LLMEngine
    from worker.engine.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig(model=args.model, device="cpu", dtype=args.dtype))
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    engine.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=4))  # warm-up
    rates, tokens = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        tokens = list(engine.generate([PROMPT], params)[0].token_ids)
        rates.append(len(tokens) / (time.perf_counter() - start))
    return statistics.median(rates), tokens


def time_hf(args: argparse.Namespace) -> tuple[float, list[int]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from worker.models.loader import resolve_model_dir

    model_dir = resolve_model_dir(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, args.dtype))
    model.eval().generation_config.eos_token_id = None  # forced length, as ignore_eos
    ids = torch.tensor([tokenizer.encode(PROMPT)])
    mask = torch.ones_like(ids)
    model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)  # warm-up
    rates, tokens = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, max_new_tokens=args.tokens, do_sample=False)
        tokens = out[0, ids.shape[1] :].tolist()
        rates.append(len(tokens) / (time.perf_counter() - start))
    return statistics.median(rates), tokens


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    ours, ours_tokens = time_ours(args)
    hf, hf_tokens = time_hf(args)
    same = sum(a == b for a, b in zip(ours_tokens, hf_tokens, strict=False))
    print(f"{args.dtype}, {torch.get_num_threads()} threads, {args.tokens} tokens")
    print(f"ours {ours:.1f} tok/s  hf generate {hf:.1f} tok/s  ratio {ours / hf:.2f}")
    print(f"identical tokens: {same}/{len(hf_tokens)}")
    return {"ours_tok_s": ours, "hf_tok_s": hf, "ratio": ours / hf}


if __name__ == "__main__":
    main()
