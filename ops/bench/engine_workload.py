"""engine.py's seeded offline workload and the model work it stands for.

Request classes of a named mix (``WORKLOADS``) become requests of random ordinary token ids with
forced output lengths (``make_workload``); each system returns a `SystemResult` for them, whose
lengths ``check_lengths`` holds against the forced ones. FLOPs count the workload itself
(``useful_flops``), whatever a system recomputes or pads on top.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from worker.models.config import ModelConfig

WARMUP_PROMPT, WARMUP_OUTPUT = 16, 4


@dataclass(frozen=True)
class RequestClass:
    name: str
    prompt_len: tuple[int, int]  # inclusive range, before --scale
    output_len: tuple[int, int]
    weight: float  # share of the requests


# Weights solve 64 * E[prompt] ~ 16k and 64 * E[output] ~ 8.6k: 38/11/15 requests of each class
# expect 16.3k prompt and 8.7k output tokens.
CLASSES = (
    RequestClass("chat", (16, 64), (16, 64), 0.60),
    RequestClass("long-prompt", (512, 2048), (16, 64), 0.17),
    RequestClass("long-gen", (32, 64), (256, 640), 0.23),
)
# nano-vllm's bench.py: prompt and output lengths each uniform in 100-1024, EOS ignored.
NANO_VLLM = (RequestClass("nano-vllm", (100, 1024), (100, 1024), 1.0),)
WORKLOADS = {"mix": CLASSES, "nano-vllm": NANO_VLLM}


@dataclass(frozen=True)
class BenchRequest:
    request_id: str
    kind: str
    prompt_ids: tuple[int, ...]
    output_len: int  # forced: exactly this many tokens are generated


@dataclass
class SystemResult:
    name: str
    wall_s: float
    outputs: dict[str, list[int]]  # request id -> generated token ids (its forced length)
    extra: dict[str, Any] = field(default_factory=dict)


def class_counts(n: int, weights: Sequence[float]) -> list[int]:
    """Requests per class: largest remainder, so the mix is exact rather than sampled."""
    total = sum(weights)
    raw = [n * w / total for w in weights]
    counts = [int(r) for r in raw]
    by_remainder = sorted(range(len(raw)), key=lambda i: raw[i] - counts[i], reverse=True)
    for i in by_remainder[: n - sum(counts)]:
        counts[i] += 1
    return counts


def scaled_range(bounds: tuple[int, int], scale: float) -> tuple[int, int]:
    lo = max(1, round(bounds[0] * scale))
    return lo, max(lo, round(bounds[1] * scale))


def normal_token_ids(tokenizer: Any, vocab_size: int) -> list[int]:
    """Ids of ordinary tokens: in the model's vocab, not special, not added (chat markers)."""
    special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    return [t for t in range(min(len(tokenizer), vocab_size)) if t not in special]


def stratified(rng: random.Random, bounds: tuple[int, int], k: int) -> list[int]:
    """``k`` lengths, one from each of ``k`` equal slices of the range, shuffled: totals stay
    near their expectation whatever the seed (plain uniform draws of the 11 long prompts swing
    the prompt total by +-1.5k tokens)."""
    lo, hi = bounds
    span = hi - lo + 1
    values = [lo + int((j + rng.random()) * span / k) for j in range(k)]
    rng.shuffle(values)
    return values


def make_workload(
    n: int,
    seed: int,
    scale: float,
    token_ids: Sequence[int],
    classes: Sequence[RequestClass] = CLASSES,
) -> list[BenchRequest]:
    rng = random.Random(seed)
    counts = class_counts(n, [c.weight for c in classes])
    lengths = {
        c.name: list(
            zip(
                stratified(rng, scaled_range(c.prompt_len, scale), k),
                stratified(rng, scaled_range(c.output_len, scale), k),
                strict=True,
            )
        )
        for c, k in zip(classes, counts, strict=True)
    }
    kinds = [c.name for c, k in zip(classes, counts, strict=True) for _ in range(k)]
    rng.shuffle(kinds)
    requests = []
    for i, kind in enumerate(kinds):
        prompt_len, output_len = lengths[kind].pop()
        prompt = tuple(rng.choices(token_ids, k=prompt_len))
        requests.append(BenchRequest(f"r{i}", kind, prompt, output_len))
    return requests


def workload_totals(
    workload: Sequence[BenchRequest], classes: Sequence[RequestClass] = CLASSES
) -> dict[str, Any]:
    prompt = sum(len(r.prompt_ids) for r in workload)
    output = sum(r.output_len for r in workload)
    per_class = {c.name: sum(r.kind == c.name for r in workload) for c in classes}
    return {
        "num_requests": len(workload),
        "prompt_tokens": prompt,
        "output_tokens": output,
        "total_tokens": prompt + output,
        "requests_per_class": per_class,
        "max_prompt_len": max(len(r.prompt_ids) for r in workload),
        "max_output_len": max(r.output_len for r in workload),
        "prompt_lens": [len(r.prompt_ids) for r in workload],
        "output_lens": [r.output_len for r in workload],
    }


def warmup_prompt(token_ids: Sequence[int]) -> list[int]:
    return random.Random(-1).choices(token_ids, k=WARMUP_PROMPT)


def check_lengths(result: SystemResult, workload: Sequence[BenchRequest]) -> None:
    wrong = [
        (r.request_id, len(result.outputs.get(r.request_id, [])), r.output_len)
        for r in workload
        if len(result.outputs.get(r.request_id, [])) != r.output_len
    ]
    if wrong:
        raise RuntimeError(f"{result.name}: output lengths differ from forced ones: {wrong[:5]}")


# -- model work ------------------------------------------------------------------------------------


def non_embedding_params(mc: ModelConfig) -> int:
    h, d = mc.hidden_size, mc.head_size
    qkv = h * (mc.num_q_heads + 2 * mc.num_kv_heads) * d
    o = mc.num_q_heads * d * h
    mlp = 3 * h * mc.intermediate_size
    return mc.num_layers * (qkv + o + mlp + 2 * h) + h  # + the RMSNorm weights


def useful_flops(mc: ModelConfig, workload: Sequence[BenchRequest]) -> dict[str, float]:
    """FLOPs of the workload itself, whatever a system recomputes or pads on top."""
    # The last sampled token is never fed back: prompt + output - 1 tokens pass the layers.
    processed = [len(r.prompt_ids) + r.output_len - 1 for r in workload]
    sampled = sum(r.output_len for r in workload)
    linear = 2 * non_embedding_params(mc) * sum(processed)
    lm_head = 2 * mc.vocab_size * mc.hidden_size * sampled
    # QK^T and AV, 2 FLOPs per multiply-add each, over the t keys token t sees.
    attn_per_key = 4 * mc.num_layers * mc.num_q_heads * mc.head_size
    attention = attn_per_key * sum(t * (t + 1) // 2 for t in processed)
    return {
        "linear": float(linear),
        "lm_head": float(lm_head),
        "attention": float(attention),
        "total": float(linear + lm_head + attention),
    }
