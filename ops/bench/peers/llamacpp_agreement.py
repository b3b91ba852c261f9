"""Greedy agreement of our Q4_1 path with llama.cpp's on the same GGUF file (issue 23).

    python ops/bench/peers/llamacpp_agreement.py [--tokens 64] [--threads 2] \
        [--out ops/bench/results/llamacpp_agreement.json]

Twenty fixed chat prompts are encoded once (our tokenizer, the model's chat template) and sent
as the same token ids to both: llama.cpp's ``llama-server`` (built by ``setup_llamacpp.sh``,
one slot, each prompt on its own through ``/completion`` with ``temperature 0``, ``top_k 1``,
``cache_prompt false``) and our engine in this process with ``--quantization gguf`` (every
prompt in one continuous batch, greedy). Both stop at EOS or after ``--tokens`` tokens: not
``ignore_eos``, which the two mean differently (llama.cpp masks EOS, so it takes the second
token where ours emits EOS and goes on; a first run diverged there, at EOS, on 10 of 20
prompts with llama.cpp on F32 weights). An EOS on one side only is a divergence.
Per prompt the report gives the first position where the two differ
(None: all equal) and, there, each side's two most likely tokens with their logprobs (ours
from the sampler's logprobs, llama.cpp's from ``n_probs``), which tells a near tie from a
real disagreement. After a divergence the two continue from different text, so the matching
total counts only the common prefixes. ``--llamacpp-f32`` gives llama.cpp an F32 copy of the
file instead (the same dequantized weights, none of its Q8_1 activation rounding), ours still
on the file's blocks: that separates our kernels' rounding from llama.cpp's quantized dots.
``--quant-activations int8`` runs ours with 8-bit activations as llama.cpp's, one prompt at a
time (they apply to steps of 1-2 rows); ``--no-repack`` passes llama-server that flag.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from ops.bench.common import write_report
from ops.bench.peers.llamacpp import DEFAULT_SERVER, stop, wait_healthy

Top = list[tuple[int, float]]  # (token id, logprob), most likely first

PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in two sentences.",
    "List three uses of a paperclip.",
    "Tell me a short story about a lighthouse keeper.",
    "How do I reverse a list in Python?",
    "What is 17 times 23?",
    "Describe the colour blue to someone who cannot see.",
    "Give me a recipe for pancakes.",
    "Why is the sky blue?",
    "Translate 'good morning' into Spanish and German.",
    "What are the planets of the solar system?",
    "Write a limerick about a cat.",
    "Summarize the plot of Romeo and Juliet.",
    "What does a compiler do?",
    "Name five fruits that are red.",
    "How many legs does a spider have?",
    "Write a polite email declining a meeting.",
    "What is the difference between weather and climate?",
    "Suggest a name for a small bakery.",
)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where ``a`` and ``b`` differ (a length difference counts); None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(
    ours: Sequence[list[int]],
    theirs: Sequence[list[int]],
    ours_top: Sequence[list[Top]],
    theirs_top: Sequence[list[Top]],
) -> dict[str, Any]:
    """Per prompt: the first divergence, the common prefix and both sides' top tokens there;
    totals over all prompts."""
    rows = []
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        at = first_divergence(a, b)
        prefix = min(len(a), len(b)) if at is None else at
        row: dict[str, Any] = {"prompt": i, "first_divergence": at, "common_prefix": prefix}
        if at is not None:
            row["ours_top"] = ours_top[i][at] if at < len(ours_top[i]) else []
            row["llamacpp_top"] = theirs_top[i][at] if at < len(theirs_top[i]) else []
        rows.append(row)
    total = sum(max(len(a), len(b)) for a, b in zip(ours, theirs, strict=True))
    matching = sum(r["common_prefix"] for r in rows)
    return {
        "prompts": rows,
        "identical_prompts": sum(r["first_divergence"] is None for r in rows),
        "num_prompts": len(rows),
        "matching_tokens": matching,
        "total_tokens": total,
        "agreement": matching / total if total else 1.0,
    }


def llama_body(prompt_ids: Sequence[int], tokens: int, n_probs: int) -> dict[str, Any]:
    """A greedy ``/completion`` of at most ``tokens`` tokens (EOS stops it) on token ids, with
    token ids and the top ``n_probs`` logprobs back."""
    return {
        "prompt": list(prompt_ids),
        "n_predict": tokens,
        "temperature": 0.0,
        "top_k": 1,
        "cache_prompt": False,
        "return_tokens": True,
        "n_probs": n_probs,
        "stream": False,
    }


def parse_llama(response: dict[str, Any]) -> tuple[list[int], list[Top]]:
    """Token ids and per-token tops of a ``/completion`` response. Newer servers give
    ``top_logprobs`` (``id``, ``logprob``); older ones ``probs`` (``id``, ``prob``)."""
    tops: list[Top] = []
    for entry in response.get("completion_probabilities") or []:
        items = entry.get("top_logprobs") or entry.get("top_probs") or entry.get("probs") or []
        top: Top = []
        for item in items:
            if "logprob" in item:
                top.append((int(item["id"]), float(item["logprob"])))
            elif "prob" in item:
                top.append((int(item["id"]), math.log(max(float(item["prob"]), 1e-30))))
        tops.append(top)
    return [int(t) for t in response.get("tokens") or []], tops


def server_command(args: argparse.Namespace) -> list[str]:
    return [
        str(args.server),
        *("--model", str(args.llamacpp_gguf), "--host", "127.0.0.1", "--port", str(args.port)),
        *("--parallel", "1", "--ctx-size", "2048", "--threads", str(args.threads)),
        *("--threads-batch", str(args.threads), "--cache-ram", "0", "--no-webui"),
        *(["--no-repack"] if args.no_repack else []),
    ]


def run_llamacpp(
    args: argparse.Namespace, prompts: Sequence[list[int]]
) -> tuple[list[list[int]], list[list[Top]], str]:
    """Every prompt through llama-server, one at a time; its ids, tops and the server log."""
    log = tempfile.NamedTemporaryFile(prefix="llama-agree-", suffix=".log", delete=False)
    proc = subprocess.Popen(server_command(args), stdout=log, stderr=subprocess.STDOUT)
    ids, tops = [], []
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{args.port}", timeout=600.0) as client:
            wait_healthy(client, proc, args.startup_timeout_s)
            for prompt in prompts:
                body = llama_body(prompt, args.tokens, args.top)
                response = client.post("/completion", json=body)
                response.raise_for_status()
                got, top = parse_llama(response.json())
                ids.append(got)
                tops.append(top)
    finally:
        stop(proc)
    return ids, tops, log.name


def run_ours(
    args: argparse.Namespace, texts: Sequence[str]
) -> tuple[list[list[int]], list[list[int]], list[list[Top]]]:
    """The prompts' ids (chat template) and our greedy ids and tops, all in one batch (with
    8-bit activations one at a time)."""
    from worker.engine.config import EngineConfig
    from worker.engine.llm_engine import LLMEngine
    from worker.engine.sampling_params import SamplingParams

    config = EngineConfig(
        model=str(args.gguf),
        device="cpu",
        quantization="gguf",
        quant_activations=args.quant_activations,
        num_threads=args.threads,
    )
    engine = LLMEngine(config)
    prompts = [engine.encode([{"role": "user", "content": t}]) for t in texts]
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, logprobs=args.top)
    ids: dict[str, list[int]] = {}
    tops: dict[str, list[Top]] = {}
    alone = args.quant_activations != "float32"
    for i, prompt in enumerate(prompts):
        ids[str(i)], tops[str(i)] = [], []
        engine.add_prompt(str(i), params=params, prompt_token_ids=prompt)
        while engine.has_unfinished() and (alone or i == len(prompts) - 1):
            for out in engine.step():
                ids[out.request_id].extend(out.new_token_ids)
                tops[out.request_id].extend([list(lp.top) for lp in out.logprobs])
    keys = [str(i) for i in range(len(prompts))]
    return prompts, [ids[k] for k in keys], [tops[k] for k in keys]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    from worker.models.loader import bundled_model_path

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gguf", type=Path, default=None, help="default: the bundled Q4_1 file")
    p.add_argument("--server", type=Path, default=DEFAULT_SERVER)
    p.add_argument(
        "--llamacpp-f32",
        action="store_true",
        help="llama.cpp on an F32 copy of the file (llama-quantize; export_hf.py), ours as before",
    )
    p.add_argument("--quant-activations", default="float32", choices=["float32", "int8"])
    p.add_argument("--no-repack", action="store_true", help="llama-server --no-repack")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--top", type=int, default=2, help="top tokens kept at each position")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--port", type=int, default=18478)
    p.add_argument("--startup-timeout-s", type=float, default=180.0)
    p.add_argument("--out", type=Path, default=Path("ops/bench/results/llamacpp_agreement.json"))
    args = p.parse_args(argv)
    args.gguf = args.gguf or bundled_model_path()
    args.llamacpp_gguf = args.gguf
    if args.llamacpp_f32:
        from ops.bench.peers.export_hf import export_gguf_f32

        args.llamacpp_gguf = export_gguf_f32(args.server.with_name("llama-quantize"), args.gguf)
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if not args.server.exists():
        raise SystemExit(f"{args.server} missing: run bash ops/bench/peers/setup_llamacpp.sh")
    prompts, ours, ours_top = run_ours(args, PROMPTS)
    theirs, theirs_top, log = run_llamacpp(args, prompts)
    report = compare(ours, theirs, ours_top, theirs_top)
    report |= {"gguf": str(args.gguf), "llamacpp_gguf": str(args.llamacpp_gguf)}
    report |= {"tokens": args.tokens, "server_log": log}
    report["prompt_ids"] = prompts
    report["ours"], report["llamacpp"] = ours, theirs
    for row in report["prompts"]:
        print(
            f"prompt {row['prompt']:2d}: first divergence {row['first_divergence']},"
            f" ours top {row.get('ours_top')}, llama.cpp top {row.get('llamacpp_top')}"
        )
    print(
        f"identical {report['identical_prompts']}/{report['num_prompts']} prompts, common"
        f" prefixes {report['matching_tokens']}/{report['total_tokens']} tokens"
    )
    write_report(report, args.out)
    return report


if __name__ == "__main__":
    main()
