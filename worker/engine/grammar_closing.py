"""A short way to finish a structure from where its matcher is: what budget-aware decoding steers
a constrained row along when its token budget runs low (``budget_closer``).

Backend-neutral: the search needs only the ``Probe`` primitives (fork, accept a text and take it
back, the forced continuation, whether the grammar may end here); each backend's matcher
provides them and calls ``closing_tokens`` (``grammar_xgrammar.XGrammarMatcher.closing``).

The search is a beam over characters: from each state it tries printable ASCII in an order that
closes first (``"`` ``}`` ``]`` before ``,``, digits before letters, ``{`` ``[`` last), keeps of
each class the first the grammar accepts, appends the forced text after each (a JSON key, the rest
of an enum value: free of choice, so not a branch), and keeps the first ``_BEAM`` states per
round (the best parent's children first) until one may end; of those that may, the shortest
text. Inside an unbounded JSON string that is one round (``"`` then the forced ``}``); a pattern
like ``[A-Z]{3}-[0-9]{3}`` is seven. The text found is then tokenized by the model's tokenizer
and checked token by token on a fork. Shortest in characters among what the beam kept, not
proven shortest in tokens; from 150 random prefixes of the ten shapes of
``ops/bench/openai_structured.py`` it closed every one, in 0.46 ms (median; 9.5 ms at most) and
at most 28 tokens (``tests/engine/test_grammar_closing.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Protocol

# Characters tried at a branch, by class, most closing first; of each class the first the grammar
# accepts is a branch (the first letter of an enum value, the digit a range allows, the `@` of an
# e-mail pattern besides its letters). ASCII only: a state that accepts no ASCII character (inside
# a multi-byte character, a choice of CJK words) finds no way, and its row decodes as before.
CLASSES = (
    '"}])',
    ",:",
    "0123456789",
    "abcdefghijklmnopqrstuvwxyz",
    " -.",
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "!#$%&'*+/;<=>?@\\^_`|~(",
    "{[",
)
# States kept per round: 3 closed every shape we tried; a round costs ~0.3 ms per state on 2
# cores (95 accept/rollback pairs at 2.5 us, a fork per branch at 5 us).
_BEAM = 3
# Rounds (branch points) at most before giving up: a closing path of JSON has a few (a string's
# quote, a required key's value, each enclosing bracket); 48 bounds a search at ~50 ms.
_MAX_ROUNDS = 48


class Probe(Protocol):
    """What the search needs of a backend's matcher. Every method but ``fork`` may change the
    probe; the search changes only forks."""

    def fork(self) -> Probe:
        """An independent copy at the same state."""
        ...

    def accept_text(self, text: str) -> bool:
        """Take ``text`` (one step to roll back); False, unchanged, if the grammar refuses it."""
        ...

    def rollback_text(self) -> None:
        """Undo the last accepted text."""
        ...

    def forced_text(self) -> str:
        """The longest text every continuation from here starts with (may be empty)."""
        ...

    def can_end(self) -> bool:
        """Whether the output so far is complete: a stop token may come next."""
        ...

    def accept(self, token_id: int) -> bool:
        """Take one token; False if the grammar refuses it."""
        ...


def closing_tokens(
    probe: Probe, encode: Callable[[str], list[int]], limit: int
) -> list[int] | None:
    """Tokens that take ``probe`` to a state where it may end (none if it may already), at most
    ``limit`` of them; None if the search finds no such way. ``probe`` is left as it was."""
    if probe.can_end():
        return []
    text = closing_text(probe, max_chars=max(16, 8 * limit))
    if text is None:
        return None
    tokens = encode(text)
    if len(tokens) > limit:
        return None
    check = probe.fork()  # the tokenizer's pieces need not be what the search accepted
    if all(check.accept(t) for t in tokens) and check.can_end():
        return tokens
    return None


def closing_text(probe: Probe, max_chars: int) -> str | None:
    """The shortest text the beam finds that takes ``probe`` to where it may end."""
    beam: list[tuple[str, Probe]] = [("", probe)]
    for _ in range(_MAX_ROUNDS):
        children: list[tuple[str, Probe]] = []
        for text, state in beam:
            for char in _accepted(state):
                child = state.fork()
                child.accept_text(char)
                forced = child.forced_text()
                if forced and not child.accept_text(forced):
                    continue
                children.append((text + char + forced, child))
        children = [c for c in children if len(c[0]) <= max_chars]
        if not children:
            return None
        done = [text for text, state in children if state.can_end()]
        if done:
            return min(done, key=len)
        # The first children in preference order, not the shortest: forced text (a required key)
        # is progress, and by length the beam would keep a string's content over its quote.
        beam = children[:_BEAM]
    return None


def _accepted(state: Probe) -> list[str]:
    """Of each of ``CLASSES``, the first character the grammar accepts next."""
    found: list[str] = []
    for chars in CLASSES:
        for char in chars:
            if state.accept_text(char):
                state.rollback_text()
                found.append(char)
                break
    return found


class TextEncoder:
    """A closing text as token ids: the tokenizer's own encoding where its tokens spell the text
    byte for byte, else the longest vocabulary token at each point (a SentencePiece tokenizer
    puts a ``▁`` before a text it encodes alone, so its own encoding would never check out).
    ``vocab[t]`` is token ``t``'s bytes; ``special`` ids are never used."""

    def __init__(
        self,
        encode: Callable[[str], list[int]],
        vocab: Sequence[bytes],
        special: Collection[int],
    ) -> None:
        self._encode = encode
        self._vocab = vocab
        self._special = frozenset(special)
        self._by_bytes: dict[bytes, int] | None = None  # built at the first fallback (~30 ms)
        self._longest = 1

    def __call__(self, text: str) -> list[int]:
        ids = self._encode(text)
        size = len(self._vocab)
        if (
            all(0 <= t < size for t in ids)
            and b"".join(self._vocab[t] for t in ids) == text.encode()
        ):
            return ids
        return self._greedy(text.encode())

    def _greedy(self, data: bytes) -> list[int]:
        by_bytes = self._table()
        ids: list[int] = []
        start = 0
        while start < len(data):
            for end in range(min(len(data), start + self._longest), start, -1):
                token = by_bytes.get(data[start:end])
                if token is not None:
                    ids.append(token)
                    start = end
                    break
            else:
                return []  # a byte no token spells: the caller's check fails, no closing
        return ids

    def _table(self) -> dict[bytes, int]:
        if self._by_bytes is None:
            table: dict[bytes, int] = {}
            for token, piece in enumerate(self._vocab):
                if piece and token not in self._special:
                    table.setdefault(piece, token)
            self._by_bytes = table
            self._longest = max(map(len, table), default=1)
        return self._by_bytes
