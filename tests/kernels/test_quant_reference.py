"""The torch references of kernels/quant_reference.py against the gguf package's own dequantize,
on tensors of the bundled Q4_1 file and on blocks gguf quantizes from random weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels import quant_reference as qr
from worker.models.loader import bundled_model_path

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize, quantize  # noqa: E402


@pytest.mark.parametrize("fmt", [qr.Q4_0, qr.Q4_1, qr.Q8_0])
@pytest.mark.parametrize(("n", "k"), [(1, 32), (7, 96), (33, 160)])
def test_dequantize_matches_gguf_on_quantized_random(fmt: qr.BlockFormat, n: int, k: int) -> None:
    weights = np.random.default_rng(n * k).standard_normal((n, k)).astype(np.float32)
    blocks = quantize(weights, gguf.GGMLQuantizationType(fmt.type_id))
    assert blocks.shape == (n, k // qr.BLOCK * fmt.block_bytes)
    expected = dequantize(blocks, gguf.GGMLQuantizationType(fmt.type_id))
    ours = qr.dequantize(torch.from_numpy(blocks), fmt.type_id)
    assert torch.equal(ours, torch.from_numpy(expected))
    x = torch.randn(3, k)
    torch.testing.assert_close(
        qr.quant_linear(x, torch.from_numpy(blocks), fmt.type_id), x @ torch.from_numpy(expected).T
    )


def test_dequantize_matches_gguf_on_the_bundled_file() -> None:
    reader = gguf.GGUFReader(str(bundled_model_path()))
    seen = set()
    for tensor in reader.tensors:
        type_id = int(tensor.tensor_type)
        if type_id not in qr.FORMATS or type_id in seen:
            continue
        seen.add(type_id)
        rows = np.array(tensor.data[:64])  # the first 64 rows of the first tensor of each type
        ours = qr.dequantize(torch.from_numpy(rows), type_id)
        assert torch.equal(ours, torch.from_numpy(dequantize(rows, tensor.tensor_type)))
    assert seen == {qr.Q4_1.type_id, qr.Q8_0.type_id}  # projections Q4_1, the embedding Q8_0


def test_int8_round_trip_error_is_half_a_step() -> None:
    w = torch.randn(9, 77)
    w[3] = 0.0  # an all-zero row keeps scale 1 and codes 0
    q, scale = qr.quantize_int8(w)
    assert q.dtype == torch.int8 and scale.shape == (9,) and scale[3] == 1.0
    err = (qr.dequantize_int8(q, scale) - w).abs()
    assert bool((err <= scale[:, None] / 2 + 1e-6).all())
    assert int(q.abs().amax()) == 127


def test_bad_formats_and_row_sizes_raise() -> None:
    with pytest.raises(ValueError, match="GGML type 12 has no kernel"):
        qr.block_format(12)
    with pytest.raises(ValueError, match="whole 20-byte blocks"):
        qr.in_features(torch.zeros(2, 30, dtype=torch.uint8), qr.Q4_1.type_id)
