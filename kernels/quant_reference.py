"""Pure-torch references for the weight-only quantized linears (kernels/cpu_quant_linear.cpp).

GGUF block formats, as llama.cpp lays them out (one row of a weight = ``k / 32`` blocks, bytes
back to back; a weight of ``n`` rows is a ``(n, row_bytes)`` uint8 tensor):

- ``Q8_0`` (type 8): 34 bytes = fp16 scale ``d``, 32 int8 ``q``; ``w = d * q``. 8.5 bits/weight.
- ``Q4_0`` (type 2): 18 bytes = fp16 ``d``, 16 bytes of nibbles; ``w = d * (q - 8)``. 4.5 bits.
- ``Q4_1`` (type 3): 20 bytes = fp16 ``d``, fp16 min ``m``, 16 bytes; ``w = d * q + m``. 5 bits.

In the 4-bit formats byte ``j`` of a block holds element ``j`` in its low nibble and element
``j + 16`` in its high one. Every format needs ``k`` to be a multiple of 32.

``int8``: per-output-channel symmetric int8 made from float weights at load, ``w = s[o] * q``,
``s[o] = max|W[o]| / 127``; any ``k``.

8-bit activations (``--quant-activations int8``, kernels/cpu_gguf_q8.cpp): each 32-value block
of a row of ``x`` becomes ``a = round(x / dx)``, ``dx = max|x| / 127``, as llama.cpp's Q8_1
does; a block's product is then ``d * dx * sum(q * a) + c * dx * sum(a)`` with the weight's
codes ``q`` and offset ``c`` (`weight_codes`): integer dot products, not float ones.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

BLOCK = 32  # weights per GGUF block, every format here


class BlockFormat(NamedTuple):
    name: str
    type_id: int  # GGML's type number (gguf.GGMLQuantizationType)
    block_bytes: int
    head_bytes: int  # before the codes: d (fp16), and Q4_1's m (fp16)


Q4_0 = BlockFormat("Q4_0", 2, 18, 2)
Q4_1 = BlockFormat("Q4_1", 3, 20, 4)
Q8_0 = BlockFormat("Q8_0", 8, 34, 2)
FORMATS = {f.type_id: f for f in (Q4_0, Q4_1, Q8_0)}


def block_format(type_id: int) -> BlockFormat:
    """The format of GGML type ``type_id``; ValueError naming the ones we run otherwise."""
    if type_id not in FORMATS:
        names = ", ".join(f.name for f in FORMATS.values())
        raise ValueError(f"GGML type {type_id} has no kernel here (we run {names})")
    return FORMATS[type_id]


def in_features(blocks: torch.Tensor, type_id: int) -> int:
    """``k`` of a ``(n, row_bytes)`` block tensor."""
    fmt = block_format(type_id)
    if blocks.shape[-1] % fmt.block_bytes:
        raise ValueError(f"{fmt.name} rows are whole {fmt.block_bytes}-byte blocks")
    return blocks.shape[-1] // fmt.block_bytes * BLOCK


def _fp16(raw: torch.Tensor) -> torch.Tensor:
    """Two uint8 columns (little-endian) as one float32 column."""
    return raw.contiguous().view(torch.float16).float()


def dequantize(blocks: torch.Tensor, type_id: int) -> torch.Tensor:
    """Float32 ``(n, k)`` weights of GGUF blocks ``(n, row_bytes)`` uint8."""
    q, d, c = weight_codes(blocks, type_id)
    if type_id == Q4_0.type_id:
        w = d[..., None] * (q - 8.0)  # as llama.cpp rounds it: one product, not d * q - 8 d
    elif type_id == Q4_1.type_id:
        w = d[..., None] * q + c[..., None]
    else:
        w = d[..., None] * q
    return w.reshape(blocks.shape[0], -1)


def weight_codes(
    blocks: torch.Tensor, type_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GGUF blocks as ``w = d * q + c`` per block: codes ``q`` ``(n, nb, 32)``, scales ``d`` and
    offsets ``c`` ``(n, nb)``, all float32 (the codes are small integers)."""
    fmt = block_format(type_id)
    n = blocks.shape[0]
    b = blocks.reshape(n, in_features(blocks, type_id) // BLOCK, fmt.block_bytes)
    d = _fp16(b[..., 0:2])[..., 0]
    codes = b[..., fmt.head_bytes :]
    if fmt is Q8_0:
        return codes.contiguous().view(torch.int8).float(), d, torch.zeros_like(d)
    q = torch.cat((codes & 0x0F, codes >> 4), dim=-1).float()
    return q, d, _fp16(b[..., 2:4])[..., 0] if fmt is Q4_1 else -8.0 * d


def pack_panels(blocks: torch.Tensor, type_id: int, rows: int) -> torch.Tensor:
    """GGUF blocks ``(n, row_bytes)`` stored as panels of ``rows`` weight rows, the same shape
    and bytes: per panel and block, the rows' code words (4 bytes) one word index after another
    (word g of every row, then word g + 1), then the rows' heads. What the 8-bit GEMM
    (kernels/cpu_q8_gemm.h) multiplies, one weight row a vector lane, read without the per-call
    transpose the file's layout needs. ``n`` a multiple of ``rows``."""
    fmt = block_format(type_id)
    n = blocks.shape[0]
    if n % rows:
        raise ValueError(f"{n} weight rows are not whole panels of {rows}")
    head, words = fmt.head_bytes, (fmt.block_bytes - fmt.head_bytes) // 4  # 4-byte code words
    nb = in_features(blocks, type_id) // BLOCK
    b = blocks.reshape(n // rows, rows, nb, fmt.block_bytes)
    codes = b[..., head:].reshape(n // rows, rows, nb, words, 4).permute(0, 2, 3, 1, 4)
    heads = b[..., :head].permute(0, 2, 1, 3)
    parts = (codes.reshape(n // rows, nb, -1), heads.reshape(n // rows, nb, -1))
    return torch.cat(parts, dim=-1).reshape(blocks.shape).contiguous()


KMAJOR_COLS = 32  # weight rows (output columns) a group of blocks stored k-major


def pack_kmajor(blocks: torch.Tensor, type_id: int) -> torch.Tensor:
    """GGUF blocks ``(n, row_bytes)`` stored k-major, the same shape and bytes: per group of 32
    weight rows and block, the rows' 32 ``d`` (fp16), then Q4_1's 32 ``m``, then for each of the
    block's 32 elements one line of the rows' codes: 16 bytes for Q4_0 and Q4_1 (row ``c``'s in
    byte ``c % 16``, low nibble for ``c < 16``, high for ``c >= 16``), 32 for Q8_0 (row ``c``'s
    in byte ``c``). What kernels/cpu_gguf_kmajor.cpp reads, one weight row a vector lane. ``n`` a
    multiple of 32."""
    fmt = block_format(type_id)
    n = blocks.shape[0]
    if n % KMAJOR_COLS:
        raise ValueError(f"{n} weight rows are not whole groups of {KMAJOR_COLS}")
    nb = in_features(blocks, type_id) // BLOCK
    b = blocks.reshape(n // KMAJOR_COLS, KMAJOR_COLS, nb, fmt.block_bytes).permute(0, 2, 1, 3)
    # (groups, nb, 32 rows, bytes): each fp16 field of the head for all rows, then the lines
    heads = b[..., : fmt.head_bytes].unflatten(-1, (-1, 2)).transpose(2, 3).flatten(2)
    qs = b[..., fmt.head_bytes :]
    if fmt is Q8_0:
        lines = qs.transpose(2, 3)  # (groups, nb, 32 elements, 32 rows)
    else:
        codes = torch.cat((qs & 0x0F, qs >> 4), dim=-1)  # (groups, nb, 32 rows, 32 elements)
        half = KMAJOR_COLS // 2
        lines = (codes[:, :, :half] | (codes[:, :, half:] << 4)).transpose(2, 3)
    return torch.cat((heads, lines.flatten(2)), dim=-1).reshape(blocks.shape).contiguous()


def unpack_kmajor(packed: torch.Tensor, type_id: int) -> torch.Tensor:
    """The file's layout of blocks that `pack_kmajor` stored k-major."""
    fmt = block_format(type_id)
    n = packed.shape[0]
    nb = in_features(packed, type_id) // BLOCK
    cols, half, head = KMAJOR_COLS, KMAJOR_COLS // 2, fmt.head_bytes
    p = packed.reshape(n // cols, nb, cols * fmt.block_bytes)
    heads = p[..., : cols * head].unflatten(-1, (head // 2, cols, 2)).transpose(2, 3)
    lines = p[..., cols * head :].reshape(n // cols, nb, BLOCK, -1).transpose(2, 3)
    if fmt is Q8_0:
        qs = lines  # (groups, nb, 32 rows, 32 elements)
    else:
        codes = torch.cat((lines & 0x0F, lines >> 4), dim=2)  # (groups, nb, 32 rows, 32)
        qs = codes[..., :half] | (codes[..., half:] << 4)
    b = torch.cat((heads.flatten(3), qs), dim=-1).permute(0, 2, 1, 3)  # (groups, 32 rows, nb, B)
    return b.reshape(packed.shape).contiguous()


def kmajor_rows_of(packed: torch.Tensor, type_id: int, index: torch.Tensor) -> torch.Tensor:
    """Weight rows ``index`` (1-D) in the file's layout, read from blocks `pack_kmajor` stored:
    each row's bytes gathered where they lie. The reference of the C++ `gguf_kmajor_rows`, which
    a tied embedding's lookup runs: this took 0.45 ms for 64 rows of the bundled Q8_0 embedding
    and 4.2 ms for 512, where the file's layout indexes them in 0.02 and 0.35 (1 thread, Zen 5,
    2026-12-07)."""
    fmt = block_format(type_id)
    cols, head, nb = KMAJOR_COLS, fmt.head_bytes, in_features(packed, type_id) // BLOCK
    col = index % cols
    where = kmajor_offsets(fmt)[col][:, None, :]  # (rows, 1, head + 32): in a group-block
    groups = packed.reshape(-1, nb, cols * fmt.block_bytes)
    got = groups[(index // cols)[:, None, None], torch.arange(nb)[:, None], where]
    heads, codes = got[..., :head], got[..., head:]  # (rows, nb, head), (rows, nb, 32)
    if fmt is not Q8_0:  # element k's nibble, from line k; the file's byte j holds j and j + 16
        nibbles = (codes >> (4 * (col >= cols // 2))[:, None, None]) & 0x0F
        codes = nibbles[..., : BLOCK // 2] | (nibbles[..., BLOCK // 2 :] << 4)
    return torch.cat((heads, codes), dim=-1).reshape(len(index), -1)


def kmajor_offsets(fmt: BlockFormat) -> torch.Tensor:
    """``(32, head_bytes + 32)``: for each column of a group, the offsets in a group-block that
    `pack_kmajor` wrote of its head's bytes and of the line byte holding each element's code."""
    cols, head = KMAJOR_COLS, fmt.head_bytes
    col = torch.arange(cols)[:, None]
    field = torch.arange(head // 2).repeat_interleave(2) * (2 * cols)  # d, then Q4_1's m
    heads = field + 2 * col + torch.arange(2).repeat(head // 2)
    line = cols // 2 if fmt is not Q8_0 else cols  # a line's bytes
    codes = cols * head + torch.arange(BLOCK) * line + col % line
    return torch.cat((heads, codes), dim=1)


def unpack_panels(panels: torch.Tensor, type_id: int, rows: int) -> torch.Tensor:
    """The file's layout of blocks that `pack_panels` stored as panels."""
    return panel_rows_of(panels, type_id, rows, torch.arange(panels.shape[0]))


def panel_rows_of(
    panels: torch.Tensor, type_id: int, rows: int, index: torch.Tensor
) -> torch.Tensor:
    """Weight rows ``index`` (1-D) in the file's layout, read from blocks `pack_panels` stored as
    panels of ``rows``: each row's code words and heads taken where they lie in its panel (a
    tied embedding's lookup reads a few rows so, no whole panel unpacked)."""
    fmt = block_format(type_id)
    n = panels.shape[0]
    head, words = fmt.head_bytes, (fmt.block_bytes - fmt.head_bytes) // 4
    nb = in_features(panels, type_id) // BLOCK
    p = panels.reshape(n // rows, nb, rows * fmt.block_bytes)
    codes = p[..., : rows * words * 4].reshape(n // rows, nb, words, rows, 4)
    heads = p[..., rows * words * 4 :].reshape(n // rows, nb, rows, head)
    panel, row = index // rows, index % rows
    picked = (heads[panel, :, row], codes[panel, :, :, row].reshape(len(index), nb, words * 4))
    return torch.cat(picked, dim=-1).reshape(len(index), -1)


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ``x`` ``(rows, k)`` as 8-bit codes per 32-value block: ``(a (rows, nb, 32), dx
    (rows, nb))``, float32; ``x ~ dx * a``. Rounding to nearest even, as the kernel's."""
    rows, k = x.shape
    xb = x.float().reshape(rows, k // BLOCK, BLOCK)
    dx = xb.abs().amax(dim=-1) / 127.0
    inverse = torch.where(dx > 0, 1.0 / dx, torch.zeros_like(dx))
    return torch.round(xb * inverse[..., None]).clamp_(-127, 127), dx


def quant_linear_q8(
    x: torch.Tensor, blocks: torch.Tensor, type_id: int, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ W.T + bias`` with ``x`` rounded to 8 bits a block (`quantize_activations`) and the
    products summed exactly (float64), in float32."""
    q, d, c = (t.double() for t in weight_codes(blocks, type_id))
    a, dx = (t.double() for t in quantize_activations(x))
    dots = torch.einsum("rbk,obk->rob", a, q)  # integers, exact in float64
    out = torch.einsum("rob,ob,rb->ro", dots, d, dx) + torch.einsum("ob,rb->ro", c, dx * a.sum(-1))
    out = out.float()
    return out if bias is None else out + bias


def quant_linear(
    x: torch.Tensor, blocks: torch.Tensor, type_id: int, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ dequantize(blocks).T + bias``, in float32."""
    out = x.float() @ dequantize(blocks, type_id).T
    return out if bias is None else out + bias


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int8 of ``weight`` ``(n, k)``: ``(q int8 (n, k), scale float32 (n,))``.

    An all-zero row gets scale 1 (its codes are 0 either way), so no division by zero.
    """
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale[:, None]


def int8_linear(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ (scale * q).T + bias``, in float32."""
    out = x.float() @ dequantize_int8(q, scale).T
    return out if bias is None else out + bias
