"""Walks over a model's modules that several loaders share: a leaf module (torch only), so the
attention backends, the CPU packing and the quantizers can all import it without a cycle."""

from __future__ import annotations

from torch import nn


def named_linears(model: nn.Module) -> dict[str, tuple[nn.Module, str, nn.Linear]]:
    """Every `nn.Linear` by qualified name, with its parent and attribute name."""
    found = {}
    for parent_name, parent in model.named_modules():
        for name, child in parent.named_children():
            if type(child) is nn.Linear:
                found[f"{parent_name}.{name}".lstrip(".")] = (parent, name, child)
    return found
