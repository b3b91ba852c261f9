"""Run the Triton kernels on CPU: the interpreter must be chosen before any kernel is decorated.

``@triton.jit`` reads ``TRITON_INTERPRET`` when it wraps a function, i.e. when ``kernels.triton_*``
is first imported. pytest imports this conftest before the test modules of this directory, so
setting the variable here is early enough unless another test directory imported the kernels
first (``test_interpreter_is_active`` catches that).

The interpreter sweep marked ``slow`` takes minutes; it runs only when asked for with ``-m``
(e.g. ``-m slow``), so a plain ``pytest tests/kernels`` stays under a minute.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
# The interpreter runs each tl.dot as a small numpy matmul; OpenBLAS threads on such tiny
# matrices cost more than they save (one prefill case: 11.3 s threaded, 4.5 s with one thread on
# 2 cores). Effective only if numpy is not yet imported (true for `pytest tests/kernels`).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("markexpr"):
        return
    skip = pytest.mark.skip(reason="Triton interpreter sweep: run with -m slow")
    here = os.path.dirname(__file__)
    for item in items:
        if "slow" in item.keywords and str(item.path).startswith(here):
            item.add_marker(skip)
