"""How often rounding the inputs to bf16 alone puts E88's decay gradient past the bf16 parity
tolerance, at T = B = H = 1, n = v = 8 (CPU, no kernel).

At that shape the decay's gradient is one number, a sum over the 64 state entries that can
cancel. Each draw runs the reference in fp64 on the harness's random inputs (and a random
upstream gradient), then in fp32 on the same inputs rounded to bf16, and compares the decay
gradients as the parity harness does. The fraction past 5e-2 is the rate at which an exact
kernel on bf16 inputs would fail the plain rule; it is why E88's core cases are conditioned
(elman.variants.e88.CONDITIONED).

    PYTHONPATH=lib python dev/e88_bf16_cancellation.py [draws]
"""
import sys

import torch
from tqdm import tqdm

from elman.core.entry import rel_error
from elman.families.matrix.inputs import random_inputs
from elman.variants.e88 import reference

NAMES = ("q", "k", "v", "decay", "beta", "h0")


def decay_gradient_error(generator: torch.Generator) -> float:
    exact = random_inputs(1, 1, 1, 8, 8, NAMES, "cpu", generator)
    o, S = reference(**exact)
    d_o = torch.randn(o.shape, dtype=torch.float64, generator=generator)
    d_S = torch.randn(S.shape, dtype=torch.float64, generator=generator)
    torch.autograd.backward([o, S], [d_o, d_S])
    rounded = {k: t.detach().to(torch.bfloat16).float().requires_grad_() for k, t in exact.items()}
    o2, S2 = reference(**rounded)
    torch.autograd.backward([o2, S2], [d_o.to(torch.bfloat16).float(), d_S.float()])
    return rel_error(rounded["decay"].grad, exact["decay"].grad)


def main(draws: int = 4000) -> None:
    generator = torch.Generator().manual_seed(1)
    errors = torch.tensor([decay_gradient_error(generator) for _ in tqdm(range(draws), desc="draws")])
    print(f"{draws} draws: median {errors.median():.1e}, past 1e-2 {(errors > 1e-2).float().mean():.1%}, "
          f"past 5e-2 (the bf16 tolerance) {(errors > 5e-2).float().mean():.1%}, largest {errors.max():.2f}")


if __name__ == "__main__":
    main(*map(int, sys.argv[1:]))
