"""The 210 projections as the engine fuses them (30 x qkv 960 x 576, o 576 x 576, gate_up
3,072 x 576, down 576 x 1,536; Q4_1 blocks of random weights): `gguf_linear` on the file's layout against
`gguf_linear_kmajor` on the same blocks stored k-major, ms for the set, best of 5 alternated.
From the repository root: python ops/bench/results/kmajor-1207/ab_kernel.py THREADS"""

import sys
import time

import torch

sys.path.insert(0, ".")
from kernels import cpu_ops
from kernels import quant_reference as qr

Q4_1 = qr.Q4_1.type_id
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]


def blocks(n: int, k: int, g: torch.Generator) -> torch.Tensor:
    """Q4_1 blocks of N(0, 1) weights, quantized by the gguf package as llama.cpp does."""
    import gguf

    w = torch.randn(n, k, generator=g).numpy()
    return torch.from_numpy(gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_1))


def main() -> None:
    threads = int(sys.argv[1])
    torch.set_num_threads(threads)
    ops = cpu_ops.load()
    g = torch.Generator().manual_seed(0)
    weights = [blocks(n, k, g) for _ in range(30) for n, k in SHAPES]
    packed = [qr.pack_kmajor(w, Q4_1) for w in weights]
    for rows in [1, 4, 8, 12, 16, 24, 48]:
        xs = {k: torch.randn(rows, k, generator=g) for k in (576, 1536)}
        best = {"file": 1e9, "kmajor": 1e9}
        for _ in range(5):
            start = time.perf_counter()
            for w in weights:
                ops.gguf_linear(xs[w.shape[1] // 20 * 32], w, Q4_1, None)
            best["file"] = min(best["file"], time.perf_counter() - start)
            start = time.perf_counter()
            for p in packed:
                ops.gguf_linear_kmajor(xs[p.shape[1] // 20 * 32], p, Q4_1, None)
            best["kmajor"] = min(best["kmajor"], time.perf_counter() - start)
        print(
            f"threads {threads} rows {rows:2d}: file {best['file'] * 1e3:6.2f} ms  "
            f"k-major {best['kmajor'] * 1e3:6.2f} ms  ratio {best['file'] / best['kmajor']:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
