"""fd.ops.matmul and fd.ops.linear: torch's shape rules, errors, the reference evaluator, the
library table (runtime/library.py) and the registry's refusal (library segments)."""
import warnings

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.frontend.ops import FusionDefinitionError
from pyfuser.ir.exprs import LinearOp, MatmulOp
from pyfuser.ir.id_graph import IdGraph
from pyfuser.runtime import library
from pyfuser.runtime.executor import FallbackWarning
from pyfuser.runtime.inputs import InputError
from pyfuser.runtime.reference import evaluate
from pyfuser.schedule import op_support
from pyfuser.schedule.schedulers import registry
from pyfuser.testing import TOLERANCE, rel_error

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
_DT = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16,
       torch.float16: DataType.Half}


def _rand(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def _matmul_fd(a, b):
    with FusionDefinition("mm") as fd:
        fd.add_output(fd.ops.matmul(fd.from_pytorch(a), fd.from_pytorch(b)))
    return fd


def _check_against_float64(out, ref64, dtype):
    assert out.dtype == dtype
    assert out.shape == ref64.shape
    err = rel_error(out, ref64)
    assert err <= TOLERANCE[_DT[dtype]], err


MATMUL_SHAPES = [
    ((13,), (13,)),                    # dot: a 0-d result
    ((6, 13), (13,)),                  # matrix @ vector
    ((13,), (13, 5)),                  # vector @ matrix
    ((6, 13), (13, 5)),
    ((3, 6, 13), (13, 5)),             # batched @ matrix
    ((13,), (3, 13, 5)),               # vector @ batched
    ((3, 6, 13), (13,)),               # batched @ vector
    ((2, 1, 6, 13), (4, 13, 5)),       # batch dims broadcast both ways: [2, 4, 6, 5]
    ((1, 6, 13), (3, 13, 5)),
    ((1, 1), (1, 7)),                  # K = 1, M = 1
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES)
def test_matmul_reference_matches_torch(sa, sb, dtype):
    a, b = _rand(sa, dtype, 1), _rand(sb, dtype, 2)
    fd = _matmul_fd(a, b)
    want = torch.matmul(a.double(), b.double())
    out_tv = fd.fusion.outputs[0]
    assert len(out_tv.domain.logical) == want.dim()          # no reduction ID: K is inside
    ref = evaluate(fd.fusion, [a, b], promote_to_double=True)[0]
    assert ref.dtype == torch.float64 and torch.allclose(ref, want, rtol=1e-12, atol=1e-12)
    (out,) = fd.execute([a, b])                              # CPU: the reference evaluator
    _check_against_float64(out, want, dtype)
    assert torch.equal(out, torch.matmul(a, b))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sx", [(17,), (6, 17), (2, 3, 17)])
@pytest.mark.parametrize("bias", [None, (9,), (1,)])
def test_linear_reference_matches_torch(sx, bias, dtype):
    x, w = _rand(sx, dtype, 3), _rand((9, 17), dtype, 4)
    b = _rand(bias, dtype, 5) if bias is not None else None
    with FusionDefinition("lin") as fd:
        tx, tw = fd.from_pytorch(x), fd.from_pytorch(w)
        tb = fd.from_pytorch(b) if b is not None else None
        fd.add_output(fd.ops.linear(tx, tw, tb))
    ins = [x, w] + ([b] if b is not None else [])
    want = torch.nn.functional.linear(x.double(), w.double(),
                                      b.double() if b is not None else None)
    ref = evaluate(fd.fusion, ins, promote_to_double=True)[0]
    assert torch.allclose(ref, want, rtol=1e-12, atol=1e-12)
    (out,) = fd.execute(ins)
    _check_against_float64(out, want, dtype)


def test_symbolic_sizes_take_the_call_shapes():
    """Defined with symbolic sizes, one definition serves calls of other shapes; M, N, K and
    the batch come from the inputs."""
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1, -1], dtype=DataType.Float)
        b = fd.define_tensor([-1, -1], dtype=DataType.Float)
        fd.add_output(fd.ops.matmul(a, b))
    for (bt, m, k, n) in [(2, 3, 5, 7), (1, 9, 1, 4)]:
        x, y = _rand((bt, m, k), torch.float32, 6), _rand((k, n), torch.float32, 7)
        (out,) = fd.execute([x, y])
        assert out.shape == (bt, m, n)
        _check_against_float64(out, torch.matmul(x.double(), y.double()), torch.float32)


def test_linear_bias_gelu_is_a_library_segment_and_an_epilogue_kernel():
    """The registry refuses a fusion with a linear (op_support lists it as a library op); the
    segmenter makes the linear a library segment of its own and the bias-free GELU epilogue a
    pointwise kernel, run on the interpreter: no warning, the right values."""
    import warnings
    with FusionDefinition("linear_gelu") as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
        w = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
        bias = fd.define_tensor([-1], dtype=DataType.BFloat16)
        y = fd.ops.linear(x, w, bias)
        g = fd.ops.gelu(fd.ops.cast(y, DataType.Float), approximate="tanh")
        fd.add_output(fd.ops.cast(g, DataType.BFloat16))
    ins = [_rand((33, 24), torch.bfloat16, 8), _rand((19, 24), torch.bfloat16, 9),
           _rand((19,), torch.bfloat16, 10)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        (out,) = fd.execute(ins, options={"enable": ["interpret"]})
    run = fd.last_run
    assert run.kind == "kernels" and not run.internal_error
    assert [(s.kind, s.name) for s in run.segments] == [("library", "linear"),
                                                        ("kernel", "pointwise")]
    assert run.backend == "interpreter"
    want = torch.nn.functional.gelu(
        torch.nn.functional.linear(*(t.double() for t in ins)), approximate="tanh")
    _check_against_float64(out, want, torch.bfloat16)


def test_a_matmul_the_matmul_scheduler_refuses_is_a_library_op():
    # A float32 matmul: a kernel op with a library implementation (op_support), offered to the
    # matmul scheduler alone, which takes 16-bit floats only: torch.matmul runs it.
    a, b = _rand((4, 8), torch.float32, 0), _rand((8, 3), torch.float32, 1)
    fd = _matmul_fd(a, b)
    (mm,) = [e for e in fd.fusion.exprs() if isinstance(e, MatmulOp)]
    assert op_support.segment_kind(mm) == "kernel" and op_support.has_library_implementation(mm)
    choice = registry.choose(fd.fusion)
    assert choice.scheduler is None
    assert "not bf16 or fp16" in choice.reason, choice.reason


def test_library_table_covers_the_library_ops():
    assert set(library.IMPLEMENTATIONS) == set(op_support.LIBRARY_OPS
                                               + op_support.LIBRARY_FALLBACK_OPS)
    a, b = _rand((4, 8), torch.float32, 0), _rand((8, 3), torch.float32, 1)
    fd = _matmul_fd(a, b)
    (mm,) = fd.fusion.exprs()
    line = library.describe(mm)
    assert "matmul" in line and "torch.matmul" in line and "\n" not in line
    (out,) = library.run_library_op(mm, [a, b])
    assert torch.equal(out, a @ b)
    with FusionDefinition() as pw:
        pw.add_output(pw.ops.add(pw.from_pytorch(a), pw.from_pytorch(a)))
    with pytest.raises(TypeError, match="BinaryOp is not a library op"):
        library.run_library_op(pw.fusion.exprs()[0], [a, a])


def test_output_dims_map_to_operand_dims():
    """The output's IDs line up with the operands' batch, M and N dims (a pointwise epilogue
    after the op is an ordinary op); K maps to no output dim."""
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1, -1], dtype=DataType.Float)      # [B, M, K]
        b = fd.define_tensor([-1, -1, -1], dtype=DataType.Float)      # [B, K, N]
        out = fd.ops.matmul(a, b)
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)          # [M', K']
        w = fd.define_tensor([-1, -1], dtype=DataType.Float)          # [N', K']
        bias = fd.define_tensor([-1], dtype=DataType.Float)
        lin = fd.ops.linear(x, w, bias)
        fd.add_output(out)
        fd.add_output(lin)
    g = IdGraph(fd.fusion)
    la, lb, lo = a.domain.logical, b.domain.logical, out.domain.logical
    assert g.mapped(lo[0], la[0]) and g.mapped(lo[0], lb[0])
    assert g.mapped(lo[1], la[1]) and g.mapped(lo[2], lb[2])
    assert not any(g.mapped(o, la[2]) or g.mapped(o, lb[1]) for o in lo)
    lx, lw, ll = x.domain.logical, w.domain.logical, lin.domain.logical
    assert g.mapped(ll[0], lx[0]) and g.mapped(ll[1], lw[0])
    assert g.mapped(ll[1], bias.domain.logical[0])
    assert not any(g.mapped(o, lx[1]) for o in ll)
    assert isinstance(lin.definition, LinearOp) and lin.definition.bias is bias
    assert "matmul(" in repr(fd) and "linear(" in repr(fd)


# Errors ---------------------------------------------------------------------------------------
def _define(body):
    with pytest.raises(FusionDefinitionError) as e:
        with FusionDefinition() as fd:
            body(fd)
    return str(e.value)


def test_matmul_static_k_mismatch():
    msg = _define(lambda fd: fd.ops.matmul(fd.define_tensor([4, 5]), fd.define_tensor([6, 3])))
    assert "matmul: K" in msg and "5 and 6" in msg


def test_matmul_symbolic_k_mismatch_is_an_input_error():
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.matmul(fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])))
    with pytest.raises(InputError, match="matmul: K"):
        fd.execute([torch.randn(4, 5), torch.randn(6, 3)])


def test_matmul_static_batch_mismatch():
    msg = _define(lambda fd: fd.ops.matmul(fd.define_tensor([2, 4, 5]),
                                           fd.define_tensor([3, 5, 6])))
    assert "matmul batch" in msg and "2 and 3" in msg


def test_matmul_dtype_errors():
    msg = _define(lambda fd: fd.ops.matmul(fd.define_tensor([-1, -1], dtype=DataType.BFloat16),
                                           fd.define_tensor([-1, -1], dtype=DataType.Float)))
    assert "bfloat16" in msg and "cast them to one dtype" in msg
    msg = _define(lambda fd: fd.ops.matmul(fd.define_tensor([-1, -1], dtype=DataType.Int),
                                           fd.define_tensor([-1, -1], dtype=DataType.Int)))
    assert "takes bf16, fp16 or fp32" in msg and "int64" in msg


def test_matmul_rank_and_operand_errors():
    msg = _define(lambda fd: fd.ops.matmul(fd.ops.sum(fd.define_tensor([-1])),
                                           fd.define_tensor([-1])))
    assert "rank 0" in msg
    msg = _define(lambda fd: fd.ops.matmul(fd.define_tensor([-1, -1]), 2.0))
    assert "must be a tensor" in msg


def test_linear_errors():
    assert "weight" in _define(lambda fd: fd.ops.linear(fd.define_tensor([-1, -1]),
                                                        fd.define_tensor([-1])))
    assert "bias" in _define(lambda fd: fd.ops.linear(fd.define_tensor([-1, -1]),
                                                      fd.define_tensor([-1, -1]),
                                                      fd.define_tensor([-1, -1])))
    msg = _define(lambda fd: fd.ops.linear(fd.define_tensor([3, 5]), fd.define_tensor([4, 6])))
    assert "linear: K" in msg and "5 and 6" in msg
    msg = _define(lambda fd: fd.ops.linear(fd.define_tensor([3, 5]), fd.define_tensor([4, 5]),
                                           fd.define_tensor([7])))
    assert "linear N" in msg and "4 and 7" in msg
    msg = _define(lambda fd: fd.ops.linear(fd.define_tensor([-1, -1], dtype=DataType.Half),
                                           fd.define_tensor([-1, -1], dtype=DataType.Half),
                                           fd.define_tensor([-1], dtype=DataType.Float)))
    assert "bias" in msg and "cast them to one dtype" in msg


def test_no_warning_on_the_reference_path_for_cpu_inputs():
    a, b = _rand((4, 8), torch.float32, 0), _rand((8, 3), torch.float32, 1)
    fd = _matmul_fd(a, b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fd.execute([a, b])
    assert fd.last_run.kind == "reference"


def test_a_fusion_of_one_library_op_is_a_plan_of_one_library_segment():
    """matmul alone: no kernel, no fallback; the plan's one segment is the library call."""
    import warnings
    a, b = _rand((5, 7), torch.float32, 0), _rand((7, 3), torch.float32, 1)
    fd = _matmul_fd(a, b)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        (out,) = fd.execute([a, b], options={"enable": ["interpret"]})
    run = fd.last_run
    assert run.kind == "kernels" and run.num_kernels == 0
    assert [(s.kind, s.name) for s in run.segments] == [("library", "matmul")]
    _check_against_float64(out, a.double() @ b.double(), torch.float32)
