"""Our Llama-family decoder (Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3, SmolLM2) over a packed batch.

A `CausalLM` (worker/models/base.py): one packed step per forward, attention through the
`StepContext`; everything else is per-token and needs no notion of sequences.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

import torch
from torch import nn

from worker.models.base import CausalLM, StepContext, WeightTarget
from worker.models.config import ModelConfig
from worker.models.layers import RMSNorm, RotaryEmbedding, SwiGLU, apply_rotary, rotate

if TYPE_CHECKING:
    from worker.models.decode_stack import DecodeStack

__all__ = ["Attention", "LlamaForCausalLM", "StepContext"]

CosSin = tuple[torch.Tensor, torch.Tensor]


class Attention(nn.Module):
    cpu_ops: ModuleType | None = None  # as `RMSNorm.cpu_ops`: rotary in place
    gpu_ops: ModuleType | None = None  # as `RMSNorm.gpu_ops`: rotary in place

    def __init__(self, config: ModelConfig, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.num_q_heads = config.num_q_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_size = config.head_size
        self.q_size = config.num_q_heads * config.head_size
        self.kv_size = config.num_kv_heads * config.head_size
        self.scale = config.head_size**-0.5
        # q, k and v in one matmul: one GEMM launch instead of three per layer (90 fewer per step
        # on a 30-layer model, which is most of the per-step overhead on CPU decode).
        self.qkv_proj = nn.Linear(
            config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.qkv_bias
        )
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=config.o_bias)
        self.q_norm = RMSNorm(config.head_size, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_size, config.rms_norm_eps) if config.qk_norm else None

    def forward(self, hidden: torch.Tensor, cos_sin: CosSin, ctx: StepContext) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], -1)
        v = v.view(num_tokens, self.num_kv_heads, self.head_size)
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q.view(num_tokens, self.num_q_heads, self.head_size))
            k = self.k_norm(k.view(num_tokens, self.num_kv_heads, self.head_size))
            if self.gpu_ops is not None:
                self.gpu_ops.rotary_(q, k, *cos_sin)  # the norms' fresh outputs, in place
            else:
                q, k = apply_rotary(q, k, cos_sin)
        else:
            # q and k are adjacent in the fused projection: rotate them as one (T, Hq + Hkv, D)
            # view, half the elementwise calls of rotating each (60 fewer per step at 30 layers).
            qk = qkv[:, : self.q_size + self.kv_size].view(num_tokens, -1, self.head_size)
            if self.cpu_ops is not None and qkv.dtype == torch.float32:
                # In place: q and k stay strided views of qkv; the backends take strided rows.
                self.cpu_ops.rotary_(qk, *cos_sin)
            elif self.gpu_ops is None:
                qk = rotate(qk, cos_sin)
            q, k = qk.split([self.num_q_heads, self.num_kv_heads], 1)
            if self.gpu_ops is not None:
                # In place and one launch, like the C++ kernel; it takes q and k apart so that
                # Qwen3's normed heads (above) go through it too.
                self.gpu_ops.rotary_(q, k, *cos_sin)
        kv = ctx.kv_caches[self.layer_index]
        out = ctx.backend.forward(q, k, v, kv, ctx.meta, self.scale)
        return self.o_proj(out.reshape(num_tokens, self.q_size))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_index)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size, config.mlp_bias)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, hidden: torch.Tensor, residual: torch.Tensor | None, cos_sin: CosSin, ctx: StepContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mlp output, residual stream)``: the caller adds the two, fused into the next norm."""
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm.add_forward(hidden, residual)
        hidden = self.self_attn(hidden, cos_sin, ctx)
        hidden, residual = self.post_attention_layernorm.add_forward(hidden, residual)
        return self.mlp(hidden), residual


class LlamaForCausalLM(CausalLM):
    """Decoder + LM head; `forward` returns hidden states, `compute_logits` only where sampled."""

    # Every layer of an all-decode CPU step in one C++ call, bit-identical to the layers below;
    # set by the CPU backend's `install_kernels` where every projection runs on our kernels.
    decode_stack: DecodeStack | None = None

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_size, config.max_position, config.rope)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: StepContext
    ) -> torch.Tensor:
        """``input_ids``/``positions`` ``(T,)`` -> final hidden states ``(T, hidden)``."""
        hidden = self.embed_tokens(input_ids)
        cos_sin = self.rotary.lookup(positions)
        stack = self.decode_stack
        if stack is not None and stack.takes(hidden.shape[0], ctx):
            return stack(hidden, cos_sin, ctx)
        residual: torch.Tensor | None = None
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, cos_sin, ctx)
        if residual is None:  # a model without layers
            return self.norm(hidden)
        return self.norm.add_forward(hidden, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits in float32 for the rows that sample this step (not every prompt token)."""
        return self.lm_head(hidden).float()

    def init_buffers(self) -> None:
        c = self.config
        with torch.device(self.embed_tokens.weight.device):  # computed there, as at load before
            self.rotary = RotaryEmbedding(c.head_size, c.max_position, c.rope)

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def weight_target(self, checkpoint_name: str) -> WeightTarget | None:
        """HF's separate q/k/v and gate/up projections fill row ranges of our fused ones."""
        name = checkpoint_name.removeprefix("model.")
        c = self.config
        q, kv = c.num_q_heads * c.head_size, c.num_kv_heads * c.head_size
        inter = c.intermediate_size
        fused = {
            "self_attn.q_proj.": ("self_attn.qkv_proj.", 0, q),
            "self_attn.k_proj.": ("self_attn.qkv_proj.", q, q + kv),
            "self_attn.v_proj.": ("self_attn.qkv_proj.", q + kv, q + 2 * kv),
            "mlp.gate_proj.": ("mlp.gate_up_proj.", 0, inter),
            "mlp.up_proj.": ("mlp.gate_up_proj.", inter, 2 * inter),
        }
        for hf_part, (ours, start, end) in fused.items():
            if hf_part in name:
                return WeightTarget(name.replace(hf_part, ours), start, end)
        if "rotary_emb" in name:
            return None
        if name == "lm_head.weight" and c.tie_word_embeddings:
            return None
        return WeightTarget(name)
