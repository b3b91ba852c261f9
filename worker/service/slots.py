"""A counting limit on the jobs a worker holds, that intake can take several of at once."""

from __future__ import annotations

import threading


class Slots:
    """``take(n)`` waits for at least one free slot and takes up to ``n``; ``give`` returns them."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._free = capacity
        self._cond = threading.Condition()

    @property
    def in_use(self) -> int:
        return self.capacity - self._free

    def take(self, n: int, timeout_s: float) -> int:
        """Up to ``n`` slots, at least one; 0 if none freed within ``timeout_s``."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._free > 0, timeout=timeout_s):
                return 0
            got = min(n, self._free)
            self._free -= got
            return got

    def give(self, n: int = 1) -> None:
        if n <= 0:
            return
        with self._cond:
            if self._free + n > self.capacity:
                raise RuntimeError(f"gave back {n} slots with {self._free} of {self.capacity} free")
            self._free += n
            self._cond.notify_all()
