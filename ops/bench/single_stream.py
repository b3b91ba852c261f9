"""Single-stream decode: one request, forced length, our engine against Hugging Face ``generate``.

    python ops/bench/single_stream.py [--tokens 128] [--dtype float32|bfloat16] [--repeats 3]
    python ops/bench/single_stream.py --quantization none gguf int8 --prompt-tokens 32 --no-hf
    python ops/bench/single_stream.py --quantization gguf --no-hf --threads 1 --profile 25
    python ops/bench/single_stream.py --quantization gguf gguf+a8 --no-hf --threads 1

Both load the same weights (the bundled SmolLM2-135M unless ``--model``) in the same dtype and
thread count, generate greedily with EOS disabled, and report output tokens/s (median of
``--repeats``) and whether the token ids agree. ``--quantization`` runs ours once per mode
(EngineConfig.quantization; ``+a8`` adds ``--quant-activations int8``), one after another in
this process, so their ratio is measured side by side; each also reports CPU milliseconds per
token (``time.process_time``: all of this process's threads), which other processes on a shared
machine do not inflate.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

# Run as a script, this folder is sys.path[0] and its kernels.py would shadow the kernels package.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

PROMPT = "Tell me a long story about a lift that never stops."
FILLER = " It rose past the roof, the clouds and the birds, and still the numbers climbed."


def prompt_of(args: argparse.Namespace, tokenizer: Any) -> str:
    """PROMPT, or with ``--prompt-tokens N`` a text of about N tokens (the filler repeated)."""
    if not args.prompt_tokens:
        return PROMPT
    ids = tokenizer.encode(PROMPT + FILLER * args.prompt_tokens)[: args.prompt_tokens]
    return str(tokenizer.decode(ids))


def profile(engine: Any, prompt: str, params: Any, top: int) -> None:
    """One more generation under cProfile, timed by this thread's CPU clock (other processes on
    a shared machine do not enter it); the ``top`` functions by their own time."""
    import cProfile
    import pstats

    profiler = cProfile.Profile(time.thread_time)
    profiler.runcall(engine.generate, [prompt], params)
    stats = pstats.Stats(profiler).sort_stats("tottime")
    print(f"cProfile of {params.max_tokens} tokens, CPU seconds by own time:")
    stats.print_stats(top)


def time_ours(args: argparse.Namespace, quantization: str) -> dict[str, Any]:
    from worker.engine.config import EngineConfig
    from worker.engine.llm_engine import LLMEngine
    from worker.engine.sampling_params import SamplingParams

    mode, _, a8 = quantization.partition("+")
    config = EngineConfig(
        model=args.model,
        device="cpu",
        dtype=args.dtype,
        quantization=mode,  # type: ignore[arg-type]
        quant_activations="int8" if a8 == "a8" else "float32",
    )
    engine = LLMEngine(config)
    prompt = prompt_of(args, engine.tokenizer)
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=4))  # warm-up
    rates, cpu_ms, tokens = [], [], []
    for _ in range(args.repeats):
        start, cpu = time.perf_counter(), time.process_time()
        tokens = list(engine.generate([prompt], params)[0].token_ids)
        cpu_ms.append((time.process_time() - cpu) * 1e3 / len(tokens))
        rates.append(len(tokens) / (time.perf_counter() - start))
    if args.profile:
        profile(engine, prompt, params, args.profile)
    return {
        "tok_s": statistics.median(rates),
        "cpu_ms_per_token": statistics.median(cpu_ms),
        "tokens": tokens,
        "prompt_tokens": len(engine.encode(prompt)),
        "weight_mb": resident_weight_bytes(engine.runner.model) / 1e6,
    }


def resident_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights the model holds, each tensor once: parameters, oneDNN-packed weights and
    the plain copies `PackedLinear` keeps for the C++ kernel, quantized weights."""
    from worker.models.cpu_linear import PackedLinear
    from worker.models.quant import QuantWeight

    tensors = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    for m in model.modules():
        held = []
        if isinstance(m, PackedLinear):
            held = [m.packed, m.weight]
        elif isinstance(m, QuantWeight):
            held = [m.data, m.scale]
        for t in held:
            if t is not None:
                tensors[id(t) if t.is_mkldnn else t.data_ptr()] = t.numel() * t.element_size()
    return sum(tensors.values())


def time_hf(args: argparse.Namespace) -> tuple[float, list[int]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from worker.models.loader import resolve_model_dir

    model_dir = resolve_model_dir(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, args.dtype))
    model.eval().generation_config.eos_token_id = None  # forced length, as ignore_eos
    ids = torch.tensor([tokenizer.encode(prompt_of(args, tokenizer))])
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
    p.add_argument("--prompt-tokens", type=int, default=0, help="default: the short PROMPT")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument(
        "--quantization",
        nargs="+",
        default=["auto"],
        help="ours, once per mode (gguf+a8: with 8-bit activations)",
    )
    p.add_argument("--no-hf", action="store_true", help="leave Hugging Face generate out")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--profile", type=int, default=0, help="cProfile one more run: top N")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    ours = {mode: time_ours(args, mode) for mode in args.quantization}
    print(f"{args.dtype}, {torch.get_num_threads()} threads, {args.tokens} tokens")
    first = next(iter(ours.values()))
    report: dict[str, float] = {}
    for mode, r in ours.items():
        same = sum(a == b for a, b in zip(r["tokens"], first["tokens"], strict=False))
        print(
            f"ours --quantization {mode}: {r['tok_s']:.1f} tok/s, {r['cpu_ms_per_token']:.1f} CPU"
            f" ms/token, weights {r['weight_mb']:.0f} MB, prompt {r['prompt_tokens']} tokens,"
            f" same tokens as {args.quantization[0]}: {same}/{len(first['tokens'])}"
        )
        report[f"ours_{mode}_tok_s"] = r["tok_s"]
        report[f"ours_{mode}_cpu_ms_per_token"] = r["cpu_ms_per_token"]
    if not args.no_hf:
        hf, hf_tokens = time_hf(args)
        same = sum(a == b for a, b in zip(first["tokens"], hf_tokens, strict=False))
        print(f"hf generate {hf:.1f} tok/s, ours/hf {first['tok_s'] / hf:.2f}")
        print(f"identical tokens ({args.quantization[0]} vs hf): {same}/{len(hf_tokens)}")
        report |= {"hf_tok_s": hf, "ratio": first["tok_s"] / hf}
    return report


if __name__ == "__main__":
    main()
