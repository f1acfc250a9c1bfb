"""One training step of a LadderLM as the trainer and the step probes take it, without any host
synchronisation: the forward under autocast, fp32 cross-entropy, backward and gradient
clipping (`TrainStep.__call__`, which returns the loss and the pre-clip gradient norm as
device tensors), then the optimizer step (`TrainStep.update`), schedule-free AdamW
(`optim.AdamWScheduleFree`) guarded on the device: it changes nothing unless the loss and the
norm are finite, so the trainer can queue it before it reads them on the host.

`graph=True` captures the forward, backward and clipping of one fixed batch shape in a CUDA
graph on the first call and replays it afterwards (the batch is copied into the graph's
static input). The optimizer stays outside the graph: schedule-free AdamW computes its
learning rate, warmup factor and averaging weight on the host every step, and a graph would
replay the values of the step it captured. The arithmetic is the eager step's: the same
kernels on the same tensors. What capture needs:
- static shapes (one B and T) and no host synchronisation inside the step (none here: the
  loss and norm stay on the device, clipping never reads the norm on the host);
- kernels that neither allocate outside PyTorch's allocator nor synchronise (the dense
  family's persistent path allocates its exchange buffer with `at::empty` and launches with
  `cudaLaunchKernelEx`; its `graph` path cannot run inside a capture, so `plan` picks
  `steps` there, a slower path: where the persistent kernel does not take the size, capture
  does not pay);
- autocast without its weight-cast cache (PyTorch's rule for autocast inside a capture; the
  cache changes no value);
- gradients that stay the graph's tensors: after capture `update` never sets them to None,
  and each replay's backward writes them afresh (captured from None, so it assigns rather
  than accumulates).
Warm-up passes before capture (Triton autotuning, cuBLAS workspaces) would advance the
spectral norm's power-iteration vectors; every buffer is put back afterwards, so the first
replayed step starts from the state the eager step would.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from .lm import next_byte_loss
from .optim import AdamWScheduleFree

WARMUP_PASSES = 2  # eager forward+backward passes on a side stream before capture


def loss_of(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Mean next-byte cross-entropy in fp32 of windows [B, T+1] (the logits cast up once, in
    their storage order: `lm.next_byte_loss`)."""
    return next_byte_loss(model(batch[:, :-1]), batch)


class TrainStep:
    """`step(batch) -> (loss, grad_norm)` (device tensors; forward, backward, clipping), then
    `step.update()` (optimizer step and, in eager mode, gradients to None).

    `forward` is the module to call (the DDP wrapper, if any; default `model`), `clip` the
    max gradient norm, `dtype` the autocast dtype (None: no autocast). With `marks` (a list),
    a recorded CUDA event is appended before the forward and after each phase (forward,
    backward, clip; `update` adds one after the optimizer); in graph mode the forward,
    backward and clip are one replay, so only its start and end are marked."""

    def __init__(self, model: torch.nn.Module, opt: AdamWScheduleFree, clip: float,
                 dtype: torch.dtype | None = torch.bfloat16, graph: bool = False,
                 forward: Callable | None = None):
        self.model, self.opt, self.clip, self.dtype = model, opt, clip, dtype
        self.forward = forward or model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.graph_mode = graph
        self._graph: torch.cuda.CUDAGraph | None = None
        self._static: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._finite: torch.Tensor | None = None
        if graph:
            if not torch.cuda.is_available():
                raise RuntimeError("graph=True captures a CUDA graph: it needs a CUDA device")
            if forward is not None and forward is not model:
                raise ValueError("graph=True runs the model itself (no DDP wrapper: its "
                                 "gradient all-reduce hooks are not captured here)")

    def _amp(self, device_type: str, cache: bool = True):
        return torch.autocast(device_type, dtype=self.dtype or torch.float32,
                              enabled=self.dtype is not None, cache_enabled=cache)

    def _forward_backward(self, batch: torch.Tensor, marks: list | None, cache: bool = True):
        _mark(marks)
        with self._amp(batch.device.type, cache):
            loss = loss_of(self.forward, batch)
        _mark(marks)
        loss.backward()
        _mark(marks)
        gnorm = torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        finite = torch.isfinite(loss.detach()) & torch.isfinite(gnorm)
        _mark(marks)
        return loss.detach(), gnorm, finite

    def __call__(self, batch: torch.Tensor, marks: list | None = None):
        if not self.graph_mode:
            loss, gnorm, self._finite = self._forward_backward(batch, marks)
            return loss, gnorm
        if self._graph is None:
            self._capture(batch)
        static_batch, loss, gnorm, self._finite = self._static
        if batch.shape != static_batch.shape:
            raise ValueError(f"graph=True was captured for batches of shape {tuple(static_batch.shape)}, "
                             f"got {tuple(batch.shape)}")
        static_batch.copy_(batch, non_blocking=True)
        _mark(marks)
        self._graph.replay()
        _mark(marks)
        return loss, gnorm

    def update(self, marks: list | None = None) -> None:
        """The optimizer step, guarded by the last step's finiteness; in eager mode also the
        gradients to None (graph mode keeps the graph's gradient tensors, which the next replay
        overwrites)."""
        self.opt.step(finite=self._finite)
        if not self.graph_mode:
            self.opt.zero_grad(set_to_none=True)
        _mark(marks)

    def _capture(self, batch: torch.Tensor) -> None:
        buffers = list(self.model.buffers())
        saved = [b.detach().clone() for b in buffers]
        static_batch = batch.detach().clone()
        side = torch.cuda.Stream(device=batch.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_PASSES):
                self._forward_backward(static_batch, None, cache=False)
                for p in self.params:
                    p.grad = None
        torch.cuda.current_stream().wait_stream(side)
        with torch.no_grad():
            for b, s in zip(buffers, saved):
                b.copy_(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # records the kernels without running them
            loss, gnorm, finite = self._forward_backward(static_batch, None, cache=False)
        self._graph, self._static = graph, (static_batch, loss, gnorm, finite)


def _mark(marks: list | None) -> None:
    if marks is not None:
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        marks.append(e)
