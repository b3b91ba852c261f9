"""Builds and loads our C++ CPU kernels on first use.

`cpu_paged_attention.cpp` (decode attention, K/V write), `cpu_layer_ops.cpp` (rotary, SiLU,
residual + RMSNorm) and `cpu_linear.cpp` (projections of few rows), bound to Python in
`cpu_bindings.cpp`.

The source is compiled for the machine it runs on (``-march=native``) by torch's extension
builder, which caches the result under ``TORCH_EXTENSIONS_DIR`` (default
``~/.cache/torch_extensions``) keyed by source and flags: about 40 s on a 2-core machine the first
time, a fraction of a second after. Building needs a C++ compiler and ``ninja``; where either is
missing, `load` returns None with the reason, and callers keep the pure-torch path.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import sys
import threading
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)

_HERE = Path(__file__).parent
SOURCES = [
    _HERE / "cpu_bindings.cpp",
    _HERE / "cpu_paged_attention.cpp",
    _HERE / "cpu_layer_ops.cpp",
    _HERE / "cpu_linear.cpp",
]
HEADERS = [_HERE / "cpu_ops.h"]
# -fopenmp: at::parallel_for is inline OpenMP code compiled into this module; without the flag
# its pragma is ignored and the kernel runs on one thread (measured: 2 threads no faster than 1).
# The module then needs libgomp.so.1, which resolves to the copy torch has already loaded, so
# both share one thread pool. `#pragma omp simd reduction` vectorises the dot products without
# -ffast-math, which would also loosen exp() and the softmax's inf handling.
CFLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp"]
LDFLAGS = ["-fopenmp"]

_lock = threading.Lock()
_state: dict[str, ModuleType | str] = {}


def load() -> ModuleType | None:
    """The compiled module, building it once per process; None if it cannot be built."""
    with _lock:
        if "module" not in _state and "error" not in _state:
            try:
                _state["module"] = _build()
            except Exception as e:  # a compiler error, a missing tool: keep the torch path
                _state["error"] = f"{type(e).__name__}: {e}".strip()[:2000]
                log.warning("CPU attention kernels unavailable, using torch: %s", _state["error"])
        module = _state.get("module")
        return module if isinstance(module, ModuleType) else None


def unavailable_reason() -> str | None:
    """Why `load` returned None, once it has; None while loadable or untried."""
    error = _state.get("error")
    return error if isinstance(error, str) else None


def module_name() -> str:
    """The extension's name, with a digest of its sources and header: torch's cache notices a
    changed source but not a changed header, and a name per content never loads a stale build."""
    digest = hashlib.sha256()
    for path in (*SOURCES, *HEADERS):
        digest.update(path.read_bytes())
    return f"paternoster_cpu_ops_{digest.hexdigest()[:12]}"


def _build() -> ModuleType:
    from torch.utils import cpp_extension

    if shutil.which("c++") is None and shutil.which("g++") is None:
        raise RuntimeError("no C++ compiler (c++ or g++) on PATH")
    if not cpp_extension.is_ninja_available():
        raise RuntimeError("ninja is not installed (pip install ninja)")
    name = module_name()
    # torch caches builds in <extensions dir>/<name>/ (a private helper names it; the message is
    # skipped if a torch ever drops it). A build is 45 s of silence on 2 cores: say so, once.
    where = getattr(cpp_extension, "_get_build_directory", None)
    built = Path(where(name, verbose=False)) / f"{name}.so" if where else None
    if built is not None and not built.exists():
        print(
            "Compiling the C++ CPU kernels for this machine, once (about 45 s; cached in "
            f"{built.parent.parent})...",
            file=sys.stderr,
            flush=True,
        )
    module = cpp_extension.load(
        name=name,
        sources=[str(source) for source in SOURCES],
        extra_cflags=CFLAGS,
        extra_ldflags=LDFLAGS,
        verbose=False,
    )
    assert isinstance(module, ModuleType)
    return module
