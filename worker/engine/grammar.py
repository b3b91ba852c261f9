"""The grammar backend's interface: what constrained decoding needs of a grammar library.

A backend turns a ``Structure`` (``producer.constraints``) into a compiled grammar for the model's
vocabulary; a compiled grammar makes one matcher per sequence; a matcher says which tokens may
come next (as a bitmask: bit ``t % 32`` of word ``t // 32`` set when token ``t`` may) and follows
the tokens the sequence takes, and finds a short way to complete the constraint when the token
budget runs low. xgrammar is the one backend today (``grammar_xgrammar``); another (llguidance)
implements these three protocols (``Matcher.closing`` through ``grammar_closing.Probe``) and
``parse``.

``check_structure`` is the admission check: it parses a constraint without the vocabulary (a
fraction of a millisecond for a small schema), so a bad one is refused before its job starts.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

import torch

from producer.constraints import Structure
from worker.engine.sampling_params import InvalidSamplingParams

# Parses remembered, by the constraint's content: the intake and the engine both check each
# job's, and jobs of one app mostly repeat a few constraints.
_PARSED_CACHE_SIZE = 256
# xgrammar prefixes its messages with a time and a C++ source position: not the caller's concern.
_SOURCE_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:[0-9]+: ")


class GrammarError(InvalidSamplingParams):
    """A structure constraint that does not parse or compile; the message says what and where.
    An ``InvalidSamplingParams``: the job service refuses it with ``invalid_request``."""


class Matcher(Protocol):
    """One sequence's position in its grammar."""

    def accept(self, token_id: int) -> bool:
        """Take the sequence's next token; False if the grammar does not allow it."""
        ...

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the tokens allowed next into ``bitmask[row]`` (int32, on the CPU)."""
        ...

    def is_terminated(self) -> bool:
        """Whether a stop token has been accepted: the constraint is complete."""
        ...

    def closing(self, limit: int) -> list[int] | None:
        """Tokens that complete the constraint from here (then a stop token may come), at most
        ``limit``; None if none are found. Leaves the matcher as it was. Budget-aware decoding
        forces them when the budget runs low (``budget_closer``); a backend implements it with
        ``grammar_closing.closing_tokens`` over its matcher's primitives."""
        ...


class CompiledGrammar(Protocol):
    def matcher(self, stop_token_ids: Sequence[int]) -> Matcher:
        """A fresh matcher at the start; ``stop_token_ids`` are allowed only where the grammar
        may end, and end it."""
        ...


class GrammarBackend(Protocol):
    def compile(self, structure: Structure) -> CompiledGrammar:
        """The constraint compiled for this backend's vocabulary; ``GrammarError`` if not."""
        ...

    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        """An all-allowed ``(rows, ceil(vocab / 32))`` int32 bitmask on the CPU."""
        ...

    def apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
        """Set to -inf, in place and in one pass, the disallowed tokens of ``logits[r]`` for
        each ``r`` in ``rows``: ``bitmask[r]`` holds row ``r``'s mask."""
        ...


def structure_key(structure: Structure) -> str:
    """The cache key of a constraint: a hash of its canonical JSON (its wire form)."""
    text = structure.model_dump_json(by_alias=True)
    return hashlib.sha256(text.encode()).hexdigest()


def clean_message(exc: BaseException) -> str:
    """A backend's error as the caller should read it: no timestamps or C++ file names."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return _SOURCE_PREFIX.sub("", text)


def check_structure(structure: Structure) -> None:
    """``GrammarError`` unless the backend can parse ``structure`` (no vocabulary needed)."""
    key = structure_key(structure)
    with _parsed_lock:
        known = key in _parsed
        problem = _parsed.get(key)
    if not known:
        problem = _parse_problem(structure)
        with _parsed_lock:
            _parsed[key] = problem
            while len(_parsed) > _PARSED_CACHE_SIZE:
                _parsed.popitem(last=False)
    if problem is not None:
        raise GrammarError(f"invalid sampling parameter structure: {problem}")


# Content hash -> the parse's problem (None: it parses), oldest first. A lock: the intake
# thread and the model loop both check.
_parsed: OrderedDict[str, str | None] = OrderedDict()
_parsed_lock = threading.Lock()


def _parse_problem(structure: Structure) -> str | None:
    """What is wrong with ``structure``, or None."""
    from worker.engine.grammar_xgrammar import parse

    try:
        parse(structure)
    except Exception as exc:  # the backend's parser raises RuntimeError, ValueError, ...
        return f"{structure.type}: {clean_message(exc)}"
    return None
