"""Python declarations written as Lua: the generated opening of each script in ``producer/lua``.

A script's body names what it uses: a member of a table (``State.RUNNING``), a value
(``RECENT_KEPT``), a function (``band_load_key(prefix, band)``) or a shared piece of Lua
(``unload``). ``regenerate`` writes exactly those definitions, from the ``Names`` it is given,
between the ``BEGIN`` and ``END`` lines, so each file stays a whole script that a client in
any language loads as it is, while every value in it is spelt once, in Python. A name the
body uses that ``Names`` lacks is an error here, not a nil at run time in Redis.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

BEGIN = "-- Generated from the Python declarations (producer.scripts.write_files); do not edit."
END = "-- End of the generated lines."
LuaValue = str | int
_MARK = re.compile("\x00([0-9]+)\x00")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LUA_KEYWORDS = frozenset(
    "and break do else elseif end false for function if in local nil not or repeat return "
    "then true until while".split()
)
WIDTH = 100


@dataclass(frozen=True)
class Names:
    """What a prelude may define: tables of constants, single values, and Lua definitions
    (functions and shared pieces) by the name a body uses them under, in the order written."""

    tables: Mapping[str, Mapping[str, LuaValue]]
    values: Mapping[str, LuaValue]
    code: Mapping[str, str]


def literal(value: LuaValue) -> str:
    """A Lua literal: an integer as is, a string single-quoted with Lua's escapes."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"no Lua literal for {value!r}")
    if isinstance(value, int):
        return str(value)
    # Byte by byte: Lua strings are bytes, and its decimal escapes name one byte each.
    escaped = "".join(
        chr(b) if 32 <= b < 127 and chr(b) not in "\\'" else f"\\{b:03d}" for b in value.encode()
    )
    return f"'{escaped}'"


def expression(build: Callable[..., str], params: Sequence[str]) -> str:
    """The Lua expression that computes ``build(*params)``: ``build`` is called with a marker
    for each parameter, and its result read back as literal text around them."""
    marked = build(*(f"\x00{i}\x00" for i in range(len(params))))
    parts = _MARK.split(marked)  # literal, index, literal, index, ..., literal
    lua = [literal(text) if n % 2 == 0 else params[int(text)] for n, text in enumerate(parts)]
    return " .. ".join(p for n, p in enumerate(lua) if n % 2 or parts[n])


def function(name: str, params: Sequence[str], body: Sequence[str]) -> str:
    lines = [f"local function {name}({', '.join(params)})", *(f"  {line}" for line in body)]
    return "\n".join([*lines, "end"])


def concat_function(name: str, params: Sequence[str], build: Callable[..., str]) -> str:
    """A Lua function returning what ``build`` returns for the same arguments (string
    concatenation only: ``build`` must not look at its arguments)."""
    return function(name, params, [f"return {expression(build, params)}"])


def lookup_function(
    name: str, params: Sequence[str], cases: Mapping[str, Callable[..., str]]
) -> str:
    """A Lua function of ``params`` and a last parameter picking one of ``cases``: for
    values Python computes per case (a band's stream name), not by concatenation alone."""
    *outer, key = params
    rows = [f"{_key(case)} = {expression(build, outer)}," for case, build in cases.items()]
    body = ["local cases = {", *(f"  {row}" for row in rows), "}", f"return cases[{key}]"]
    return function(name, params, body)


def regenerate(text: str, names: Names) -> str:
    """``text`` (a script) with its generated lines rewritten for what its body uses."""
    head, body = split(text)
    return head + prelude(body, names) + body


def split(text: str) -> tuple[str, str]:
    """A script's text before its BEGIN line, and after its END line."""
    start, end = text.find(BEGIN + "\n"), text.find(END + "\n")
    if start < 0 or end < start:
        raise ValueError(f"a script must hold the lines {BEGIN!r} and {END!r}, in that order")
    return text[:start], text[end + len(END) + 1 :]


def prelude(body: str, names: Names) -> str:
    """The BEGIN line, the definitions ``body`` uses (and those they use), the END line."""
    used_code = _used_code(body, names)
    scanned = "\n".join([body, *(names.code[n] for n in used_code)])
    words = _words(scanned)
    dotted = re.findall(r"(?<![\w.])([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)", scanned)
    lines = [BEGIN]
    lines += [f"local {n} = {literal(v)}" for n, v in names.values.items() if n in words]
    for table, members in names.tables.items():
        used = _members({m for t, m in dotted if t == table}, table, members)
        if used:
            lines += _table(table, {m: members[m] for m in members if m in used})
    lines += [names.code[n] for n in used_code]
    return "\n".join([*lines, END]) + "\n"


def _used_code(body: str, names: Names) -> list[str]:
    """The code definitions ``body`` uses, with those they use in turn, in ``names`` order."""
    used: set[str] = set()
    words = _words(body)
    while True:
        found = {n for n in names.code if n in words}
        if found <= used:
            return [n for n in names.code if n in used]
        used |= found
        for name in found:
            words |= _words(names.code[name])


def _words(text: str) -> set[str]:
    """The names ``text`` uses on their own (``now``, ``band_of``), not as a table's member."""
    return set(re.findall(r"(?<![\w.])([A-Za-z_][A-Za-z0-9_]*)", text))


def _members(used: set[str], table: str, members: Mapping[str, LuaValue]) -> set[str]:
    """The members of ``table`` a script uses, checked to be declared."""
    if unknown := used - set(members):
        raise ValueError(
            f"{table}.{sorted(unknown)[0]} is not declared; {table} has {', '.join(members)}"
        )
    return used


def _table(name: str, members: Mapping[str, LuaValue]) -> list[str]:
    items = [f"{_key(k)} = {literal(v)}" for k, v in members.items()]
    one_line = f"local {name} = {{{', '.join(items)}}}"
    if len(one_line) <= WIDTH:
        return [one_line]
    rows, row = [], ""
    for item in items:
        if row and len(row) + len(item) + 4 > WIDTH:
            rows.append(row)
            row = ""
        row = f"{row} {item}," if row else f"  {item},"
    return [f"local {name} = {{", *rows, row, "}"]


def _key(key: str) -> str:
    return key if _IDENT.match(key) and key not in _LUA_KEYWORDS else f"[{literal(key)}]"
