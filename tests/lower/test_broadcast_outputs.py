"""Outputs of different shapes that broadcast to one another, run by the kernel-IR interpreter
(CPU) against the float64 reference, with each element in memory written exactly once.

One loop nest computes every output of a kernel: an [M, 1] output beside the [M, N] one runs in
the [M, N] loops, and every iteration of its row would store the same element. The pointwise
reference is the output that iterates the most dims, sibling loops merge into the one that
covers the most dims, and a write is guarded to index 0 of the iterations its broadcast dims
stand for (lower/index.py). An output expanded along N (stride 0) holds one element per row,
written once per row too. Fusions the schedulers do not take are refused with a reason and
run through the reference evaluator, never with an internal error.

The fusions are those of broadcast_output_fusions.py, which the GPU tests also run.
"""
import math

import pytest
import torch

from broadcast_output_fusions import FUSIONS, layernorm_weight_out
from kir_testing import (forced_inner_persistent, interpret, interpret_against_float64,
                         schedule_and_lower)
from pyfuser import DataType, FusionDefinition
from pyfuser.ir.dtype import from_torch
from pyfuser.runtime.inputs import check_inputs, output_strides
from pyfuser.runtime.reference import evaluate
from pyfuser.schedule.schedulers import inner_persistent as ip
from pyfuser.schedule.schedulers import pointwise
from pyfuser.testing import TOLERANCE, rel_error, run_and_check


def check(fd, inputs, scheduler_name):
    """Schedule with the scheduler the registry picks (asserted), lower, interpret; every
    output within tolerance of the float64 reference and each element in memory (an expanded
    dim holds one for all) written exactly once. Returns (params, kernel)."""
    st, sch, params, k = schedule_and_lower(fd, inputs)
    assert sch.NAME == scheduler_name, sch.NAME
    interpret_against_float64(fd, st, k, inputs, params)
    return params, k


# (M, N): several blocks, the last partial; vectors across rows; odd sizes
SHAPES = [(6, 36), (37, 40), (5, 1000), (3, 7)]


@pytest.mark.parametrize("M,N", SHAPES)
@pytest.mark.parametrize("name", ["column_row_and_full", "full_first", "expanded_column",
                                  "three_d"])
@pytest.mark.parametrize("dt", ["fp32", "bf16"])
def test_pointwise_outputs_that_broadcast_one_another(name, dt, M, N):
    """The [M, 1] and [1, N] outputs beside the [M, N] one (whichever comes first), a column
    expanded to [M, N], the same in 3D. They used to fail to index (`cannot index T9's axis
    from its loops`) when the [M, N] output came first or was expanded, and to write each
    [M, 1] element once per thread of its row when the [M, 1] output came first."""
    build, scheduler = FUSIONS[name]
    fd, inputs = build(dt, M, N)
    check(fd, inputs, scheduler)


def test_pointwise_reference_is_the_output_iterating_the_most_dims():
    """Of outputs of one rank, the reference is the one with the most iteration dims, whatever
    their order: the [M, 1] output first used to be it."""
    for name in ("column_row_and_full", "full_first"):
        fd, _ = FUSIONS[name][0]("fp32", 6, 36)
        ref = pointwise._reference(fd.fusion)
        assert [i.is_broadcast for i in ref.domain.logical] == [False, False], name


NORM_SHAPES = [(37, 40), (8, 512), (7, 1000), (6, 2048)]


@pytest.mark.parametrize("M,N", NORM_SHAPES)
@pytest.mark.parametrize("name", ["layernorm_weight_out", "rmsnorm_rstd_broadcast_in_dim",
                                  "rmsnorm_rstd_expand", "scaled_softmax_scale_out",
                                  "softmax_column_expanded",
                                  "norm_backward_row_statistic_expand"])
@pytest.mark.parametrize("dt", ["fp32", "bf16"])
def test_normalization_outputs_that_broadcast_the_rows(name, dt, M, N):
    """A norm's weight times 2 ([N]) and a [1]-shaped input's own output beside the rows used
    to fail to lower (the weight's cache inlined into its broadcast over the rows and into its
    own output, at different depths); a row statistic expanded to [M, N] was written by every
    thread of its row, an input column expanded to [M, N] by every lane of the row's vector
    split."""
    build, scheduler = FUSIONS[name]
    fd, inputs = build(dt, M, N)
    check(fd, inputs, scheduler)


# (name, M, N, split over blockIdx.y): one block per row or column tile, or few long rows or
# columns split over the blocks of blockIdx.y (a grid reduction)
REDUCTION_CASES = [("row_sums_and_column_out", 37, 4000, False),
                   ("row_sums_and_column_out", 3, 100000, True),
                   ("column_sums_and_row_out", 300, 40, False),
                   ("column_sums_and_row_out", 100000, 8, True),
                   ("column_sums_and_column_out", 300, 40, False),
                   ("column_sums_and_column_out", 20000, 8, True),
                   ("row_sums_and_row_out", 37, 4000, False),
                   ("row_sums_and_row_out", 3, 100000, True),
                   ("row_sums_expanded", 37, 4000, False),
                   ("row_sums_expanded", 3, 100000, True)]


@pytest.mark.parametrize("name,M,N,split", REDUCTION_CASES)
def test_reduction_outputs_beside_the_reduction(name, M, N, split):
    """Split over blockIdx.y, the column beside the row sums and the row beside the column
    sums were never written (guarded by the grid reduction's last-block flag, which only
    tensors computed from the grid reduction have), and the column sums beside the column
    they scale were wrong (the reduction's blockIdx.y loop, merged with the column's, lost its
    grid reduction)."""
    build, scheduler = FUSIONS[name]
    fd, inputs = build("fp32", M, N)
    p, _ = check(fd, inputs, scheduler)
    assert (p.grid_split > 1) == split, p


def test_weight_output_beside_rows_that_fill_the_registers():
    """Rows too long to keep the weight in registers as well (keep_weights False): the weight's
    cache, which its own output needs outside the row loop, is computed once per block."""
    fd, inputs = layernorm_weight_out("fp32", 4, 16384)
    p, _ = check(fd, inputs, "inner_persistent")
    assert isinstance(p, ip.InnerPersistentParams) and not p.keep_weights, p


@pytest.mark.parametrize("M,N,dt", [(37, 2048, "bf16"), (9, 1024, "fp32")])
@pytest.mark.parametrize("name", ["layernorm_weight_out", "scaled_softmax_scale_out",
                                  "rmsnorm_rstd_expand"])
@pytest.mark.parametrize("feature", ["tma_inner_persistent", "ws_inner_persistent"])
def test_persistent_grid_writes_outputs_beside_the_rows_once(feature, name, dt, M, N):
    """The TMA variants take the rows in grid-stride turns: an output computed outside that
    loop (the weight's w * 2, the scale's s * 3) was written by every block of the grid."""
    fd, inputs = FUSIONS[name][0](dt, M, N)
    params = forced_inner_persistent(fd, inputs, feature)
    st, _, params, k = schedule_and_lower(fd, inputs, params=params, scheduler=ip)
    assert params.stages >= 2 and params.grid > 1, params
    outs, it = interpret(k, st.bindings, inputs)
    refs = evaluate(fd.fusion, list(inputs), promote_to_double=True,
                    extent_bindings=check_inputs(fd.fusion, inputs))
    for j, (o, r) in enumerate(zip(outs, refs)):
        assert rel_error(o, r) <= TOLERANCE[from_torch(o.dtype)], j
        buf = next(q.name for q in k.params if q.source == ("output", j))
        counts = [n for (b, _), n in it.writes.items() if b == buf]
        strides = output_strides(fd.fusion.outputs[j], list(r.shape))
        stored = math.prod(n for n, s in zip(r.shape, strides) if s != 0)
        assert len(counts) == stored and set(counts) == {1}, (j, sorted(set(counts)))


def _full_reduction(kind):
    # Shifted off zero: a sum of centred values can cancel to near zero, where a float32 sum's
    # rounding (bounded by sum |x|, not |sum x|) is a large relative error of a correct kernel.
    x = torch.randn(37, 40) + 1.0
    with FusionDefinition() as fd:
        tx = fd.define_tensor([-1, -1])
        s = fd.ops.sum(tx)
        if kind in ("broadcast_back_and_scalar", "scalar_and_its_double", "two_scalars"):
            fd.add_output(s)
        if kind in ("broadcast_back_and_scalar", "broadcast_back"):
            fd.add_output(fd.ops.mul(tx, s))
        if kind == "scalar_and_its_double":
            fd.add_output(fd.ops.mul(s, 2.0))
        if kind == "two_scalars":
            fd.add_output(fd.ops.max(tx))
    return fd, [x]


# kind -> the plan: (segment kind, name) of each segment, () for one kernel.
FULL_REDUCTION_PLANS = {
    # x * sum(x): the sum is broadcast back over x, so two kernels; the sum as an output is
    # written by the reduction kernel.
    "broadcast_back_and_scalar": (("kernel", "reduction"), ("kernel", "pointwise")),
    "broadcast_back": (("kernel", "reduction"), ("kernel", "pointwise")),
    # sum(x) and sum(x) * 2: a rank-0 epilogue of the reduction kernel.
    "scalar_and_its_double": (),
    # sum(x) and max(x): one reduction kernel, each reduction with its own partials.
    "two_scalars": (),
}


@pytest.mark.parametrize("kind", list(FULL_REDUCTION_PLANS))
def test_full_reductions_beside_other_outputs(kind):
    """Rank-0 outputs of full reductions beside other outputs: x * sum(x), with or without the
    sum as an output, was taken by the inner persistent scheduler and failed with an internal
    error (`reduction: no kept dims`); it refuses it (a full reduction has no rows), and the
    reduction scheduler takes the full sums: generated kernels only, each output within
    tolerance, no internal error."""
    fd, inputs = _full_reduction(kind)
    if kind.startswith("broadcast_back"):
        ok, why = ip.can_schedule(fd.fusion)
        assert not ok and why == "a full reduction (no kept dims) is not supported yet"
    plan = FULL_REDUCTION_PLANS[kind]
    run_and_check(fd, inputs, kernels=max(1, len(plan)), segments=plan,
                  scheduler="reduction" if not plan else None,
                  options={"enable": ["interpret"]})
    assert not fd.last_run.internal_error


def test_the_epilogue_of_a_grid_split_full_sum_is_written_by_the_last_block():
    """sum(exp(x - m)) over all of x, split over blocks along blockIdx.y, and its [1, 1]
    epilogue log(sum) + m: the epilogue's one-block loop over blockIdx.y was guarded by
    `blockIdx.y < 1`, so block 0 wrote its partial sum, not the block that finished the grid
    reduction (fuzz 20261372:414: a softmax over the whole tensor off by half)."""
    x, m = torch.randn(215, 198), torch.randn(1, 1)
    with FusionDefinition() as fd:
        tx, tm = fd.from_pytorch(x), fd.from_pytorch(m)
        s = fd.ops.sum(fd.ops.exp(fd.ops.sub(tx, tm)), [0, 1], keepdim=True)
        fd.add_output(s)
        fd.add_output(fd.ops.add(fd.ops.log(s), tm))
    run_and_check(fd, [x, m], scheduler="reduction", options={"enable": ["interpret"]})
    params = fd.last_run.heuristics[0]
    assert params.full and params.grid_split > 1, params


@pytest.mark.parametrize("name", ["full_first", "layernorm_weight_out", "expanded_column",
                                  "scaled_softmax_scale_out"])
def test_executor_runs_the_kernels(name):
    """Through fd.execute on the interpreter: generated kernels ran (no fallback, no internal
    error), each output within tolerance."""
    build, scheduler = FUSIONS[name]
    fd, inputs = build("bf16", 7, 1000)
    outs = fd.execute(inputs, options={"enable": ["interpret"]})
    run = fd.last_run
    assert run.kind == "kernels" and run.backend == "interpreter", run
    assert not run.internal_error and run.schedulers == (scheduler,), run
    refs = evaluate(fd.fusion, inputs, promote_to_double=True,
                    extent_bindings=check_inputs(fd.fusion, inputs))
    for o, r in zip(outs, refs):
        assert rel_error(o, r) <= TOLERANCE[from_torch(o.dtype)]


def test_a_broadcast_read_inside_a_reduction_and_used_after_it():
    """v = set(t0) of a [1] input, read inside a full sum's loops (where(x > 0.5, v, 0.75)) and
    by a mean after them: v's own loops were promoted to the sum's loop of runtime extent
    ceilDiv(N, 32), a register buffer of runtime size, and lowering refused the kernel (fuzz
    20261376:923, run by the reference with a FallbackWarning). A broadcast's own loop of
    runtime extent runs once: one kernel, no internal error."""
    t0 = torch.rand(1).bfloat16() + 0.5
    t1 = torch.randn(34).bfloat16().as_strided((17,), (2,), 0)
    with FusionDefinition() as fd:
        a = fd.from_pytorch(t0)
        b = fd.define_tensor(shape=[-1], contiguity=[False], dtype=DataType.BFloat16)
        v = fd.ops.set(a)
        x = fd.ops.cast(fd.ops.logical_not(b), DataType.Half)
        fd.add_output(fd.ops.sum(fd.ops.where(fd.ops.gt(x, 0.5), v, 0.75), [0], keepdim=True))
        fd.add_output(fd.ops.mul(fd.ops.erf(b), 0.5))
        fd.add_output(fd.ops.mean(v, [0], keepdim=True))
    run_and_check(fd, [t0, t1], scheduler="reduction", options={"enable": ["interpret"]})
    assert not fd.last_run.internal_error
