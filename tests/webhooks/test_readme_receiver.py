"""The README's receiver verifies what the deliverer signs, and drops repeats."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.webhooks import signing
from tests.webhooks.conftest import SECRET

README = Path(__file__).resolve().parents[2] / "README.md"


def receiver() -> dict[str, Any]:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    (block,) = [b for b in blocks if "def verified" in b]
    scope: dict[str, Any] = {}
    exec(compile(block, "README.md", "exec"), scope)
    return scope


def test_the_readme_receiver_verifies_and_dedupes(capsys: pytest.CaptureFixture[str]) -> None:
    scope = receiver()
    body = b'{"type": "job.done", "data": {"job_id": "j1", "text": "Paris"}}'
    headers = signing.headers(SECRET, "j1:terminal:1.0", int(time.time()), body)
    assert scope["receive"](SECRET, headers, body) == 200
    assert scope["receive"](SECRET, headers, body) == 200  # the repeat is answered, not handled
    assert capsys.readouterr().out == "job.done j1 Paris\n"
    assert scope["receive"](SECRET, headers, body + b" ") == 401
    stale = signing.headers(SECRET, "j1:terminal:1.0", int(time.time()) - 600, body)
    assert scope["receive"](SECRET, stale, body) == 401
