"""Builds and loads our C++ CPU kernels on first use.

`cpu_paged_attention.cpp` (decode attention, K/V write), `cpu_prefill_attention.cpp` (prefill
chunks' attention in float32 over either cache dtype), `cpu_prefill_bf16.cpp` and
`cpu_prefill_amx.cpp` (the same over a bf16 cache with bf16 products: AVX-512 BF16 dot products
or AMX tiles), `cpu_layer_ops.cpp` (rotary, SiLU, residual + RMSNorm), `cpu_linear.cpp`
(projections of few rows), `cpu_quant_linear.cpp` and `cpu_int8_linear.cpp` (projections of GGUF
blocks and of int8 weights; `cpu_quant.h`), `cpu_gguf_kmajor.cpp` (GGUF blocks stored k-major)
and `cpu_decode_stack.cpp` (every layer of an all-decode step in one call, over those kernels),
bound to Python in `cpu_bindings.cpp`.

The source is compiled for the machine it runs on (``-march=native``; ``PATERNOSTER_CPU_ARCH``,
read once per process, or `load`'s ``arch`` names another ``-march`` target, e.g. ``haswell`` to
run the AVX2 code paths on an AVX-512 machine, built as a module of its own) by torch's extension
builder, which caches the result under ``TORCH_EXTENSIONS_DIR`` (default
``~/.cache/torch_extensions``) keyed by source and flags: about 40 s on a 2-core machine the first
time, a fraction of a second after. Building needs a C++ compiler and ``ninja``; where either is
missing, `load` returns None with the reason, and callers keep the pure-torch path.

torch's builder guards a build directory with a ``lock`` file it creates and deletes; a process
killed mid-build leaves it behind, and every later load of that build waited for it forever. So
processes build one at a time under an advisory lock of ours (``flock``), which the kernel drops
when its holder dies: whoever holds it knows that a ``lock`` file left in the directory has no
live owner and removes it.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
import shutil
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)

_HERE = Path(__file__).parent
SOURCES = [
    _HERE / "cpu_bindings.cpp",
    _HERE / "cpu_paged_attention.cpp",
    _HERE / "cpu_prefill_attention.cpp",
    _HERE / "cpu_prefill_amx.cpp",
    _HERE / "cpu_prefill_bf16.cpp",
    _HERE / "cpu_layer_ops.cpp",
    _HERE / "cpu_linear.cpp",
    _HERE / "cpu_quant_linear.cpp",
    _HERE / "cpu_gguf_kmajor.cpp",
    _HERE / "cpu_gguf_avx2.cpp",
    _HERE / "cpu_gguf_q8.cpp",
    _HERE / "cpu_gguf_q8_gemm.cpp",
    _HERE / "cpu_gguf_q8_gemm_avx2.cpp",
    _HERE / "cpu_int8_linear.cpp",
    _HERE / "cpu_decode_stack.cpp",
]
# Every header beside the sources, so a header added later enters the build's digest too.
HEADERS = sorted(_HERE.glob("cpu_*.h"))
# -fopenmp: at::parallel_for is inline OpenMP code compiled into this module; without the flag
# its pragma is ignored and the kernel runs on one thread (measured: 2 threads no faster than 1).
# The module then needs libgomp.so.1, which resolves to the copy torch has already loaded, so
# both share one thread pool. `#pragma omp simd reduction` vectorises the dot products without
# -ffast-math, which would also loosen exp() and the softmax's inf handling.
CFLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp"]
NATIVE = "native"
ARCH_ENV = "PATERNOSTER_CPU_ARCH"  # a -march target for every load(); default native
LDFLAGS = ["-fopenmp"]
# Part of the build's name: builders of the same sources that do not take `_build_lock` (this
# file before it did) use another directory, so a `lock` file found under ours is always stale.
BUILD_PROTOCOL = "flock-1"
TORCH_LOCK = "lock"  # the file torch.utils.cpp_extension's FileBaton holds during a build
OUR_LOCK = "paternoster.flock"

_lock = threading.Lock()
_modules: dict[str, ModuleType] = {}  # by -march target
_errors: dict[str, str] = {}  # why that target's build failed


@functools.cache
def default_arch() -> str:
    """``PATERNOSTER_CPU_ARCH`` (read once per process), else ``native``."""
    return os.environ.get(ARCH_ENV) or NATIVE


def load(arch: str | None = None) -> ModuleType | None:
    """The compiled module for ``-march=arch`` (default: `default_arch`), building it once per
    process; None if it cannot be built."""
    arch = arch or default_arch()
    with _lock:
        if arch not in _modules and arch not in _errors:
            try:
                _modules[arch] = _build(arch)
            except Exception as e:  # a compiler error, a missing tool: keep the torch path
                _errors[arch] = f"{type(e).__name__}: {e}".strip()[:2000]
                log.warning("CPU kernels (%s) unavailable, using torch: %s", arch, _errors[arch])
        return _modules.get(arch)


def unavailable_reason(arch: str | None = None) -> str | None:
    """Why `load` returned None, once it has; None while loadable or untried."""
    return _errors.get(arch or default_arch())


def module_name(arch: str = NATIVE) -> str:
    """The extension's name, with a digest of its sources and header (and of ``arch`` unless
    native): torch's cache notices a changed source but not a changed header, and a name per
    content never loads a stale build."""
    digest = hashlib.sha256(BUILD_PROTOCOL.encode())
    if arch != NATIVE:
        digest.update(arch.encode())
    for path in (*SOURCES, *HEADERS):
        digest.update(path.read_bytes())
    return f"paternoster_cpu_ops_{digest.hexdigest()[:12]}"


def _build(arch: str = NATIVE) -> ModuleType:
    from torch.utils import cpp_extension

    if shutil.which("c++") is None and shutil.which("g++") is None:
        raise RuntimeError("no C++ compiler (c++ or g++) on PATH")
    if not cpp_extension.is_ninja_available():
        raise RuntimeError("ninja is not installed (pip install ninja)")
    name = module_name(arch)
    # torch caches builds in <extensions dir>/<name>/ (a private helper names it, and creates
    # it). Without the helper (a future torch) there is no stale-lock check and no message.
    where = getattr(cpp_extension, "_get_build_directory", None)
    build_dir = Path(where(name, verbose=False)) if where else None
    with _build_lock(build_dir):
        if build_dir is not None and not (build_dir / f"{name}.so").exists():
            # A build is 45 s of silence on 2 cores: say so, once.
            print(
                "Compiling the C++ CPU kernels for this machine, once (about 45 s; cached in "
                f"{build_dir.parent})...",
                file=sys.stderr,
                flush=True,
            )
        module = cpp_extension.load(
            name=name,
            sources=[str(source) for source in SOURCES],
            extra_cflags=[f"-march={arch}" if f.startswith("-march") else f for f in CFLAGS],
            extra_ldflags=LDFLAGS,
            verbose=False,
        )
    assert isinstance(module, ModuleType)
    return module


@contextmanager
def _build_lock(build_dir: Path | None) -> Iterator[None]:
    """Hold our lock on ``build_dir`` (waiting while another process builds there) and remove
    torch's ``lock`` file if one is left: with ours held, its owner died mid-build."""
    if build_dir is None:
        yield
        return
    with open(build_dir / OUR_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released on close, or by the kernel at exit
        try:
            stale = build_dir / TORCH_LOCK
            if stale.exists():
                log.warning("removing %s left by a build that did not finish", stale)
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
