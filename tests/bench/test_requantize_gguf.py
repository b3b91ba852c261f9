"""ops/bench/requantize_gguf.py: a GGUF's projections re-encoded in another block format, the
rest of the file kept, on a small file written here."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from tests.bench.scripts import load_script

Q = gguf.GGMLQuantizationType


def write_source(path: Path) -> dict[str, np.ndarray]:
    """A llama-arch file: two Q4_1 projections (the most common format), a Q8_0 table, a norm."""
    rng = np.random.default_rng(0)
    values = {
        "blk.0.attn_q.weight": rng.standard_normal((64, 96), dtype=np.float32),
        "blk.0.ffn_up.weight": rng.standard_normal((32, 64), dtype=np.float32),
        "token_embd.weight": rng.standard_normal((40, 64), dtype=np.float32),
        "blk.0.attn_norm.weight": rng.standard_normal(64, dtype=np.float32),
    }
    kinds = {"token_embd.weight": Q.Q8_0, "blk.0.attn_norm.weight": Q.F32}
    writer = gguf.GGUFWriter(path, arch="llama")
    writer.add_name("tiny")
    writer.add_file_type(3)  # mostly Q4_1
    writer.add_context_length(128)
    writer.add_token_list(["a", "b", "c"])
    for name, value in values.items():
        kind = kinds.get(name, Q.Q4_1)
        data = value if kind == Q.F32 else gguf.quants.quantize(value, kind)
        writer.add_tensor(name, data, raw_dtype=kind)
    finish(writer)
    return values


def finish(writer: gguf.GGUFWriter) -> None:
    """Header, keys and tensors to the file, in the order GGUF lays them out."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize(("fmt", "kind"), [("q8_0", Q.Q8_0), ("q4_0", Q.Q4_0)])
def test_the_projections_change_format_and_nothing_else_changes(
    tmp_path: Path, fmt: str, kind: gguf.GGMLQuantizationType
) -> None:
    tool = load_script("requantize_gguf")
    src, out = tmp_path / "src.gguf", tmp_path / f"{fmt}.gguf"
    write_source(src)
    written = tool.requantize(src, out, fmt)
    # The table is Q8_0 already: kept, and counted with the projections where they are Q8_0 too.
    want_counts = {"Q8_0": 1, "F32": 1}
    want_counts[kind.name] = want_counts.get(kind.name, 0) + 2
    assert written == want_counts
    before, after = gguf.GGUFReader(src), gguf.GGUFReader(out)

    def value(reader: gguf.GGUFReader, key: str) -> object:
        field = reader.get_field(key)
        assert field is not None, key
        return field.contents()

    assert value(after, "general.file_type") == tool.TARGETS[fmt][1]
    for key in ("general.architecture", "general.name", "llama.context_length"):
        assert value(after, key) == value(before, key)
    assert value(after, "tokenizer.ggml.tokens") == ["a", "b", "c"]
    old = {t.name: t for t in before.tensors}
    for t in after.tensors:
        source = old[t.name]
        if source.tensor_type != Q.Q4_1:  # the table and the norm: the same bytes
            assert t.tensor_type == source.tensor_type
            assert np.array_equal(np.asarray(t.data), np.asarray(source.data))
            continue
        assert t.tensor_type == kind
        want = gguf.quants.dequantize(source.data, Q.Q4_1)
        # Exactly what the gguf package's quantizer makes of the source's values.
        assert np.array_equal(np.asarray(t.data), gguf.quants.quantize(want, kind))
        got = gguf.quants.dequantize(t.data, kind)
        assert got.shape == want.shape
        step = np.abs(want).max(axis=1, keepdims=True) / (127 if kind == Q.Q8_0 else 7)
        assert np.all(np.abs(got - want) <= step)


def test_a_file_without_quantized_tensors_is_refused(tmp_path: Path) -> None:
    tool = load_script("requantize_gguf")
    src = tmp_path / "f32.gguf"
    writer = gguf.GGUFWriter(src, arch="llama")
    writer.add_tensor("norm.weight", np.ones(8, np.float32))
    finish(writer)
    with pytest.raises(SystemExit, match="no quantized tensors"):
        tool.requantize(src, tmp_path / "out.gguf", "q8_0")
