"""Peak memory and time of training steps of a LadderLM, as the trainer runs them: its own
model and optimizer (`train.build`: fp32 master weights, schedule-free AdamW), the forward under
bf16 autocast, cross-entropy in fp32, gradient clipping and the optimizer step, on random bytes.
One record of kind 'bench', measure 'lm_step': the peak memory of the steps above what was
allocated before the model was built (weights, gradients, optimizer state and activations), the
median step time and tokens/s. The E88 chapter compares a 480M E88 with Gated DeltaNet at equal
parameters this way (issue: peak training memory no more than 1.5x the baseline's)."""
from __future__ import annotations

import torch

from ..core import records
from . import train
from .lm import n_params
from .step import TrainStep


def setup(level: str, dim: int, depth: int, expansion: float = 1.0, batch: int = 16, seq: int = 512,
          options: dict | None = None, norm: str = "auto"):
    """The trainer's model and optimizer (`train.build`) on the GPU and one batch of random
    windows [batch, seq + 1]: (model, opt, data, cfg)."""
    if not torch.cuda.is_available():
        raise RuntimeError("training-step probes measure the GPU: they need a CUDA device")
    device = torch.device("cuda")
    cfg = {**train.DEFAULTS, "level": level, "dim": dim, "depth": depth, "expansion": expansion,
           "option": [f"{k}={v}" for k, v in (options or {}).items()], "batch": batch, "seq": seq,
           "norm": norm}
    model, opt = train.build(cfg, device)
    g = torch.Generator(device=device).manual_seed(0)
    data = torch.randint(0, 256, (batch, seq + 1), device=device, generator=g)
    return model, opt, data, cfg


def train_step(model, opt, data: torch.Tensor, clip: float, marks: list | None = None) -> torch.Tensor:
    """One eager step as the trainer takes it (`step.TrainStep`): forward under bf16 autocast,
    fp32 cross-entropy, backward, clipping, optimizer step. With `marks`, a recorded CUDA event
    is appended before the forward and after each phase (forward, backward, clip, optimizer).
    Returns the loss (a device tensor: nothing here waits for the GPU)."""
    step = TrainStep(model, opt, clip)
    loss, _ = step(data, marks)
    step.update(marks)
    return loss


def step_params(measure: str, model, cfg: dict, options: dict | None) -> dict:
    """The record parameters of a training-step probe."""
    return {"measure": measure, "dim": cfg["dim"], "depth": cfg["depth"], "expansion": cfg["expansion"],
            "B": cfg["batch"], "T": cfg["seq"], "dtype": "bfloat16", "options": dict(options or {}),
            "n_params": n_params(model)}


def lm_step_record(level: str, dim: int, depth: int, expansion: float = 1.0, batch: int = 16,
                   seq: int = 512, options: dict | None = None, steps: int = 6) -> dict:
    """Run `steps` training steps (the first two warm up and are not timed) and record them."""
    if steps < 3:
        raise ValueError(f"steps must be at least 3 (two warm-up steps and one timed), got {steps}")
    if not torch.cuda.is_available():
        raise RuntimeError("lm_step_record measures GPU memory: it needs a CUDA device")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    model, opt, data, cfg = setup(level, dim, depth, expansion, batch, seq, options)
    times = []
    for i in range(steps):
        marks: list = []
        loss = train_step(model, opt, data, cfg["grad_clip"], marks)
        marks[-1].synchronize()
        if i >= 2:
            times.append(marks[0].elapsed_time(marks[-1]))
    peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
    times.sort()
    median = times[len(times) // 2]
    rec = records.make("bench", model.level, f"lm:{model.backend}", step_params("lm_step", model, cfg, options),
                       {"peak_mem_mb": peak, "step_ms": median,
                        "tokens_per_s": batch * seq / (median / 1000), "loss": float(loss)})
    del model, opt, loss
    torch.cuda.empty_cache()
    return rec
