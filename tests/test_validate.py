"""The one validation layer (elman.core.validate) and the dense op's use of it, on the CPU:
every bad input raises a ValueError or TypeError that names the tensor, before any extension
is loaded."""
import pytest
import torch

from elman.core import validate
from elman.families.dense import op


def _cell_args(T=3, B=2, D=8, dtype=torch.float32):
    x = torch.randn(T, B, D, dtype=dtype)
    return dict(x=x, gates=(torch.randn(T, B, D, dtype=dtype),),
                w_x=torch.randn(D, D, dtype=dtype), w_h=torch.randn(D, D, dtype=dtype),
                b=torch.randn(D, dtype=dtype), h0=torch.randn(B, D, dtype=dtype))


def _raises(exc, match, **kw):
    args = {**_cell_args(), **kw}
    with pytest.raises(exc, match=match):
        op.cell("tanh_silu_gate", **args)


@pytest.mark.parametrize("shape", [(0, 2, 8), (3, 0, 8), (3, 2, 0)])
def test_empty_dimension_raises(shape):
    _raises(ValueError, r"x has an empty dimension: shape \[" + ", ".join(map(str, shape)),
            x=torch.randn(*shape))


def test_rank_raises():
    _raises(ValueError, r"x must be \[T, B, D\], got 2 dimensions", x=torch.randn(3, 8))


@pytest.mark.parametrize("name,kw,expected", [
    ("W_h", {"w_h": torch.randn(8, 4)}, r"W_h has shape \[8, 4\]; expected \[8, 8\]"),
    ("W_x", {"w_x": torch.randn(4, 8)}, r"W_x has shape \[4, 8\]; expected \[8, 8\]"),
    ("b", {"b": torch.randn(8, 1)}, r"b has shape \[8, 1\]; expected \[8\]"),
    ("h0", {"h0": torch.randn(3, 8)}, r"h0 has shape \[3, 8\]; expected \[2, 8\]"),
    ("gate", {"gates": (torch.randn(3, 1, 8),)}, r"gates\[0\] has shape \[3, 1, 8\]; expected \[3, 2, 8\]"),
])
def test_wrong_shapes_name_the_tensor(name, kw, expected):
    _raises(ValueError, expected, **kw)


def test_dtypes():
    _raises(TypeError, r"b has dtype float64; expected float32 like x", b=torch.randn(8, dtype=torch.float64))
    args = _cell_args(dtype=torch.float16)
    with pytest.raises(TypeError, match="x has dtype float16; the kernels take float32, bfloat16"):
        op.cell("tanh_silu_gate", **args)


def test_cpu_tensors_raise_with_what_to_do():
    _raises(ValueError, r"x must be a CUDA tensor .*backend='reference'")


def test_optional_tensors_are_skipped_and_path_checked():
    _raises(ValueError, "CUDA tensor", w_x=None, b=None, h0=None)  # shapes fine, device is not
    _raises(ValueError, "path must be one of", path="fast")
    with pytest.raises(TypeError, match="gates must be a tuple"):
        op.cell("tanh_silu_gate", **{**_cell_args(), "gates": torch.randn(3, 2, 8)})


def test_check_inputs_for_the_references():
    x = torch.randn(4, 2, 8)
    op.check_inputs(x, x, torch.zeros(2, 8))
    with pytest.raises(ValueError, match=r"z has shape \[4, 2, 7\]"):
        op.check_inputs(x, x[..., :7])
    with pytest.raises(ValueError, match="empty dimension"):
        op.check_inputs(x[:0])


def test_devices_and_dtypes_helpers():
    a, b = torch.zeros(2), torch.zeros(2, dtype=torch.bfloat16)
    assert validate.devices({"a": a, "b": None}, cuda=False) == torch.device("cpu")
    assert validate.dtypes({"a": a}, (torch.float32,)) == torch.float32
    with pytest.raises(TypeError, match="b has dtype bfloat16; expected float32 like a"):
        validate.dtypes({"a": a, "b": b}, (torch.float32, torch.bfloat16))


def test_size_limit_and_alignment():
    with pytest.raises(ValueError, match="B \\* D = 2147483648 is too large"):
        validate.size_limit("B * D", 2 ** 31)
    base = torch.zeros(17)
    odd = base[1:]
    assert base.data_ptr() % 16 == 0 and not validate.is_aligned(odd)
    copy = validate.aligned(odd)
    assert validate.is_aligned(copy) and torch.equal(copy, odd)
    assert validate.aligned(base) is base
    with pytest.raises(ValueError, match="storage offset 1"):
        validate.check_aligned("z", odd)
    t = torch.zeros(3, 4).t()
    assert not t.is_contiguous() and validate.contiguous(t).is_contiguous()
