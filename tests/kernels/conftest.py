"""Kernel tests run on CPU through Triton's interpreter.

``@triton.jit`` reads ``TRITON_INTERPRET`` when it wraps a function, i.e. when ``kernels.triton_*``
is first imported; the root ``tests/conftest.py`` sets it (and ``OPENBLAS_NUM_THREADS``) before
any test module is imported. ``test_interpreter_is_active`` catches a run where that failed.

The sweep marked ``slow`` (every head size x dtype x block size) takes about 2.5 minutes on two
cores; CI runs it, and ``-m "not slow"`` leaves it out while iterating.
"""
