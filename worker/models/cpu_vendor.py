"""The CPU's vendor string (``vendor_id`` in /proc/cpuinfo: GenuineIntel, AuthenticAMD), read
once. Where a library's speed depends on it (MKL's sgemm runs without AVX-512 on AMD), the
choice keys on this."""

from __future__ import annotations

import functools
import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


@functools.cache
def cpu_vendor() -> str:
    """``vendor_id`` of the first CPU; elsewhere than Linux, `platform.processor()` (may be
    empty)."""
    try:
        text = CPUINFO.read_text()
    except OSError:
        return platform.processor()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "vendor_id":
            return value.strip()
    return platform.processor()
