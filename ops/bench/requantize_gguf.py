"""A GGUF file in another block format, for benchmarks: the same model, metadata and tokenizer,
its quantized projections re-encoded as Q8_0 or Q4_0.

    python ops/bench/requantize_gguf.py OUT.gguf --format q8_0            # from the bundled file
    python ops/bench/requantize_gguf.py OUT.gguf --format q4_0 --src IN.gguf

Only one model file ships with the project (SmolLM2-135M in Q4_1, its tied table in Q8_0), and
nothing may download weights at run time; a Q8_0 or Q4_0 file of the same model is what lets the
engine, llama.cpp and the kernels' other formats run end to end on the same weights. The tensors
in the source's most common quantized format (the projections) are dequantized by the gguf
package and quantized again by it (llama.cpp's rounding); the rest are copied as they are: the
norms in float, and the tied table in its own format (Q8_0 here, as llama.cpp's quantizer keeps
the output table at 6 bits or more in a Q4_0 file). The values are the Q4_1 file's, rounded again:
speed is the target format's, quality is at best the source's (ops/bench/perplexity.py measures
quality from the float weights instead). ``general.file_type`` names the new format, as
llama.cpp's own ``llama-quantize`` writes it.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np

# Run as a script: put the repository first so `worker` imports without an install.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import gguf

from worker.models.loader import bundled_model_path

# The block formats this writes, and llama.cpp's file type for a file "mostly" in each.
TARGETS: dict[str, tuple[gguf.GGMLQuantizationType, gguf.LlamaFileType]] = {
    "q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "q4_0": (gguf.GGMLQuantizationType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
}
FLOAT_TYPES = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)


def copy_metadata(
    reader: gguf.GGUFReader, writer: gguf.GGUFWriter, file_type: gguf.LlamaFileType
) -> None:
    """Every key the source holds, but the ones the writer writes itself, with the new file type."""
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # the writer's own header fields
        kind = field.types[0]
        value = int(file_type) if field.name == gguf.Keys.General.FILE_TYPE else field.contents()
        item = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, kind, sub_type=item)


def projection_format(reader: gguf.GGUFReader) -> gguf.GGMLQuantizationType:
    """The quantized format most of the file's tensors are in: its projections'."""
    kinds = Counter(t.tensor_type for t in reader.tensors if t.tensor_type not in FLOAT_TYPES)
    if not kinds:
        raise SystemExit("no quantized tensors: nothing to re-encode")
    return kinds.most_common(1)[0][0]


def recoded(tensor: gguf.ReaderTensor, target: gguf.GGMLQuantizationType) -> np.ndarray:
    """The tensor's bytes in ``target``'s blocks (rows x bytes), from its dequantized values."""
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
    return gguf.quants.quantize(values, target)


def requantize(src: Path, out: Path, fmt: str) -> Counter[str]:
    """``src`` written to ``out``, its projections in ``fmt``: the formats written, counted."""
    target, file_type = TARGETS[fmt]
    reader = gguf.GGUFReader(src)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    if arch is None:
        raise SystemExit(f"{src}: no {gguf.Keys.General.ARCHITECTURE}, not a model file")
    writer = gguf.GGUFWriter(out, arch=str(arch.contents()))
    copy_metadata(reader, writer, file_type)
    source = projection_format(reader)
    written: Counter[str] = Counter()
    for tensor in reader.tensors:
        kind = tensor.tensor_type
        if kind == source and kind != target:
            writer.add_tensor(tensor.name, recoded(tensor, target), raw_dtype=target)
            kind = target
        else:
            writer.add_tensor(tensor.name, tensor.data, raw_dtype=kind)
        written[kind.name] += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return written


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--format", choices=sorted(TARGETS), required=True)
    p.add_argument("--src", type=Path, help="default: the bundled SmolLM2-135M Q4_1 file")
    args = p.parse_args(argv)
    src = args.src or bundled_model_path()
    written = requantize(src, args.out, args.format)
    size_mb = args.out.stat().st_size / 1e6
    print(f"{args.out}: {size_mb:.1f} MB, tensors {dict(written)} (from {src.name})")


if __name__ == "__main__":
    main()
