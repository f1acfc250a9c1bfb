"""Which kernel path every layer of a model ran (`elman train` records it).

The kernel-family ops keep a module-level dict `last_path` ({"forward": ..., "backward":
...}) that says which implementation their last call used. `PathProbe` hooks each layer of
a LadderLM: before a layer's forward it empties every loaded family's dict, after it
copies what the layer's call wrote. The backward pass runs the layers in reverse and
leaves, per family, the path of its last backward call; the probe reports those per
family. A layer whose forward called no family op ran the reference backend ("reference"),
or is a baseline, which names the library path it runs in its `impl` (mamba2
"mamba-ssm-2.3.2:ssd-triton", llama "torch:sdpa", ...); else it ran PyTorch code ("pytorch").
"""
from __future__ import annotations

import sys

import torch

FAMILY_PREFIX = "elman.families."


def op_paths() -> dict[str, dict]:
    """The `last_path` dicts of the loaded family op modules, by module name (no import)."""
    return {name.removeprefix(FAMILY_PREFIX): mod.last_path
            for name, mod in list(sys.modules.items())
            if name.startswith(FAMILY_PREFIX) and isinstance(getattr(mod, "last_path", None), dict)}


class PathProbe:
    """Hooks on model.layers that record each layer's forward kernel path; `result()` after
    one forward and backward, `close()` to remove the hooks."""

    def __init__(self, model: torch.nn.Module):
        self.layers = list(getattr(model, "layers", []))
        self.forward: dict[int, dict[str, str]] = {}
        self.handles = []
        for i, layer in enumerate(self.layers):
            self.handles.append(layer.register_forward_pre_hook(self._clear))
            self.handles.append(layer.register_forward_hook(self._record(i)))

    @staticmethod
    def _clear(module, args) -> None:
        for d in op_paths().values():
            d.clear()

    def _record(self, i: int):
        def hook(module, args, output) -> None:
            self.forward[i] = {name: d["forward"] for name, d in op_paths().items() if "forward" in d}
        return hook

    def result(self) -> dict:
        """{"layers": [{"layer", "backend", "forward"}], "backward": {op module: path}}."""
        layers = []
        for i, layer in enumerate(self.layers):
            ran = self.forward.get(i, {})
            backend = getattr(layer, "backend", None)
            layers.append({"layer": type(layer).__name__, "backend": backend,
                           "forward": ran or ("reference" if backend == "reference"
                                                  else getattr(layer, "impl", None) or "pytorch")})
        backward = {name: d["backward"] for name, d in op_paths().items() if "backward" in d}
        return {"layers": layers, "backward": backward}

    def close(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


def summary(paths: dict) -> str:
    """One line: the distinct forward paths and how many layers ran each."""
    counts: dict[str, int] = {}
    for layer in paths.get("layers", []):
        f = layer["forward"]
        key = f if isinstance(f, str) else ",".join(f"{k}:{v}" for k, v in sorted(f.items()))
        counts[key] = counts.get(key, 0) + 1
    return "; ".join(f"{k} x{n}" for k, n in counts.items()) or "-"
