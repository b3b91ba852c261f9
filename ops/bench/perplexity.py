"""Perplexity of the bundled SmolLM2-135M per weight format, on one fixed ~10k-token text.

    python ops/bench/perplexity.py [--tokens 10240] [--window 512] [--out results/ppl.json]

The text is CPython's own pydoc topics (``pydoc_data.topics``, shipped with every Python 3.11:
English prose with code), its topics in sorted order, the first ``--tokens`` tokens. It is cut
into windows of ``--window`` tokens, each one prefill through our model (the engine's runner,
the C++ attention), and every token after a window's first is scored given the ones before it.

Formats: ``fp32`` (``--quantization none``: the file's blocks dequantized at load, so the
same weight values as ``q4_1``), ``q4_1`` (``gguf``: the file's own blocks), ``q8_0`` (the
fp32 weights quantized again to Q8_0 blocks by the gguf package), ``q4_1_a8`` (``gguf`` with
``--quant-activations int8``, here at every row count: every x rounded to 8 bits a block, as
llama.cpp does), ``q4_1_abf16`` (``gguf`` with ``--quant-activations bfloat16``: a window's 512
rows are past its row threshold, so every projection's x and weight are rounded to bf16; the
tied Q8_0 head stays exact, as in the engine) and ``int8`` (``int8``).
``--kv-cache-dtype bfloat16`` runs every format over a bf16 K/V cache (a window's prefill
attends to K/V read back from the cache, so the rounding counts).
The bundled file is the only copy of the model here: there is no original bf16 checkpoint, so
fp32 is the Q4_1 model's own values and every other format is measured against it.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, get_args

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from ops.bench.common import write_report
from worker.engine.config import CacheConfig, DtypeName, EngineConfig
from worker.engine.model_runner import ModelRunner
from worker.engine.scheduler_output import ScheduledSequence
from worker.models.base import CausalLM, StepContext
from worker.models.loader import load_model, load_tokenizer, resolve_model_dir

BLOCK = 16
FORMATS = ("fp32", "q4_1", "q4_1_a8", "q4_1_abf16", "q8_0", "int8")


def fixed_text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


def model_of(fmt: str, model_dir: Path) -> CausalLM:
    cpu = torch.device("cpu")
    mode = {"fp32": "none", "int8": "int8", "q8_0": "none"}.get(fmt, "gguf")
    activations = {"q4_1_a8": "int8", "q4_1_abf16": "bfloat16"}.get(fmt, "float32")
    model = load_model(model_dir, torch.float32, cpu, mode, None, activations)
    if fmt == "q8_0":
        requantize_q8_0(model)
    if fmt == "q4_1_a8":
        from worker.models.quant import QuantWeight

        for weight in model.modules():
            if isinstance(weight, QuantWeight):
                weight.a8_max_rows = 1 << 30  # every row, prefill windows too
    return model


def requantize_q8_0(model: CausalLM) -> None:
    """Every float projection (and the tied table) as Q8_0 blocks the gguf package makes."""
    import gguf

    from kernels import cpu_ops
    from worker.models.quant import QuantWeight, attach
    from worker.models.quant_loader import replace_weights

    q8 = gguf.GGMLQuantizationType.Q8_0
    weights = {
        name: QuantWeight(torch.from_numpy(gguf.quants.quantize(m.weight.detach().numpy(), q8)), 8)
        for name, m in model.named_modules()
        if type(m) is torch.nn.Linear and name != "lm_head"
    }
    table = model.get_submodule("embed_tokens").get_parameter("weight")
    weights["embed_tokens"] = QuantWeight(
        torch.from_numpy(gguf.quants.quantize(table.detach().numpy(), q8)), 8
    )
    replace_weights(model, weights)
    attach(model, cpu_ops.load())


@torch.inference_mode()
def window_nll(runner: ModelRunner, ids: list[int], name: str) -> tuple[float, int]:
    """Summed negative log-likelihood of ``ids[1:]`` given the tokens before each, one prefill."""
    blocks = tuple(range(-(-len(ids) // BLOCK)))
    step = runner.prepare([ScheduledSequence(name, tuple(ids), 0, blocks, True)])
    ctx = StepContext(meta=step.meta, backend=runner.backend, kv_caches=runner.kv_caches)
    hidden = runner.model(step.input_ids, step.positions, ctx)
    logits = runner.model.compute_logits(hidden[:-1])
    logp = torch.log_softmax(logits.float(), dim=-1)
    target = torch.tensor(ids[1:])
    nll = -logp.gather(1, target[:, None]).sum()
    runner.batch.forget(frozenset({name}))
    return float(nll), len(ids) - 1


def perplexity(
    fmt: str, model_dir: Path, windows: list[list[int]], kv_dtype: Any = "auto"
) -> dict[str, Any]:
    model = model_of(fmt, model_dir)
    blocks = -(-max(len(w) for w in windows) // BLOCK)
    cache = CacheConfig(block_size=BLOCK, num_blocks=blocks + 1, dtype=kv_dtype)
    config = EngineConfig(cache=cache)
    runner = ModelRunner(config, model, torch.device("cpu"))
    runner.backend.install_kernels(model, "auto")
    total, count = 0.0, 0
    for i, window in enumerate(windows):
        nll, n = window_nll(runner, window, f"{fmt}-{i}")
        total, count = total + nll, count + n
    return {"perplexity": math.exp(total / count), "scored_tokens": count}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=10240)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    p.add_argument("--kv-cache-dtype", default=CacheConfig.dtype, choices=get_args(DtypeName))
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    model_dir = resolve_model_dir(None)
    ids = load_tokenizer(model_dir).encode(fixed_text())[: args.tokens]
    windows = [ids[i : i + args.window] for i in range(0, len(ids), args.window)]
    windows = [w for w in windows if len(w) > 1]
    report: dict[str, Any] = {
        "tokens": len(ids),
        "window": args.window,
        "kv_cache_dtype": args.kv_cache_dtype,
        "formats": {},
    }
    for fmt in args.formats:
        report["formats"][fmt] = result = perplexity(fmt, model_dir, windows, args.kv_cache_dtype)
        base = report["formats"].get("fp32", result)["perplexity"]
        print(
            f"{fmt}: perplexity {result['perplexity']:.4f} over {result['scored_tokens']} tokens"
            f" ({result['perplexity'] / base - 1:+.2%} vs fp32)"
        )
    write_report(report, args.out)
    return report


if __name__ == "__main__":
    main()
