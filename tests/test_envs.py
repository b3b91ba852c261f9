"""Environment variables are read in one module per package (``producer/envs.py``,
``worker/envs.py``, ``gateway/envs.py``): a setting read anywhere else has two homes."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV_MODULES = {"producer/envs.py", "worker/envs.py", "gateway/envs.py"}


def reads_environment(tree: ast.AST) -> list[int]:
    """Lines that touch ``os.environ`` or call ``os.getenv`` (code only: docstrings aside)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv"):
            if isinstance(node.value, ast.Name) and node.value.id == "os":
                lines.append(node.lineno)
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(alias.name in ("environ", "getenv") for alias in node.names):
                lines.append(node.lineno)
    return lines


def test_only_the_env_modules_read_the_environment() -> None:
    found = {}
    for package in ("producer", "worker", "gateway"):
        for path in sorted((ROOT / package).rglob("*.py")):
            name = str(path.relative_to(ROOT))
            if name not in ENV_MODULES and (
                lines := reads_environment(ast.parse(path.read_text()))
            ):
                found[name] = lines
    assert not found, f"environment read outside the envs modules: {found}"
    for name in ENV_MODULES:  # and each says which variables it reads
        assert "PATERNOSTER_" in (ast.get_docstring(ast.parse((ROOT / name).read_text())) or "")
