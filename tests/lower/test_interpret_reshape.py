"""Reshapes in scheduled kernels, run by the kernel-IR interpreter against the float64 reference.

- A reshape that merges an expanded (stride-0) dim iterates its expanded size: each element of
  the input is read once per copy (triage P12, where the output had the unexpanded shape).
- inner_persistent's projection of persistent buffers to the inputs recomputes fills (ones,
  zeros), reshapes and squeezes (triage P10, where scheduling raised "recompute of T#: T#
  comes from a FullOp / ReshapeOp").

Every output element is checked written exactly once; the GPU counterparts are in
tests/gpu/test_reshape_gpu.py.
"""
import pytest
import torch

from kir_testing import interpret, reference, schedule_and_lower
from pyfuser import DataType, FusionDefinition
from pyfuser.ir.exprs import FullOp, ReshapeOp, SqueezeOp
from pyfuser.testing import TOLERANCE, rel_error

F32, BF16, F16 = DataType.Float, DataType.BFloat16, DataType.Half


def _check(fd, inputs, scheduler, options=None):
    from pyfuser import options as opts
    with opts.override(**(options or {})):
        st, sch, params, k = schedule_and_lower(fd, inputs, alignment=16)
    assert sch.NAME == scheduler, sch.NAME
    outs, it = interpret(k, st.bindings, inputs)
    refs = reference(fd, inputs)
    from pyfuser.runtime.reference import evaluate
    from pyfuser.runtime.inputs import check_inputs
    refs = evaluate(fd.fusion, inputs, promote_to_double=True,
                    extent_bindings=check_inputs(fd.fusion, inputs))
    for j, (o, r) in enumerate(zip(outs, refs)):
        assert o.shape == r.shape
        assert rel_error(o, r) <= TOLERANCE[fd.fusion.outputs[j].dtype], (j, params)
        buf = next(p.name for p in k.params if p.source == ("output", j))
        counts = [c for (b, _), c in it.writes.items() if b == buf]
        assert len(counts) == r.numel() and set(counts) <= {1}, (buf, params)
    return st, params


def _expanded(sizes, expanded, dtype=torch.float32):
    base = torch.randn([1 if e else s for s, e in zip(sizes, expanded)]).to(dtype)
    return base.expand(sizes)


# Reshapes of expanded dims (P12) ----------------------------------------------------------------
@pytest.mark.parametrize("sizes, expanded, new", [
    ([15, 4], [False, True], [60]),                 # the triage's repro
    ([15, 4], [False, True], [-1, 12]),
    ([4, 3, 64], [False, True, False], [-1]),       # an expanded dim between two full ones
    ([12, 256], [True, False], [-1, 128]),          # rows made of copies of one row
    ([4, 3], [True, True], [2, -1]),                # nothing but expanded dims
])
def test_pointwise_reshape_of_expanded_dims(sizes, expanded, new):
    x = _expanded(sizes, expanded)
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1] * len(sizes), dtype=F32, expanded=expanded)
        fd.add_output(fd.ops.mul(fd.ops.reshape(t, new), 2.0))
    _check(fd, [x], "pointwise")


def test_pointwise_reshape_of_an_expanded_bf16_input_beside_a_full_one():
    x = _expanded([12, 256], [True, False], torch.bfloat16)
    y = torch.randn(12 * 256)
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1], dtype=BF16, expanded=[True, False])
        u = fd.define_tensor([-1], dtype=F32)
        fd.add_output(fd.ops.add(fd.ops.reshape(t, [-1]), u))
    _check(fd, [x, y], "pointwise")


def _softmax_of_rows(dtype, row):
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1], dtype=dtype, expanded=[False, True])
        h = fd.ops.cast(fd.ops.reshape(t, [-1, row]), F32)
        e = fd.ops.exp(fd.ops.sub(h, fd.ops.max(h, [1], keepdim=True)))
        fd.add_output(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)))
    return fd


@pytest.mark.parametrize("dtype, tdtype", [(F32, torch.float32), (BF16, torch.bfloat16)])
@pytest.mark.parametrize("m, e, row", [(64, 8, 128), (33, 8, 264), (256, 4, 64)])
def test_softmax_of_rows_made_by_reshaping_an_expanded_dim(dtype, tdtype, m, e, row):
    """x [M, 1 ex E] reshaped to rows: each row holds copies of x's elements, read with stride
    0. The projection recomputes the reshape after the reductions (a second reshape of the same
    expanded tensor, which iterates the same elements as the first)."""
    x = _expanded([m, e], [False, True], tdtype)
    _check(_softmax_of_rows(dtype, row), [x], "inner_persistent")


@pytest.mark.parametrize("dtype, tdtype", [(F32, torch.float32), (BF16, torch.bfloat16)])
@pytest.mark.parametrize("m, e, n", [(64, 4, 1024), (30, 3, 2048), (128, 16, 8)])
def test_layernorm_of_rows_made_by_reshaping_an_expanded_dim(dtype, tdtype, m, e, n):
    x = _expanded([e, m * n // e], [True, False], tdtype)
    w = torch.randn(n).to(tdtype)
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1], dtype=dtype, expanded=[True, False])
        tw = fd.define_tensor([-1], dtype=dtype)
        h = fd.ops.cast(fd.ops.reshape(t, [-1, n]), F32)
        v, mean = fd.ops.var_mean(h, [1], correction=0, keepdim=True)
        y = fd.ops.mul(fd.ops.mul(fd.ops.sub(h, mean), fd.ops.rsqrt(fd.ops.add(v, 1e-5))),
                       fd.ops.broadcast(fd.ops.cast(tw, F32), [True, False]))
        fd.add_output(fd.ops.cast(y, dtype))
    _check(fd, [x, w], "inner_persistent")


# The persistent-buffer projection (P10) ---------------------------------------------------------
def _recomputed(fusion, kind) -> list:
    return [e for e in fusion.exprs() if isinstance(e, kind) and getattr(e, "is_recompute", False)]


@pytest.mark.parametrize("variant", [None, "tma_inner_persistent", "ws_inner_persistent"])
@pytest.mark.parametrize("shape", [(4, 64), (6, 1024)])
def test_a_filled_tensor_in_the_projected_chain_is_recomputed(shape, variant):
    """The triage's repro: softmax(cast(x) + ones). The row's extent is required equal to the
    fill's constant one, so the kernel takes it as that constant: the TMA variants' shared-memory
    row slots need a constant size ("a circular buffer needs a constant slot size" before)."""
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1], dtype=F16)
        h = fd.ops.add(fd.ops.cast(t, F32), fd.ops.ones(list(shape), dtype=F32))
        e = fd.ops.exp(fd.ops.sub(h, fd.ops.max(h, [1], keepdim=True)))
        fd.add_output(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)))
    st, params = _check(fd, [torch.randn(shape).half()], "inner_persistent",
                        {"enable": [variant]} if variant else None)
    assert len(_recomputed(st.fusion, FullOp)) == 1
    assert bool(variant) == bool(params.stages), params


@pytest.mark.parametrize("shape, new", [([2, 146, 74], [2, 146, -1, 2]),   # fuzz 20261123:67
                                        ([64, 8], [-1, 128]), ([48, 10], [-1, 80])])
def test_a_reshape_in_the_projected_chain_is_recomputed(shape, new):
    x = torch.randn(shape).half()
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1] * len(shape), dtype=F16)
        h = fd.ops.cast(fd.ops.reshape(t, new), F32)
        v, m = fd.ops.var_mean(h, [-1], correction=0, keepdim=True)
        fd.add_output(fd.ops.mul(fd.ops.sub(h, m), fd.ops.rsqrt(fd.ops.add(v, 1e-5))))
    st, _ = _check(fd, [x], "inner_persistent")
    assert _recomputed(st.fusion, ReshapeOp)


def test_a_squeeze_in_the_projected_chain_is_recomputed():
    x = torch.randn(16, 96).half()
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1], dtype=F16)
        h = fd.ops.cast(fd.ops.squeeze(fd.ops.broadcast(t, [False, False, True]), [2]), F32)
        fd.add_output(fd.ops.sub(h, fd.ops.mean(h, [1], keepdim=True)))
    st, _ = _check(fd, [x], "inner_persistent")
    assert _recomputed(st.fusion, SqueezeOp)


def test_the_projection_of_one_row_defined_as_a_broadcast_stops_at_its_statistics():
    """LayerNorm of one row defined [1, N]: x - mean is used after the variance; the mean
    ([1, 1]) is a per-row value (its size-1 dim a kept row dim), so the copy stops there instead
    of reaching the ReductionOp (triage P4: "recompute of T#: T# comes from a ReductionOp")."""
    with FusionDefinition() as fd:
        t = fd.define_tensor([1, -1], dtype=F32)
        v, m = fd.ops.var_mean(t, [1], correction=0, keepdim=True)
        fd.add_output(fd.ops.mul(fd.ops.sub(t, m), fd.ops.rsqrt(fd.ops.add(v, 1e-5))))
    _check(fd, [torch.randn(1, 1024)], "inner_persistent")
