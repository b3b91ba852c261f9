"""Load a bench script from `ops/bench/` by its path, as `python ops/bench/<name>.py` runs it
(the scripts are not all importable as a package), for the tests of this folder."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH_DIR = Path(__file__).resolve().parents[2] / "ops" / "bench"


def load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        f"paternoster_bench_{name}", BENCH_DIR / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module
