"""Peak memory and time of training steps of a LadderLM, as the trainer runs them: its own
model and optimizer (`train.build`: fp32 master weights, schedule-free AdamW), the forward under
bf16 autocast, cross-entropy in fp32, gradient clipping and the optimizer step, on random bytes.
One record of kind 'bench', measure 'lm_step': the peak memory of the steps above what was
allocated before the model was built (weights, gradients, optimizer state and activations), the
median step time and tokens/s. The E88 chapter compares a 480M E88 with Gated DeltaNet at equal
parameters this way (issue: peak training memory no more than 1.5x the baseline's)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core import records
from . import train
from .lm import n_params


def lm_step_record(level: str, dim: int, depth: int, expansion: float = 1.0, batch: int = 16,
                   seq: int = 512, options: dict | None = None, steps: int = 6) -> dict:
    """Run `steps` training steps (the first two warm up and are not timed) and record them."""
    if not torch.cuda.is_available():
        raise RuntimeError("lm_step_record measures GPU memory: it needs a CUDA device")
    if steps < 3:
        raise ValueError(f"steps must be at least 3 (two warm-up steps and one timed), got {steps}")
    device = torch.device("cuda")
    opts = [f"{k}={v}" for k, v in (options or {}).items()]
    cfg = {**train.DEFAULTS, "level": level, "dim": dim, "depth": depth, "expansion": expansion,
           "option": opts, "batch": batch, "seq": seq}
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    model, opt = train.build(cfg, device)
    g = torch.Generator(device=device).manual_seed(0)
    data = torch.randint(0, 256, (batch, seq + 1), device=device, generator=g)
    times = []
    for i in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(data[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), data[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        end.record()
        end.synchronize()
        if i >= 2:
            times.append(start.elapsed_time(end))
    peak = (torch.cuda.max_memory_allocated(device) - base) / 2 ** 20
    times.sort()
    median = times[len(times) // 2]
    rec = records.make("bench", model.level, f"lm:{model.backend}",
                       {"measure": "lm_step", "dim": dim, "depth": depth, "expansion": expansion,
                        "B": batch, "T": seq, "dtype": "bfloat16", "options": dict(options or {}),
                        "n_params": n_params(model)},
                       {"peak_mem_mb": peak, "step_ms": median,
                        "tokens_per_s": batch * seq / (median / 1000), "loss": float(loss)})
    del model, opt, logits, loss
    torch.cuda.empty_cache()
    return rec
