"""oneDNN-prepacked projections (`worker.models.cpu_linear`) against torch's `F.linear`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from tests.models.test_architectures import save_tiny
from worker.models.cpu_linear import PackedLinear, onednn_supports, pack_linears
from worker.models.loader import load_model

pytestmark = pytest.mark.skipif(
    not onednn_supports(torch.float32), reason="this torch build has no oneDNN"
)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 48), (7, 48), (2, 5, 48), (0, 48)])
def test_packed_linear_equals_linear(bias: bool, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(48, 80, bias=bias)
    packed = PackedLinear(linear)
    x = torch.randn(*shape)
    torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)
    # A strided view (a split's output) works as well as a contiguous input.
    wide = torch.randn(3, 96)[:, ::2]
    torch.testing.assert_close(packed(wide), linear(wide), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "llama-bias"])
def test_packed_model_logits_match(tmp_path: Path, family: str) -> None:
    model_dir = save_tiny(tmp_path, family)
    plain = load_model(model_dir, torch.float32, torch.device("cpu"))
    packed = load_model(model_dir, torch.float32, torch.device("cpu"))
    # 4 projections per layer (qkv, o, gate_up, down) x 2 layers + the LM head.
    assert pack_linears(packed) == 9
    assert not any(type(m) is nn.Linear for m in packed.modules())
    if family == "llama":  # tied: the embedding table stays, only the head's copy is packed
        assert packed.embed_tokens.weight.shape == (97, 48)
    hidden = torch.randn(5, 48)
    with torch.inference_mode():
        torch.testing.assert_close(
            packed.compute_logits(hidden), plain.compute_logits(hidden), rtol=1e-4, atol=1e-4
        )
        layer_p, layer_q = packed.layers[0].mlp, plain.layers[0].mlp
        torch.testing.assert_close(layer_p(hidden), layer_q(hidden), rtol=1e-4, atol=1e-4)


def test_torch_backend_packs_nothing(tmp_path: Path) -> None:
    model = load_model(save_tiny(tmp_path, "llama"), torch.float32, torch.device("cpu"))
    assert pack_linears(model, "torch") == 0
    assert sum(type(m) is nn.Linear for m in model.modules()) == 9
