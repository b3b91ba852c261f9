"""What 2 threads read streaming: torch.sum over 64 MB, bf16 and fp32, GB/s (best of 3 x 10)."""
import time

import torch

torch.set_num_threads(2)
for dtype in (torch.bfloat16, torch.float32):
    x = torch.ones((64 << 20) // torch.empty((), dtype=dtype).element_size(), dtype=dtype)
    best = 1e9
    for _ in range(3):
        x.sum()
        t = time.perf_counter()
        for _ in range(10):
            x.sum()
        best = min(best, (time.perf_counter() - t) / 10)
    print(f"{dtype}: {(64 << 20) / best / 1e9:.1f} GB/s")
