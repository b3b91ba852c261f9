"""Can AMX's bf16 tiles compute the default's exact Q4_1 prompt-chunk projections faster than
fp32? x @ W.T with W = d * q + m (Q4_1: q a 4-bit code, d and m fp16 per 32-block) equals
x @ (d * q).T plus each block's sum of x times m. d * q has at most 15 significant bits, so two
bf16 pieces hold it exactly; x splits into three bf16 pieces (24 bits). Five products of pieces
(the sixth, x's last piece by d * q's last, is below fp32's rounding), each exact in fp32 and
summed in fp32 by oneDNN under `fp32_precision = "bf16"`, give x @ (d * q).T to about fp32's
accuracy. Timed against the fp32 GEMM the default runs and a plain bf16 GEMM (one pass: the
floor of any bf16-tile method), over one layer of SmolLM2-135M's projection shapes, random
Q4_1-like weights. Usage: python split_bf16.py --rows 512 128 --threads 2 --repeats 30"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

# (out, in) of one SmolLM2-135M layer: q, k, v, o, gate, up, down.
SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
BLOCK = 32


def pieces(t: torch.Tensor, n: int) -> list[torch.Tensor]:
    """``t`` as ``n`` float32 tensors whose values are bf16's, largest first."""
    out, rest = [], t
    for _ in range(n):
        p = rest.bfloat16().float()
        out.append(p)
        rest = rest - p
    return out


def timed(fn: Callable[[], torch.Tensor], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3  # median, ms


def one_shape(rows: int, n: int, k: int, repeats: int) -> dict[str, float]:
    x = torch.randn(rows, k)
    q = torch.randint(0, 16, (n, k)).float()
    d = (torch.rand(n, k // BLOCK) * 0.01).half().float().repeat_interleave(BLOCK, 1)
    m = (-torch.rand(n, k // BLOCK) * 0.08).half().float()
    dq = d * q
    w = dq + m.repeat_interleave(BLOCK, 1)
    exact = x.double() @ w.double().T
    hi, lo = pieces(dq, 2)
    assert torch.equal(hi + lo, dq), "d * q must split into two bf16 pieces exactly"
    b5 = torch.cat([hi, lo, hi, lo, hi], 1)
    w16 = w.bfloat16()

    def split5() -> torch.Tensor:
        xh, xm, xl = pieces(x, 3)
        a5 = torch.cat([xh, xh, xm, xm, xl], 1)
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"
        try:
            y = F.linear(a5, b5)
        finally:
            torch.backends.mkldnn.matmul.fp32_precision = "ieee"
        return y.addmm_(x.view(rows, k // BLOCK, BLOCK).sum(-1), m.T)

    systems: dict[str, Callable[[], torch.Tensor]] = {
        "fp32": lambda: F.linear(x, w),
        "split5_bf16": split5,
        "bf16_one_pass": lambda: F.linear(x.bfloat16(), w16).float(),
    }
    row: dict[str, float] = {}
    for name, fn in systems.items():
        row[name + "_ms"] = timed(fn, repeats)
        err = (fn().double() - exact).abs().max() / exact.abs().max()
        row[name + "_err"] = float(err)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[512, 128])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    names = ("fp32", "split5_bf16", "bf16_one_pass")
    print(f"threads {args.threads}, median of {args.repeats}; ms, max error / max |exact|")
    for rows in args.rows:
        total = dict.fromkeys(names, 0.0)
        worst = dict.fromkeys(names, 0.0)
        for n, k in SHAPES:
            r = one_shape(rows, n, k, args.repeats)
            for s in names:
                total[s] += r[s + "_ms"]
                worst[s] = max(worst[s], r[s + "_err"])
        cells = "  ".join(f"{s} {total[s]:.3f} ms (err {worst[s]:.1e})" for s in names)
        ratio = total["fp32"] / total["split5_bf16"]
        print(f"rows {rows}: {cells}; fp32 / split5 {ratio:.2f}")


if __name__ == "__main__":
    main()
