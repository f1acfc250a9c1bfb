"""Schedule-free AdamW with its update fused: `schedulefree.AdamWScheduleFree` (1.4.1), whose
step is ten foreach passes over every parameter, each reading and writing fp32 tensors the
size of the model, computed instead in one pass per parameter group: read y, grad,
exp_avg_sq and z once, write y, exp_avg_sq and z once. On CUDA that pass is one launch of a
Triton kernel over all the group's tensors (`_sf_adamw`: a table of their addresses, one
program per block of BLOCK elements); elsewhere, and for a group with a non-contiguous
tensor, it is the same arithmetic in PyTorch (`_update`).

The step's host-side bookkeeping (warmup, bias correction, the running maximum of the learning
rate, the averaging weight) is schedulefree's, line for line, and its state (z, exp_avg_sq and
the group keys) is the same, so checkpoints, `train()` and `eval()` are unchanged. The update
per parameter, with c = ckp1 (the averaging weight) and the learning rate lr:

    v <- beta2 v + (1 - beta2) g^2
    u  = g / (sqrt(v / (1 - beta2^(k+1))) + eps) + decay y
    y <- lerp(y, z, c) + lr (beta1 (1 - c) - 1) u
    z <- z - lr u

Unlike the library it leaves p.grad as it was (the library divides it in place). The scalars
and the address table travel to the device through pinned memory, without a host wait.
"""
from __future__ import annotations

import schedulefree
import torch
import triton
import triton.language as tl

BLOCK = 1024  # elements per Triton program


def _update(ys: list[torch.Tensor], gs: list[torch.Tensor], vs: list[torch.Tensor],
            zs: list[torch.Tensor], s: torch.Tensor, ok: torch.Tensor) -> None:
    """The update above in PyTorch where `ok` (a 0-d bool tensor) is true, nothing where it is
    false; s = [beta2, 1 - beta2^(k+1), eps, decay, ckp1, lr (beta1 (1 - ckp1) - 1), lr]
    (fp32, on the tensors' device)."""
    beta2, correction, eps, decay, ckp1, y_step, lr = s.unbind()
    keep, ckp1 = torch.where(ok, beta2, 1.0), torch.where(ok, ckp1, 0.0)
    for y, g, v, z in zip(ys, gs, vs, zs):
        v.mul_(keep).add_(torch.where(ok, g * g * (1 - beta2), 0.0))
        u = torch.where(ok, g / ((v / correction).sqrt() + eps) + decay * y, 0.0)
        y.lerp_(z, ckp1).add_(y_step * u)
        z.sub_(lr * u)


@triton.jit
def _sf_adamw(addresses, sizes, tensor_of_block, start_of_block, s, ok, n_tensors, BLOCK: tl.constexpr):
    """One block of one tensor: `addresses` holds the y, g, v and z addresses of the group's
    n_tensors tensors (int64, in that order), `s` and `ok` are `_update`'s."""
    b = tl.program_id(0)
    t = tl.load(tensor_of_block + b)
    offs = tl.load(start_of_block + b) + tl.arange(0, BLOCK)
    mask = (offs < tl.load(sizes + t)) & (tl.load(ok) != 0)
    y_ptr = tl.load(addresses + t).to(tl.pointer_type(tl.float32))
    g_ptr = tl.load(addresses + n_tensors + t).to(tl.pointer_type(tl.float32))
    v_ptr = tl.load(addresses + 2 * n_tensors + t).to(tl.pointer_type(tl.float32))
    z_ptr = tl.load(addresses + 3 * n_tensors + t).to(tl.pointer_type(tl.float32))
    beta2, correction, eps = tl.load(s), tl.load(s + 1), tl.load(s + 2)
    decay, ckp1, y_step, lr = tl.load(s + 3), tl.load(s + 4), tl.load(s + 5), tl.load(s + 6)
    y = tl.load(y_ptr + offs, mask=mask)
    g = tl.load(g_ptr + offs, mask=mask)
    v = tl.load(v_ptr + offs, mask=mask)
    z = tl.load(z_ptr + offs, mask=mask)
    v = v * beta2 + g * g * (1 - beta2)
    u = tl.div_rn(g, tl.sqrt_rn(tl.div_rn(v, correction)) + eps) + decay * y
    lerped = tl.where(ckp1 < 0.5, y + ckp1 * (z - y), z - (z - y) * (1 - ckp1))  # torch.lerp's
    tl.store(y_ptr + offs, lerped + y_step * u, mask=mask)
    tl.store(v_ptr + offs, v, mask=mask)
    tl.store(z_ptr + offs, z - lr * u, mask=mask)


def _to(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    t = torch.tensor(values, dtype=dtype)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t


class _Blocks:
    """The block tables of one group's tensor sizes and its tensors' addresses, on the
    device (built once per group)."""

    def __init__(self, sizes: list[int], device: torch.device):
        counts = [triton.cdiv(n, BLOCK) for n in sizes]
        self.key = tuple(sizes)
        self.sizes = torch.tensor(sizes, dtype=torch.int32, device=device)
        self.tensor_of_block = torch.repeat_interleave(
            torch.arange(len(sizes), dtype=torch.int32), torch.tensor(counts)).to(device)
        self.start_of_block = torch.cat([torch.arange(c, dtype=torch.int32) * BLOCK for c in counts]).to(device)
        self._addresses: tuple[tuple[int, ...], torch.Tensor] | None = None

    def addresses(self, *groups: list[torch.Tensor]) -> torch.Tensor:
        """The tensors' addresses on the device, copied only when they change (in eager
        training the gradients are new tensors each step; in a CUDA graph they stay)."""
        ptrs = tuple(t.data_ptr() for group in groups for t in group)
        if self._addresses is None or self._addresses[0] != ptrs:
            self._addresses = ptrs, _to(list(ptrs), torch.int64, groups[0][0].device)
        return self._addresses[1]


def _kernel_update(ys, gs, vs, zs, s: torch.Tensor, ok: torch.Tensor, blocks: _Blocks) -> None:
    """`_update` as one launch of `_sf_adamw` over the group's tensors (contiguous fp32)."""
    _sf_adamw[(blocks.tensor_of_block.numel(),)](blocks.addresses(ys, gs, vs, zs), blocks.sizes,
                                                 blocks.tensor_of_block, blocks.start_of_block, s,
                                                 ok, len(ys), BLOCK=BLOCK)


class AdamWScheduleFree(schedulefree.AdamWScheduleFree):
    """schedulefree's AdamWScheduleFree with the fused update (module docstring); `fused=False`
    is the library's own step.

    `step(finite=t)` with t a 0-d bool tensor on the device (the trainer's: loss and gradient
    norm finite) applies the update only where t is true, without reading t on the host: a
    step the trainer is about to stop at changes no parameter or moment (its k still counts).
    The library's step (fused=False) reads t on the host instead."""

    def __init__(self, params, fused: bool = True, **kwargs):
        super().__init__(params, **kwargs)
        self.fused = fused
        self._blocks: dict[int, _Blocks] = {}

    @torch.no_grad()
    def step(self, closure=None, finite: torch.Tensor | None = None):
        if not self.fused or closure is not None:
            if finite is not None and not bool(finite):
                return None
            return super().step(closure)
        if not self.param_groups[0]["train_mode"]:
            raise RuntimeError("the optimizer is not in train mode: call opt.train() before "
                               "stepping (and opt.eval() before evaluating)")
        for i, group in enumerate(self.param_groups):
            active = [p for p in group["params"] if p.grad is not None]
            scalars = self._advance(group)
            if not active:
                continue
            for p in active:
                if p.grad.is_sparse or p.dtype != torch.float32 or p.grad.dtype != torch.float32:
                    raise ValueError("the fused schedule-free step takes dense fp32 parameters "
                                     "and gradients (use fused=False otherwise)")
                if "z" not in self.state[p]:
                    self.state[p]["z"] = torch.clone(p, memory_format=torch.preserve_format)
                    self.state[p]["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            tensors = (active, [p.grad for p in active], [self.state[p]["exp_avg_sq"] for p in active],
                       [self.state[p]["z"] for p in active])
            device = active[0].device
            s = _to(scalars, torch.float32, device)
            ok = finite if finite is not None else torch.ones((), dtype=torch.bool, device=device)
            if device.type == "cuda" and all(t.is_contiguous() and t.numel() < 2 ** 31
                                             for group_tensors in tensors for t in group_tensors):
                sizes = [p.numel() for p in active]
                if i not in self._blocks or self._blocks[i].key != tuple(sizes):
                    self._blocks[i] = _Blocks(sizes, device)
                _kernel_update(*tensors, s, ok, self._blocks[i])
            else:
                _update(*tensors, s, ok)
        return None

    @staticmethod
    def _advance(group: dict) -> list[float]:
        """schedulefree 1.4.1's per-step bookkeeping of one group (it updates the group's k,
        scheduled_lr, lr_max and weight_sum as the library does); returns `_update`'s scalars."""
        beta1, beta2 = group["betas"]
        k, warmup = group["k"], group["warmup_steps"]
        sched = (k + 1) / warmup if k < warmup else 1.0
        correction = 1 - beta2 ** (k + 1)
        lr = group["lr"] * sched
        group["scheduled_lr"] = lr
        lr_max = group["lr_max"] = max(lr, group["lr_max"])
        weight = ((k + 1) ** group["r"]) * (lr_max ** group["weight_lr_power"])
        weight_sum = group["weight_sum"] = group["weight_sum"] + weight
        ckp1 = weight / weight_sum if weight_sum else 0.0
        group["k"] = k + 1
        return [beta2, correction, group["eps"], group["weight_decay"], ckp1,
                lr * (beta1 * (1 - ckp1) - 1), lr]
