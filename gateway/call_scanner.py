"""Where each call is in ``tool_choice: required``'s output, as the text arrives.

That output is constrained to a JSON array of ``{"name": ..., "arguments": {...}}`` objects
(``openai_tools.calls_schema``), so a call can be streamed while it is written: its name once
that string has closed, then its arguments as they grow, as the model's own text (the span of
the ``arguments`` value). The scanner reads each character once (a stream's feed costs its new
text, not the whole output again), tracking strings and nesting; it reads keys and values only
inside the call objects at the array's top level, where the grammar puts them, so text of any
other shape (an output that is no array) has no calls.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

# Nesting depths: 1 inside the array, 2 inside one call's object, 3 inside its arguments.
_ARRAY, _CALL = 1, 2


@dataclass
class CallSpan:
    """One call found so far: its name (None until the string closes), where its arguments'
    value starts and ends in the text (end None while it is open), whether its object closed."""

    name: str | None = None
    args_start: int | None = None
    args_end: int | None = None
    closed: bool = False


class CallScanner:
    """The calls of a JSON array of ``{name, arguments}`` objects, fed piece by piece."""

    def __init__(self) -> None:
        self.text = ""
        self.calls: list[CallSpan] = []
        self._at = 0  # the next character to read
        self._depth = 0
        self._is_array = False
        self._in_string = self._escape = False
        self._string_start = 0
        self._expect_key = False  # in a call's object: the next string is a key
        self._key: str | None = None
        self._ended = False  # the root value closed: what follows is no part of it

    def feed(self, piece: str) -> None:
        self.text += piece
        for i in range(self._at, len(self.text)):
            if self._ended:
                break
            self._read(self.text[i], i)
        self._at = len(self.text)

    def arguments(self, call: CallSpan) -> str:
        """The call's arguments as written so far ("" before they start)."""
        if call.args_start is None:
            return ""
        return self.text[call.args_start : call.args_end]

    def _read(self, ch: str, i: int) -> None:
        if self._in_string:
            if self._escape:
                self._escape = False
            elif ch == "\\":
                self._escape = True
            elif ch == '"':
                self._in_string = False
                self._string_closed(i)
        elif ch == '"':
            self._in_string, self._string_start = True, i
        elif ch in "{[":
            self._open(ch, i)
        elif ch in "}]":
            self._close(i)
        elif self._depth == _CALL and self._is_array:
            if ch == ":":
                self._expect_key = False
            elif ch == ",":
                self._expect_key, self._key = True, None

    def _open(self, ch: str, i: int) -> None:
        if self._depth == 0:
            self._is_array = ch == "["
        elif self._is_array and self._depth == _ARRAY and ch == "{":
            self.calls.append(CallSpan())
            self._expect_key, self._key = True, None
        elif self._is_array and self._depth == _CALL and self._key == "arguments":
            self.calls[-1].args_start = i
        self._depth += 1

    def _close(self, i: int) -> None:
        self._depth -= 1
        self._ended = self._depth <= 0
        if not self._is_array or not self.calls:
            return
        if self._depth == _CALL and self._key == "arguments":
            self.calls[-1].args_end = i + 1
        elif self._depth == _ARRAY:
            self.calls[-1].closed = True

    def _string_closed(self, end: int) -> None:
        if self._depth != _CALL or not self._is_array:
            return
        try:
            value = json.loads(self.text[self._string_start : end + 1])
        except ValueError:  # an escape JSON has not (no constrained output holds one)
            return
        if self._expect_key:
            self._key = value
        elif self._key == "name" and isinstance(value, str):
            self.calls[-1].name = value
