"""float8 e4m3fn / e5m2 in the frontend: torch's promotion (a float8 type promotes with no other
type), arithmetic refused with an error that asks for the cast, data movement and casts taken."""
import itertools

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.frontend import FusionDefinitionError
from pyfuser.ir.dtype import PromotionError, parse_dtype, promote, result_type, to_torch

E4M3, E5M2 = DataType.Float8_e4m3fn, DataType.Float8_e5m2
ALL = [DataType.Bool, DataType.Int32, DataType.Int, DataType.Half, DataType.BFloat16,
       DataType.Float, DataType.Double, E4M3, E5M2]


@pytest.mark.parametrize("a, b", list(itertools.combinations_with_replacement(ALL, 2)))
def test_promotion_is_torchs(a, b):
    try:
        want = torch.promote_types(to_torch(a), to_torch(b))
    except RuntimeError:
        with pytest.raises(PromotionError):
            promote(a, b)
        return
    assert to_torch(promote(a, b)) == want


def test_a_number_keeps_a_float8_tensor_float8():
    for dt in (E4M3, E5M2):
        t = torch.zeros(2, dtype=to_torch(dt))
        for number, kind in ((2.0, DataType.Double), (2, DataType.Int), (True, DataType.Bool)):
            assert to_torch(result_type([dt], [kind])) == torch.result_type(t, number)


def test_names_and_torch_dtypes():
    assert parse_dtype("e4m3") == parse_dtype(torch.float8_e4m3fn) == E4M3
    assert parse_dtype("fp8_e5m2") == parse_dtype("float8_e5m2") == E5M2
    assert E4M3.size == E5M2.size == 1 and E4M3.is_floating and E4M3.is_float8
    with FusionDefinition() as fd:
        t = fd.from_pytorch(torch.zeros(3, 4, dtype=torch.float8_e5m2))
        fd.add_output(fd.ops.set(t))
    assert t.dtype == E5M2


ARITHMETIC = {
    "add": lambda o, x, y: o.add(x, y),
    "mul by a number": lambda o, x, y: o.mul(x, 2.0),
    "add to float32": lambda o, x, y: o.add(x, o.cast(y, DataType.Float)),
    "div": lambda o, x, y: o.div(x, y),
    "lt": lambda o, x, y: o.lt(x, 0.5),
    "neg": lambda o, x, y: o.neg(x),
    "abs": lambda o, x, y: o.abs(x),
    "exp": lambda o, x, y: o.exp(x),
    "gelu": lambda o, x, y: o.gelu(x),
    "logical_not": lambda o, x, y: o.logical_not(x),
    "sum": lambda o, x, y: o.sum(x, [1]),
    "max": lambda o, x, y: o.max(x),
    "mean": lambda o, x, y: o.mean(x, [0]),
    "var_mean": lambda o, x, y: o.var_mean(x, [1]),
    "argmax": lambda o, x, y: o.argmax(x, 1),
    "cumsum": lambda o, x, y: o.cumsum(x, 1),
    "topk": lambda o, x, y: o.topk(x, 2, 1),
}


@pytest.mark.parametrize("name", sorted(ARITHMETIC))
def test_arithmetic_on_float8_asks_for_a_cast(name):
    with pytest.raises(FusionDefinitionError, match="cast it first|cast explicitly"):
        with FusionDefinition() as fd:
            x = fd.define_tensor([-1, -1], dtype=E4M3)
            y = fd.define_tensor([-1, -1], dtype=E4M3)
            ARITHMETIC[name](fd.ops, x, y)


def test_float8_scalars_and_factories_are_refused():
    cases = [
        lambda fd: fd.define_scalar(dtype=E4M3),
        lambda fd: fd.define_scalar(1.0, dtype=E5M2),
        lambda fd: fd.ops.cast(fd.define_scalar(dtype=DataType.Float), E4M3),
        lambda fd: fd.ops.full([4], 1.0, E4M3),
        lambda fd: fd.ops.iota(4, dtype=E4M3),
        lambda fd: fd.ops.uniform(0.0, 1.0, [4], dtype=E5M2),
        lambda fd: fd.ops.cat([fd.define_tensor([-1], dtype=E4M3),
                               fd.define_tensor([-1], dtype=DataType.BFloat16)], 0),
        lambda fd: fd.ops.cat([fd.define_tensor([-1], dtype=E4M3),
                               fd.define_tensor([-1], dtype=E5M2)], 0),
    ]
    for case in cases:
        with pytest.raises(FusionDefinitionError, match="float8"):
            with FusionDefinition() as fd:
                case(fd)


def test_casts_and_data_movement_take_float8():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=E4M3)
        m = fd.define_tensor([-1, -1], dtype=DataType.Bool)
        i = fd.define_tensor([-1], dtype=DataType.Int)
        moved = [fd.ops.permute(x, [1, 0]), fd.ops.reshape(x, [-1]), fd.ops.set(x),
                 fd.ops.broadcast(x, [True, False, False]), fd.ops.slice(x, [0, 1], [2, 3]),
                 fd.ops.pad(x, [1, 1]), fd.ops.cat([x, x], 0), fd.ops.where(m, x, x),
                 fd.ops.index_select(x, i, 0), fd.ops.cast(x, E5M2)]
        widened = fd.ops.cast(x, DataType.Float)
        fd.add_output(widened)
    assert all(t.dtype == E4M3 for t in moved[:-1]) and moved[-1].dtype == E5M2
    assert widened.dtype == DataType.Float
