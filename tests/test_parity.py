"""CPU tests of the parity harness's comparison rules: the plain tolerance, and the conditioned
rule for ill-conditioned problems (an error within a factor of the fp32 reference's own)."""
import torch

from elman.core.entry import CONDITIONED_CAP, CONDITIONED_FACTOR, ParityCase, Tolerance, passes, run_case
from elman.harness import parity

TOL = Tolerance(1e-5, 1e-4)


def logistic(x, r, steps=12):
    """A chaotic map (r near 4): over 12 steps fp32 parts from fp64 by about 1e-4, and over 40
    it loses the orbit."""
    out = []
    for _ in range(steps):
        x = r * x * (1 - x)
        out.append(x)
    return (torch.stack(out),)


def case(fast, conditioned, steps=12):
    g = torch.Generator().manual_seed(0)
    x = (0.2 + 0.6 * torch.rand(8, dtype=torch.float64, generator=g)).requires_grad_()
    r = torch.full((8,), 3.99, dtype=torch.float64).requires_grad_()
    return ParityCase({"x": x, "r": r}, lambda **a: fast(**a, steps=steps),
                      lambda **a: logistic(**a, steps=steps), ("orbit",), "cpu:test", conditioned)


def rounded_differently(x, r, steps=12):
    """The map with its product in another order: as exact as `logistic`, rounded elsewhere."""
    out = []
    for _ in range(steps):
        x = (r * x) - (r * x) * x
        out.append(x)
    return (torch.stack(out),)


def test_plain_rule_fails_a_chaotic_problem_in_fp32():
    errors = run_case(case(rounded_differently, False), torch.float32, torch.Generator().manual_seed(1))
    assert not any(k.startswith("ref:") for k in errors)
    assert not passes(errors, TOL)


def test_conditioned_rule_compares_with_the_fp32_reference():
    errors = run_case(case(rounded_differently, True), torch.float32, torch.Generator().manual_seed(1))
    own = {k[4:]: v for k, v in errors.items() if k.startswith("ref:")}
    assert set(own) == {k for k in errors if not k.startswith("ref:")}
    assert max(own.values()) > TOL.bwd  # the reference itself parts from fp64
    assert passes(errors, TOL)


def test_conditioned_rule_still_fails_a_wrong_result():
    wrong = lambda x, r, steps: tuple(o * 1.05 for o in rounded_differently(x, r, steps))
    errors = run_case(case(wrong, True), torch.float32, torch.Generator().manual_seed(1))
    assert any(errors[k] > CONDITIONED_FACTOR * errors["ref:" + k] for k in errors if not k.startswith("ref:"))
    assert not passes(errors, TOL)


def test_conditioned_rule_fails_where_the_fp32_reference_lost_the_solution():
    errors = run_case(case(rounded_differently, True, steps=40), torch.float32, torch.Generator().manual_seed(1))
    assert min(v for k, v in errors.items() if k.startswith("ref:")) > CONDITIONED_CAP * TOL.bwd
    assert not passes(errors, TOL)


def dot(x, w, c):
    """One number, c (x . w): its gradient in c is a sum that cancels (`dot_case`)."""
    return ((c * (x * w).sum()).reshape(1),)


def dot_in_another_order(x, w, c):
    """`dot` as a kernel computes it: in fp32 whatever the inputs' dtype, summed in another order."""
    y = c.float() * (x.float() * w.float()).flip(0).cumsum(0)[-1]
    return (y.reshape(1).to(x.dtype),)


def dot_case(fast, conditioned):
    """x . w at 1e-3 of the sum of its terms' sizes: rounding x and w to bf16 alone moves it by
    tens of percent."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(64, dtype=torch.float64, generator=g) + 0.5
    w = torch.randn(64, dtype=torch.float64, generator=g)
    w[-1] -= ((x * w).sum() - 1e-3 * (x * w).abs().sum()) / x[-1]
    inputs = {"x": x.requires_grad_(), "w": w.requires_grad_(), "c": torch.ones((), dtype=torch.float64).requires_grad_()}
    return ParityCase(inputs, fast, dot, ("y",), "cpu:test", conditioned)


BF16 = Tolerance(2e-2, 5e-2)


def test_conditioned_rule_in_bf16_compares_with_the_reference_on_the_rounded_inputs():
    plain = run_case(dot_case(dot_in_another_order, False), torch.bfloat16, torch.Generator().manual_seed(1))
    assert plain["grad:c"] > BF16.bwd and not passes(plain, BF16)
    errors = run_case(dot_case(dot_in_another_order, True), torch.bfloat16, torch.Generator().manual_seed(1))
    assert errors["ref:grad:c"] > BF16.bwd  # the rounded inputs alone miss the tolerance
    assert errors["ref:grad:x"] < 1e-2  # a sum that does not cancel stays near bf16's rounding
    assert passes(errors, BF16)


def test_conditioned_rule_in_bf16_still_fails_a_wrong_gradient():
    def wrong(x, w, c):  # the right value, a gradient in x 20 % off
        y = dot_in_another_order(x, w, c)[0]
        return (y + 0.2 * (c * (x * w).sum() - (c * (x * w).sum()).detach()).reshape(1),)
    errors = run_case(dot_case(wrong, True), torch.bfloat16, torch.Generator().manual_seed(1))
    assert errors["grad:x"] > CONDITIONED_FACTOR * errors["ref:grad:x"]
    assert not passes(errors, BF16)


def test_passes_reads_each_error_against_its_own_bound():
    assert passes({"fwd:o": 1e-5, "grad:x": 1e-4}, TOL)
    assert not passes({"fwd:o": 2e-5, "grad:x": 1e-6}, TOL)
    assert not passes({"fwd:o": 1e-6, "grad:x": 2e-4}, TOL)
    assert passes({"fwd:o": 1e-6, "grad:x": 2e-4, "ref:grad:x": 1e-4}, TOL)
    assert not passes({"fwd:o": 1e-6, "grad:x": 5e-4, "ref:grad:x": 1e-4}, TOL)
    assert not passes({"fwd:o": 1e-6, "grad:x": 2e-2, "ref:grad:x": 1e-2}, TOL)  # past the cap


def test_table_states_the_conditioned_bound():
    m = {"errors": {}, "max_fwd": 1e-6, "max_bwd": 3e-4, "tol_fwd": 1e-5, "tol_bwd": 1e-4, "passed": True,
         "reference_fwd": 2e-6, "reference_bwd": 1e-4}
    rec = {"variant": "E88", "impl": "cuda:layer[nol2]", "params": {"T": 19, "dtype": "float32"}, "metrics": m}
    text = parity.table([rec])
    assert "error of the fp32 reference on the same inputs (2.0e-06 / 1.0e-04) up to 100x" in text and "| pass |" in text
