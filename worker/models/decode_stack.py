"""Every decoder layer of an all-decode CPU step in one C++ call (`kernels/cpu_decode_stack.cpp`).

The Python layers of a decode step make ~30 calls a layer around their kernels: module calls,
views, splits and the checks that pick a kernel. The stack calls the same kernels on the same
tensors in the same order from C++, so its hidden states are bit-identical to the layers'
(tested), with the GIL released for the whole step. On one thread of a Zen 5 EPYC a single-stream
token of SmolLM2-135M on its Q4_1 blocks went from 10.1-10.4 to 8.5-8.6 CPU ms, and a batch-1
step of the 16-layer host-overhead model from 1.07 to 0.51 ms (BENCHMARKS.md, issue 23's third
pass).

It is built once, at `install_kernels`, for a float32 Llama-family model whose every projection
is a `PackedLinear` (`skinny_linear` for few rows, oneDNN's packed GEMM past them, called
through the dispatcher as its Python path does) or a `QuantLinear` on our GGUF or int8 kernels,
and whose layers have the C++ kernels attached (Qwen3's q/k norms and their rotary by torch's
ops included); anything else (torch's own linears, another dtype) gets no stack. A step takes it
only where every row is one decode token, none is padding, and there are few enough rows that
each quantized projection's Python path would have called that same kernel (`max_rows`: from
`QuantWeight.gemm_min_rows` rows a quantized weight is dequantized into a GEMM, which the stack
does not do).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from worker.attention.metadata import KVCache
from worker.models.base import StepContext
from worker.models.cpu_kernels import KERNEL_CACHE_DTYPES
from worker.models.cpu_linear import SKINNY_MAX_ROWS, PackedLinear
from worker.models.quant_layers import QuantLinear
from worker.models.quant_paths import ANY_ROWS

if TYPE_CHECKING:
    from worker.attention import AttentionBackend
    from worker.models.llama import DecoderLayer, LlamaForCausalLM

# `DecodeStack`'s linear kinds (kernels/cpu_ops.h).
FLOAT32, GGUF, INT8, GGUF_PANELS, GGUF_KMAJOR = 0, 1, 2, 3, 4


class DecodeStack:
    """The C++ stack of a model's layers, and when a step may take it."""

    def __init__(self, stack: Any, max_rows: int, backend: AttentionBackend) -> None:
        self._stack = stack
        self.max_rows = max_rows  # up to which each projection's Python path calls what it does
        self._backend = backend
        self._caches: object = None  # the runner's cache list the stack holds (`_holds`)
        self._caches_taken = False

    def takes(self, num_tokens: int, ctx: StepContext) -> bool:
        """Whether this step can run here: all decodes, no padding, few rows, our backend."""
        meta = ctx.meta
        return (
            num_tokens <= self.max_rows
            and meta.num_decodes == num_tokens == meta.num_seqs
            and not meta.num_padding
            and ctx.backend is self._backend
            and self._holds(ctx.kv_caches)
        )

    def _holds(self, caches: Sequence[KVCache]) -> bool:
        """Whether the stack holds ``caches`` (the runner's list, given to it once): not where
        their dtype is one the kernels do not take."""
        if caches is not self._caches:
            self._caches = caches
            self._caches_taken = caches[0].k_cache.dtype in KERNEL_CACHE_DTYPES
            if self._caches_taken:
                self._stack.set_caches([kv.k_cache for kv in caches], [kv.v_cache for kv in caches])
        return self._caches_taken

    def __call__(
        self, hidden: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor], ctx: StepContext
    ) -> torch.Tensor:
        """The final (normed) hidden states of the step whose embeddings are ``hidden`` (T, H),
        which is used as the residual stream and overwritten."""
        meta = ctx.meta
        cos, sin = cos_sin
        return self._stack.forward(
            hidden, cos, sin, meta.slot_mapping, meta.block_tables, meta.seq_lens
        )


def install_decode_stack(model: nn.Module, ops: ModuleType, backend: AttentionBackend) -> bool:
    """Give a Llama-family ``model`` its stack (None where some part would not run on our
    kernels); whether it got one."""
    from worker.models.llama import LlamaForCausalLM

    if not isinstance(model, LlamaForCausalLM):
        return False
    model.decode_stack = _build(model, ops, backend)
    return model.decode_stack is not None


def _build(
    model: LlamaForCausalLM, ops: ModuleType, backend: AttentionBackend
) -> DecodeStack | None:
    c = model.config
    if not hasattr(ops, "DecodeStack") or model.norm.weight.dtype != torch.float32:
        return None
    layers = [cast("DecoderLayer", layer) for layer in model.layers]
    if not layers:
        return None
    stack = ops.DecodeStack(
        c.num_q_heads,
        c.num_kv_heads,
        c.head_size,
        c.rms_norm_eps,
        layers[0].self_attn.scale,
        model.norm.weight,
    )
    rows = []  # up to which each linear's Python path calls its kernel
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        if attn.cpu_ops is None or mlp.cpu_ops is None or layer.input_layernorm.cpu_ops is None:
            return None
        for linear in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj):
            rows.append(_add_linear(stack, linear, ops))
            if rows[-1] == 0:
                return None
        qk_norms = (attn.q_norm.weight, attn.k_norm.weight) if attn.q_norm and attn.k_norm else ()
        stack.add_layer(
            layer.input_layernorm.weight, layer.post_attention_layernorm.weight, *qk_norms
        )
    return DecodeStack(stack, min(rows), backend)


def _add_linear(stack: Any, linear: nn.Module, ops: ModuleType) -> int:
    """Add ``linear`` to ``stack`` as what its Python path calls; the rows up to which it does
    (0: it calls something else, e.g. another build's kernels, so no stack)."""
    if isinstance(linear, PackedLinear):  # its plain weight for few rows, if kept; else oneDNN
        if linear.skinny_ops not in (None, ops):
            return 0
        skinny = linear.weight if linear.skinny_ops is not None else None
        stack.add_linear(
            FLOAT32, skinny, bias=linear.bias, packed=linear.packed, skinny_rows=SKINNY_MAX_ROWS
        )
        return ANY_ROWS
    if isinstance(linear, QuantLinear) and linear.qweight.ops is ops:
        w = linear.qweight
        if w.type_id is None:
            stack.add_linear(INT8, w.data, scale=w.scale, bias=linear.bias)
        elif w.kmajor:  # exact x below the GEMM's rows
            stack.add_linear(GGUF_KMAJOR, w.data, format=w.type_id, bias=linear.bias)
            return w.gemm_min_rows - 1
        elif w.panels:  # x rounded to 8 bits up to a8_max_rows (bf16 GEMMs past them)
            stack.add_linear(GGUF_PANELS, w.data, format=w.type_id, bias=linear.bias)
            return w.a8_max_rows
        else:
            # skinny_rows: rows up to which it rounds x to 8 bits (`gguf_linear_q8`)
            stack.add_linear(
                GGUF, w.data, format=w.type_id, bias=linear.bias, skinny_rows=w.a8_max_rows
            )
        return max(w.gemm_min_rows - 1, w.a8_max_rows)
    return 0
