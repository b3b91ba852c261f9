"""The tensors of a GGUF file: name, GGML type and raw bytes, without parsing its metadata.

``gguf.GGUFReader`` builds a numpy view of every metadata value, which for the bundled file is
the tokenizer (49,152 tokens and 48,900 merges as strings): 3-10 s on our 2 cores before the
first tensor, at every engine start. Here the metadata is skipped over (string lengths read,
strings not decoded) and only ``general.alignment`` is kept, as the format requires: under
0.1 s. Layout (GGUF v2/v3): magic, version, tensor count, metadata count; metadata entries
(key, type, value); tensor infos (name, dims, type, offset); the data, aligned.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import NamedTuple

import numpy as np

from kernels import quant_reference as qr

_SCALAR = {
    0: 1,
    1: 1,
    2: 2,
    3: 2,
    4: 4,
    5: 4,
    6: 4,
    7: 1,
    10: 8,
    11: 8,
    12: 8,
}  # GGUF value type -> bytes
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_FLOAT_BYTES = {0: 4, 1: 2, 30: 2}  # F32, F16, BF16


class GGUFTensor(NamedTuple):
    name: str
    type_id: int
    rows: int  # product of every dimension but the first
    row_bytes: int
    data: np.ndarray  # (rows, row_bytes) uint8, a read-only view of the mapped file


class _Cursor:
    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos = buf, 0

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return int(value)

    def string(self) -> str:
        n = self.take("Q")
        self.pos += n
        return bytes(self.buf[self.pos - n : self.pos]).decode("utf-8")

    def skip_value(self, kind: int) -> None:
        if kind == _STRING:
            n = self.take("Q")  # not `pos += take()`: that adds to pos as it was before take
            self.pos += n
        elif kind == _ARRAY:
            item, count = self.take("I"), self.take("Q")
            if item in _SCALAR:
                self.pos += _SCALAR[item] * count
            else:
                for _ in range(count):
                    self.skip_value(item)
        elif kind in _SCALAR:
            self.pos += _SCALAR[kind]
        else:
            raise ValueError(f"GGUF metadata of unknown type {kind}")


def read_tensors(path: Path) -> dict[str, GGUFTensor]:
    """Every tensor of the GGUF file at ``path`` whose row size we know (block formats here,
    F32/F16/BF16), by name; the file stays mapped while any returned view lives."""
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    cur = _Cursor(buf)
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError(f"{path.name} is not a GGUF file")
    cur.pos = 4
    version, num_tensors, num_kv = cur.take("I"), cur.take("Q"), cur.take("Q")
    if version < 2:
        raise ValueError(f"{path.name}: GGUF version {version} is not supported (2 or 3)")
    alignment = 32
    for _ in range(num_kv):
        key, kind = cur.string(), cur.take("I")
        if key == "general.alignment" and kind == _UINT32:
            alignment = cur.take("I")
        else:
            cur.skip_value(kind)
    infos = []
    for _ in range(num_tensors):
        name = cur.string()
        dims = [cur.take("Q") for _ in range(cur.take("I"))]
        infos.append((name, dims, cur.take("I"), cur.take("Q")))
    start = -(-cur.pos // alignment) * alignment
    data = np.frombuffer(buf, dtype=np.uint8)
    tensors = {}
    for name, dims, type_id, offset in infos:
        row_bytes = _row_bytes(dims[0], type_id)
        if row_bytes is None:
            continue
        rows = int(np.prod(dims[1:], dtype=np.int64)) if len(dims) > 1 else 1
        view = data[start + offset : start + offset + rows * row_bytes].reshape(rows, row_bytes)
        tensors[name] = GGUFTensor(name, type_id, rows, row_bytes, view)
    return tensors


def _row_bytes(k: int, type_id: int) -> int | None:
    if type_id in qr.FORMATS:
        return k // qr.BLOCK * qr.block_format(type_id).block_bytes
    return k * _FLOAT_BYTES[type_id] if type_id in _FLOAT_BYTES else None
