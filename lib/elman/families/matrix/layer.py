"""What the matrix variants' layers share beyond the core: the check that no parameter was
replaced by one of another shape since construction."""
from __future__ import annotations

from torch import nn


def remember_shapes(layer: nn.Module) -> None:
    """Record every parameter's shape (call at the end of __init__)."""
    layer._shapes = {name: p.shape for name, p in layer.named_parameters()}


def check_parameters(layer: nn.Module) -> None:
    """A clear error for a parameter replaced by one of another shape since construction."""
    for name, p in layer.named_parameters():
        if p.shape != layer._shapes.get(name, p.shape):
            raise ValueError(f"parameter {name} has shape {tuple(p.shape)}; the layer was built "
                             f"with {tuple(layer._shapes[name])}")
