"""1 thread, from the repository root: python ops/bench/results/amx-split-1207/micro_kmajor.py
Our exact Q4_1 linear (ops.gguf_linear: register kernels below 10 rows, the tile from 10) against
micro_kmajor.cpp (columns in lanes over blocks stored k-major) on one weight, in cache, and the
fp32 matmul on the dequantized weight, best of 3 alternated rounds. Then `--model`: all 210
projections of SmolLM2-135M's 30 layers in their shapes (random Q4_1 blocks, 66 MB, from L3 or
memory as in a decode step), ms for the set, alternated, best of 5."""

import functools
import os
import sys
import time

import torch
from torch.utils.cpp_extension import load

sys.path.insert(0, ".")
from kernels import cpu_ops
from kernels import quant_reference as qr

Q4_1 = 3  # GGML's type id
PREFETCH_BLOCKS = int(os.environ.get("KPREFETCH", "4"))  # 640-byte blocks ahead; 0: none
HERE = os.path.dirname(os.path.abspath(__file__))


def q4_1_blocks(n: int, k: int, g: torch.Generator) -> torch.Tensor:
    nb = k // 32
    b = torch.randint(0, 256, (n, nb, 20), dtype=torch.uint8, generator=g)
    d = (torch.rand(n, nb, generator=g) * 0.01 + 0.001).half()
    m = (-torch.rand(n, nb, generator=g) * 0.05).half()
    b[:, :, 0:2] = d.view(torch.uint8).view(n, nb, 2)
    b[:, :, 2:4] = m.view(torch.uint8).view(n, nb, 2)
    return b.reshape(n, nb * 20).contiguous()


def rate(fn, flop: float, seconds: float = 0.3) -> float:
    fn()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        count += 1
    return flop * count / (time.perf_counter() - start) / 1e9


SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]


def whole_model(ops, km, g: torch.Generator) -> None:
    weights = [q4_1_blocks(n, k, g) for _ in range(30) for n, k in SHAPES]
    panels = [km.repack(w) for w in weights]
    panels16 = [qr.pack_panels(w, Q4_1, 16) for w in weights]
    for rows in [1, 4, 8, 12, 16, 24]:
        xs = {k: torch.randn(rows, k, generator=g) for k in (576, 1536)}

        def ours(xs: dict[int, torch.Tensor] = xs) -> None:
            for w in weights:
                ops.gguf_linear(xs[w.shape[1] // 20 * 32], w, Q4_1, None)

        def kmajor(xs: dict[int, torch.Tensor] = xs) -> None:
            for p in panels:
                km.linear(xs[p.shape[1] * 32], p)

        def panels_16(xs: dict[int, torch.Tensor] = xs) -> None:
            for p in panels16:
                km.linear_panels(xs[p.shape[1] // 20 * 32], p)

        best = {"ours": 1e9, "kmajor": 1e9, "panels16": 1e9}
        for _ in range(5):
            for name, fn in (("ours", ours), ("kmajor", kmajor), ("panels16", panels_16)):
                start = time.perf_counter()
                fn()
                best[name] = min(best[name], (time.perf_counter() - start) * 1e3)
        print(
            f"210 projections, rows {rows:2d}: ours {best['ours']:6.2f} ms  k-major "
            f"{best['kmajor']:6.2f} ms  16-row panels {best['panels16']:6.2f} ms  ours / k-major "
            f"{best['ours'] / best['kmajor']:.2f}  ours / panels "
            f"{best['ours'] / best['panels16']:.2f}",
            flush=True,
        )


def main() -> None:
    torch.set_num_threads(1)
    ops = cpu_ops.load()
    km = load(
        f"micro_kmajor_pf{PREFETCH_BLOCKS}",
        [os.path.join(HERE, "micro_kmajor.cpp")],
        extra_cflags=["-O3", "-march=native", f"-DKPREFETCH={PREFETCH_BLOCKS}"],
        verbose=False,
    )
    g = torch.Generator().manual_seed(0)
    if "--model" in sys.argv:
        whole_model(ops, km, g)
        return
    rounds = 3
    for n, k in [(576, 576), (192, 576), (1536, 576), (576, 1536)]:
        w = q4_1_blocks(n, k, g)
        wf = qr.dequantize(w, Q4_1)
        panels = km.repack(w)
        panels16 = qr.pack_panels(w, Q4_1, 16)
        for rows in [1, 4, 8, 12, 16, 24, 48]:
            x = torch.randn(rows, k, generator=g)
            flop = 2.0 * rows * n * k
            ref = x.double() @ wf.double().T
            outs = (
                ops.gguf_linear(x, w, Q4_1, None),
                km.linear(x, panels),
                km.linear_panels(x, panels16),
            )
            for y in outs:
                err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
                assert err < 1e-5, err
            fns = {
                "ours": functools.partial(ops.gguf_linear, x, w, Q4_1, None),
                "kmajor": functools.partial(km.linear, x, panels),
                "panels16": functools.partial(km.linear_panels, x, panels16),
                "fp32": functools.partial(torch.mm, x, wf.T),
            }
            best = dict.fromkeys(fns, 0.0)
            for _ in range(rounds):
                for name, fn in fns.items():
                    best[name] = max(best[name], rate(fn, flop))
            print(
                f"{n}x{k} rows {rows:2d}: ours {best['ours']:6.1f}  k-major {best['kmajor']:6.1f}  "
                f"fp32 matmul {best['fp32']:6.1f} GFLOP/s  k-major / ours "
                f"{best['kmajor'] / best['ours']:.2f}  16-row panels {best['panels16']:6.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
