"""Every Triton kernel compiles for an H100/H200 (sm_90), though CI has no GPU.

The interpreter accepts code the compiler rejects (a helper that returned a ``tl.dtype`` passed
every interpreted test and failed on the first H200 run), so `kernels.compile_check` compiles the
kernels ahead of time, through their launchers, in a process without ``TRITON_INTERPRET``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_kernels_compile_for_sm90() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-m", "kernels.compile_check", "--arch", "90", "--dtypes", "bf16,fp32"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    built = [line for line in done.stdout.splitlines() if line.startswith("_")]
    # Per dtype: decode direct, decode split + merge, prefill, K/V write; then the layer ops:
    # the fused add + norm, the norm of hidden rows and of q heads, rotary at head sizes 128
    # and 64, SiLU-and-multiply.
    names = sorted({line.split()[0] for line in built})
    assert names == [
        "_merge_splits_kernel",
        "_paged_decode_kernel",
        "_paged_prefill_kernel",
        "_rms_norm_kernel",
        "_rotary_kernel",
        "_silu_and_mul_kernel",
        "_write_kv_kernel",
    ]
    assert len(built) == 22
    assert sum("*bf16" in line for line in built) == 10  # the merge kernel reads fp32 partials
    assert sum(line.startswith("_rms_norm_kernel") for line in built) == 6
    assert sum("HAS_RESIDUAL=True" in line for line in built) == 2
    assert sum(line.startswith("_rotary_kernel") for line in built) == 4
    assert "22 kernels compiled for sm_90" in done.stdout
