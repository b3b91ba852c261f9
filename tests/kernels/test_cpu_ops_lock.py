"""A build killed mid-way leaves torch's ``lock`` file; later loads must not wait on it forever.

The build itself is faked (no compiler runs): the fake waits on the lock exactly as torch's
`cpp_extension.load` does, with torch's own `FileBaton`.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from types import ModuleType

import pytest
from torch.utils import cpp_extension
from torch.utils.file_baton import FileBaton

from kernels import cpu_ops


def fake_load(name: str, **_: object) -> ModuleType:
    """torch's locking around a build, without the build."""
    build_dir = Path(cpp_extension._get_build_directory(name, verbose=False))
    baton = FileBaton(str(build_dir / cpu_ops.TORCH_LOCK), wait_seconds=0.01)
    if baton.try_acquire():
        baton.release()
    else:
        baton.wait()
    return ModuleType(name)


@pytest.fixture
def build_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(cpu_ops.shutil, "which", lambda _: "/usr/bin/c++")
    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: True)
    monkeypatch.setattr(cpp_extension, "load", fake_load)
    return Path(cpp_extension._get_build_directory(cpu_ops.module_name(), verbose=False))


def start_build() -> tuple[threading.Thread, list[ModuleType]]:
    built: list[ModuleType] = []
    thread = threading.Thread(target=lambda: built.append(cpu_ops._build()), daemon=True)
    thread.start()
    return thread, built


def test_a_lock_left_by_a_killed_build_is_removed(
    build_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stale = build_dir / cpu_ops.TORCH_LOCK
    stale.touch()  # what a build killed before its `finally` leaves
    with caplog.at_level(logging.WARNING, logger=cpu_ops.__name__):
        thread, built = start_build()
        thread.join(timeout=30)
    assert not thread.is_alive(), "the load waited on a lock nobody holds"
    assert [m.__name__ for m in built] == [cpu_ops.module_name()]
    assert not stale.exists()
    assert "did not finish" in caplog.text


def test_a_build_in_progress_is_waited_for_not_broken(build_dir: Path) -> None:
    live = build_dir / cpu_ops.TORCH_LOCK
    with cpu_ops._build_lock(build_dir):  # another builder, alive, holding both locks
        live.touch()
        thread, built = start_build()
        thread.join(timeout=0.5)
        assert thread.is_alive() and live.exists()  # waiting, its lock left alone
        live.unlink()  # that build ends: torch's FileBaton.release
    thread.join(timeout=30)
    assert not thread.is_alive() and len(built) == 1
