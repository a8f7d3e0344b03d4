"""argmax and argmin (fd.ops.argmax / argmin: of float32, 16-bit float and int32 tensors one max
reduction of (value, index) keys, runtime/arg_key.py; of float64 and int64 ones a max or min and
the least index where x holds it or is NaN): the reference evaluator and the generated kernels
on the interpreter equal torch exactly, on ties, NaN, inf, -0, every dtype, any dim, None (the
flattened tensor) and keepdim; a row argmax is one reduction kernel; a dim of more than 2^32
elements is refused; definition errors."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.frontend.ops import FusionDefinitionError
from pyfuser.ir.exprs import BinaryOpType
from pyfuser.runtime.fusion_kernel import compile_kernel
from pyfuser.runtime.inputs import InputError, check_inputs
from pyfuser.runtime.reference import evaluate
from pyfuser.testing import run_and_check

INTERPRET = {"enable": ["interpret"]}
NAN, INF = float("nan"), float("inf")


def _inputs():
    ties = (torch.randn(37, 1001) * 2).round()          # many equal values per row
    special = torch.tensor([[1.0, NAN, 3.0, NAN], [2.0, 5.0, 5.0, 1.0],
                            [-INF, -INF, -INF, -INF], [INF, 0.0, INF, -0.0]])
    return {
        "float_ties": ties,
        "nan_inf": special,
        "bf16": ties.bfloat16(),
        "fp16_nan": special.half(),
        "int32": ties.to(torch.int32),
        "float64_nan": special.double(),
        "int64": ties.to(torch.int64),
        "transposed": ties.t(),
    }


@pytest.mark.parametrize("name", ["argmax", "argmin"])
@pytest.mark.parametrize("dim, keepdim", [(1, False), (0, True), (-1, True), (None, False),
                                          (None, True)])
@pytest.mark.parametrize("kind", list(_inputs()))
def test_matches_torch_exactly(name, dim, keepdim, kind):
    x = _inputs()[kind]
    with FusionDefinition() as fd:
        fd.add_output(getattr(fd.ops, name)(fd.from_pytorch(x), dim, keepdim))
    want = (getattr(torch, name)(x, keepdim=keepdim) if dim is None
            else getattr(torch, name)(x, dim, keepdim=keepdim))
    assert torch.equal(evaluate(fd.fusion, [x])[0], want)
    run_and_check(fd, [x], kernels=0, options=INTERPRET)
    assert fd.last_run.kind == "kernels"
    out, = fd.execute([x], options=INTERPRET)
    assert out.dtype == torch.int64 and torch.equal(out, want)


@pytest.mark.parametrize("dtype, keys", [(torch.bfloat16, True), (torch.float32, True),
                                         (torch.int32, True), (torch.float64, False)])
def test_a_row_argmax_is_one_reduction_kernel(dtype, keys):
    """The keys make an argmax a plain reduction (no row broadcast back): one kernel of the
    reduction scheduler reading each row once. float64 keeps the two reductions (its value
    needs all 64 bits), a normalization kernel."""
    x = (torch.randn(33, 2049) * 3).round().to(dtype)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.argmax(fd.from_pytorch(x), 1))
    ops = {getattr(e, "op", None) for e in fd.fusion.exprs()}
    assert (BinaryOpType.ArgMaxKey in ops) == keys
    run_and_check(fd, [x], scheduler="reduction" if keys else "inner_persistent",
                  options=INTERPRET)
    assert torch.equal(fd.execute([x], options=INTERPRET)[0], torch.argmax(x, 1))
    pytest.importorskip("cuda.bindings.nvrtc")
    fk, = fd.kernels(last_run=True)
    compile_kernel(fk)                          # NVRTC, sm_90a: pf::arg_max_key and its reduction
    assert not fk.module.ptxas.has_spills, fk.module.ptxas.summary()
    assert ("pf::arg_max_key(" in fk.source) == keys


def test_a_dim_of_more_than_2_to_the_32_elements_is_refused():
    """32 bits of a key hold the index: a longer dim is refused before anything runs (a static
    one keeps the two-reduction form)."""
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.argmax(fd.define_tensor([-1]), 0))
    x = torch.empty(2 ** 32 + 1, device="meta")
    with pytest.raises(InputError, match=r"sizes do not fit at argmax: its dim 0 .* 4294967297 "
                                         r"> 4294967296"):
        check_inputs(fd.fusion, [x])
    check_inputs(fd.fusion, [torch.empty(2 ** 32, device="meta")])
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.argmin(fd.define_tensor([2 ** 32 + 1]), 0))
    assert BinaryOpType.ArgMinKey not in {getattr(e, "op", None) for e in fd.fusion.exprs()}


def test_a_rank_0_tensor_has_index_0():
    x = torch.tensor(3.0)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.argmax(fd.from_pytorch(x)))
    assert torch.equal(evaluate(fd.fusion, [x])[0], torch.argmax(x))


def test_an_empty_dim_is_an_error_as_in_torch():
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.argmax(fd.define_tensor([-1, -1]), 1))
    with pytest.raises(InputError, match="of no elements has no value"):
        fd.execute([torch.randn(5, 0)], options=INTERPRET)


@pytest.mark.parametrize("call, message", [
    (lambda fd, x: fd.ops.argmax(fd.ops.gt(x, 0.0), 1), "bool tensors have no argmax"),
    (lambda fd, x: fd.ops.argmin(x, [0, 1]), "dim must be an int or None"),
    (lambda fd, x: fd.ops.argmax(x, 2), "dim 2 is out of range"),
])
def test_definition_errors(call, message):
    with pytest.raises(FusionDefinitionError, match=message):
        with FusionDefinition() as fd:
            call(fd, fd.define_tensor([3, 7]))


@pytest.mark.parametrize("shape, dtype, refused", [
    ((64, 128256), torch.bfloat16, True), ((64, 65536), torch.float32, False),
    ((64, 65536), torch.bfloat16, False), ((64, 32000), torch.bfloat16, False)])
def test_long_rows_of_a_variance_are_read_twice_not_held_in_a_cluster(shape, dtype, refused):
    """Rows split over a cluster of 8 blocks holding 32 values per thread only to feed
    reductions (every output is per row, a variance) are refused by the inner persistent
    heuristic, and the plan becomes reduction kernels that read the rows again (two, 2224
    against 1610 GB/s on the H200 at 128256 bf16; now one, the split's one-pass variance,
    schedule/one_pass_variance.py); fewer values per thread (65536 fp32: 2924 against 2204)
    or a smaller cluster keep the persistent kernel, and so does a softmax of long rows (its
    output runs along the row)."""
    x = torch.empty(*shape, dtype=dtype, device="meta")
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.var(fd.from_pytorch(x), [1]))
    seg, = fd.explain([x], device="h100").segments
    assert seg.name == "inner_persistent" and bool(seg.refused) == refused, seg.refused
    if refused:
        assert "only to feed reductions" in seg.refused
        assert [(s.kind, s.name) for s in seg.again.segments] == [("kernel", "reduction")]
        assert seg.again.rewritten.startswith("normalization split")
    with FusionDefinition() as fd:
        t = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
        e = fd.ops.exp(fd.ops.sub(t, fd.ops.max(t, [1], keepdim=True)))
        fd.add_output(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)))
    seg, = fd.explain([x], device="h100").segments
    assert seg.name == "inner_persistent" and not seg.refused


def test_an_argmax_beside_a_softmax_of_long_rows_reduces_its_keys_over_the_cluster():
    """A softmax of rows split over a cluster of 8 blocks, with the argmax of the same rows as a
    second output: the int64 keys are reduced through distributed shared memory (8-byte
    slots) beside the float max and sum."""
    x = (torch.randn(3, 65536) * 4).round()
    x[1, 777] = NAN
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        e = fd.ops.exp(fd.ops.sub(t, fd.ops.max(t, [1], keepdim=True)))
        fd.add_output(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)))
        fd.add_output(fd.ops.argmax(t, 1))
    run_and_check(fd, [x], scheduler="inner_persistent", options=INTERPRET)
    assert fd.last_run.heuristics[0].cluster == 8
    assert torch.equal(fd.execute([x], options=INTERPRET)[1], torch.argmax(x, 1))
    pytest.importorskip("cuda.bindings.nvrtc")
    fk, = fd.kernels(last_run=True)
    compile_kernel(fk)
    assert not fk.module.ptxas.has_spills, fk.module.ptxas.summary()
    assert "pf::cluster_allreduce_row" in fk.source and "pf::arg_max_key(" in fk.source
