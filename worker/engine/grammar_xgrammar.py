"""The xgrammar backend (the library vLLM and SGLang constrain decoding with).

``parse`` reads a constraint into an ``xgrammar.Grammar`` without the vocabulary: the admission
check. ``XGrammarBackend.compile`` also builds the per-vocabulary token masks (SmolLM2's 49,152
tokens: 5 ms for a small JSON Schema on this machine's 2 cores); the compile thread runs it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import torch
import xgrammar as xgr

from producer.constraints import (
    ChoiceConstraint,
    GrammarConstraint,
    JsonObjectConstraint,
    JsonSchemaConstraint,
    RegexConstraint,
    Structure,
)
from worker.engine.grammar import GrammarError, clean_message
from worker.engine.grammar_closing import TextEncoder, closing_tokens

Encode = Callable[[str], list[int]]

# JSON constraints fix the whitespace to one line, `{"a": 1, "b": [2, 3]}` (xgrammar's
# any_whitespace=False; vLLM's disable_any_whitespace): free whitespace let SmolLM2-135M at
# temperature 0.7 spend its tokens on runs of newlines and spaces inside one object, and a
# parser reads the compact form alike. The one declaration; docs/protocol.md says it.
JSON_ANY_WHITESPACE = False


def parse(structure: Structure) -> xgr.Grammar:
    """The constraint as an xgrammar grammar; the backend's exception if it does not parse."""
    if isinstance(structure, JsonSchemaConstraint):
        return xgr.Grammar.from_json_schema(
            json.dumps(structure.schema_),
            strict_mode=structure.strict,
            any_whitespace=JSON_ANY_WHITESPACE,
        )
    if isinstance(structure, JsonObjectConstraint):
        # The builtin JSON grammar takes any value; JSON mode means an object.
        return xgr.Grammar.from_json_schema(
            '{"type": "object"}', strict_mode=False, any_whitespace=JSON_ANY_WHITESPACE
        )
    if isinstance(structure, RegexConstraint):
        return xgr.Grammar.from_regex(structure.pattern)
    if isinstance(structure, ChoiceConstraint):
        # JSON string literals are EBNF string literals (quotes and backslashes escaped).
        literals = " | ".join(json.dumps(c, ensure_ascii=False) for c in structure.choices)
        return xgr.Grammar.from_ebnf(f"root ::= {literals}")
    if isinstance(structure, GrammarConstraint):
        return xgr.Grammar.from_ebnf(structure.grammar)
    raise GrammarError(f"invalid sampling parameter structure: no backend for {structure!r}")


class XGrammarMatcher:
    """A ``grammar.Matcher`` over ``xgrammar.GrammarMatcher``; also a ``grammar_closing.Probe``
    (the primitives its budget search needs), with ``encode`` the model's tokenizer."""

    def __init__(self, matcher: xgr.GrammarMatcher, encode: Encode) -> None:
        self._matcher = matcher
        self._encode = encode

    def accept(self, token_id: int) -> bool:
        return bool(self._matcher.accept_token(token_id))

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def is_terminated(self) -> bool:
        return bool(self._matcher.is_terminated())

    def closing(self, limit: int) -> list[int] | None:
        return closing_tokens(self, self._encode, limit)

    # -- grammar_closing.Probe ---------------------------------------------------------------------

    def fork(self) -> XGrammarMatcher:
        return XGrammarMatcher(self._matcher.fork(), self._encode)  # ~5 us

    def accept_text(self, text: str) -> bool:
        return bool(self._matcher.accept_string(text))

    def rollback_text(self) -> None:
        self._matcher.rollback(1)  # an accepted string is one step

    def forced_text(self) -> str:
        return str(self._matcher.find_jump_forward_string())

    def can_end(self) -> bool:
        return bool(self._matcher.is_completed())


class XGrammarCompiled:
    """A ``grammar.CompiledGrammar``: the compiled grammar and its size."""

    def __init__(self, compiled: xgr.CompiledGrammar, encode: Encode) -> None:
        self._compiled = compiled
        self._encode = encode
        self.memory_bytes = int(compiled.memory_size_bytes)

    def matcher(self, stop_token_ids: Sequence[int]) -> XGrammarMatcher:
        stops = sorted(set(stop_token_ids))
        matcher = xgr.GrammarMatcher(self._compiled, override_stop_tokens=stops)
        return XGrammarMatcher(matcher, self._encode)


class XGrammarBackend:
    """A ``grammar.GrammarBackend`` for one tokenizer; ``vocab_size`` is the logits' width
    (the model's vocabulary, which may pad the tokenizer's)."""

    def __init__(
        self, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int], threads: int = 2
    ) -> None:
        self.vocab_size = vocab_size
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_token_ids)
        )
        special = {*info.special_token_ids, *stop_token_ids}
        self._encode = TextEncoder(
            lambda text: list(tokenizer.encode(text, add_special_tokens=False)),
            info.decoded_vocab,
            special,
        )
        # Our own cache (grammar_compiles) keeps compiled grammars by content; xgrammar's
        # would keep a second copy of each.
        self._compiler = xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False)

    def compile(self, structure: Structure) -> XGrammarCompiled:
        try:
            grammar = parse(structure)
            return XGrammarCompiled(self._compiler.compile_grammar(grammar), self._encode)
        except GrammarError:
            raise
        except Exception as exc:
            message = f"{structure.type}: {clean_message(exc)}"
            raise GrammarError(f"invalid sampling parameter structure: {message}") from exc

    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        return xgr.allocate_token_bitmask(rows, self.vocab_size)

    def apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
        if bitmask.device != logits.device:
            bitmask = bitmask.to(logits.device, non_blocking=True)
        # One pass over the masked rows; xgrammar's CPU kernel or its Triton kernel on CUDA.
        xgr.apply_token_bitmask_inplace(
            logits, bitmask, vocab_size=self.vocab_size, indices=list(rows)
        )
