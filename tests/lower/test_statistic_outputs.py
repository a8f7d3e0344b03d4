"""Row statistics that are also outputs, run by the kernel-IR interpreter (CPU).

The training forward of a normalization returns its statistics: RMSNorm's rstd, LayerNorm's
mean and rstd ([M, 1] with keepdim, [M] without), var_mean and var over rows, softmax's row max
and logsumexp; a statistic may also be cast or used after a broadcast. Each such value is
computed once per row inside the loops of the row it normalizes, so its write must come from
one thread, one persistent-batch step and one block of a cluster, at the row's index, for
every row of a block (threadIdx.y) and every block. The norm backward takes mean and rstd as
[M, 1] or [M] inputs.

Every kernel here runs against the float64 reference (pyfuser.testing.rel_error, TOLERANCE)
with each output element written exactly once (Interpreter.writes). Shapes keep several rows
per block, several blocks (the last one partial), persistent batches of several vectors,
grid-stride loops and rows split over a cluster.
"""
import dataclasses

import pytest
import torch

from kir_testing import (forced_inner_persistent, interpret_against_float64, ops,
                         schedule_and_lower, setup)
from statistic_fusions import FORWARD, forward, norm_backward
from pyfuser.ir.dtype import from_torch
from pyfuser.ir.iter_domain import ParallelType as PT
from pyfuser.kir import nodes as K
from pyfuser.lower import lower
from pyfuser.lower.context import LoweringError
from pyfuser.runtime.inputs import check_inputs
from pyfuser.runtime.reference import evaluate
from pyfuser.schedule.schedulers import inner_outer_persistent as iop
from pyfuser.schedule.schedulers import inner_persistent as ip
from pyfuser.testing import TOLERANCE, rel_error


# Checks -----------------------------------------------------------------------------------------
def check(fd, inputs, params=None, scheduler=None):
    """Lower (verifying each pass), interpret, compare every output with the float64 reference
    and check that each output element is written exactly once. Returns (params, kernel,
    interpreter)."""
    st, _, params, k = schedule_and_lower(fd, inputs, params=params, scheduler=scheduler,
                                          alignment=16)
    _, it = interpret_against_float64(fd, st, k, inputs, params)
    return params, k, it


# Forward, register rows -------------------------------------------------------------------------
# (M, N) fp32, what the inner persistent heuristic makes of them:
SHAPES = {
    (37, 40): "16 rows per block (threadIdx.y), 3 blocks, the last with 5 rows",
    (8, 512): "2 rows per block, 4 blocks",
    (6, 2048): "2 rows per block, 3 blocks, 4 vectors per thread (persistent batch)",
    (7, 1000): "250 threads per row, one row per block",
}


@pytest.mark.parametrize("keepdim", [True, False], ids=["keepdim", "squeezed"])
@pytest.mark.parametrize("name", list(FORWARD))
@pytest.mark.parametrize("M,N", list(SHAPES))
def test_forward_statistics_are_written_once_per_row(name, keepdim, M, N):
    fd, inputs = forward(name, "fp32", keepdim, M, N)
    p, _, _ = check(fd, inputs)
    assert isinstance(p, ip.InnerPersistentParams)
    assert p.bdimy == {(37, 40): 16, (8, 512): 2, (6, 2048): 2, (7, 1000): 1}[(M, N)], p
    assert p.persistent_batch == (4 if N == 2048 else 1), p


@pytest.mark.parametrize("keepdim", [True, False], ids=["keepdim", "squeezed"])
@pytest.mark.parametrize("name", ["rmsnorm_rstd", "layernorm_stats", "var_mean_rows",
                                  "rmsnorm_rstd_cast", "softmax_stats"])
@pytest.mark.parametrize("dt", ["bf16", "fp16"])
def test_half_precision_forward_statistics(name, dt, keepdim):
    """A float [M, 1] statistic of a 16-bit row: written element-wise (once per row), not
    vectorized along its broadcast dim with the row's width (8 floats: a 32-byte access)."""
    fd, inputs = forward(name, dt, keepdim, 13, 64)
    p, _, _ = check(fd, inputs)
    assert p.vector == 8 and p.bdimy == 8, p


def _write_of(kernel, tv_name):
    return next(s for s in ops(kernel) if isinstance(s.out, K.TensorIndex)
                and s.out.buffer.name == tv_name)


def _output_buffer(kernel, j):
    return next(q.name for q in kernel.params if q.source == ("output", j))


def test_a_keepdim_statistic_is_written_by_one_thread_of_its_row():
    """rstd [M, 1] shares the row's loops (rstd is inlined into the normalized row and into the
    output): the merged loops stay the row's (threadIdx.x over the row, the persistent batch),
    and only their first iteration writes; its register buffer holds one value, not one per
    element of a split of the broadcast dim."""
    fd, inputs = forward("rmsnorm_rstd", "fp32", True, 6, 2048)
    _, k, _ = check(fd, inputs)
    op = _write_of(k, _output_buffer(k, 1))
    loops = {lp.parallel: lp for lp in op.nest}
    assert not loops[PT.TIDx].promoted.is_broadcast
    text = repr(op.predicate)
    assert "(threadIdx.x == 0)" in text
    batch = next(lp for lp in op.nest if lp.parallel == PT.Serial and lp.extent.value == 4)
    assert f"({batch.var!r} == 0)" in text
    assert op.vector == 1 and op.ins[0].buffer.size.value == 1


def test_a_squeezed_statistic_is_not_vectorized_across_rows():
    """mean [M] scheduled like the row ends in its threadIdx.y axis, the rows of the block: it
    is not the row's vector axis, so it stays a thread axis and each row's thread writes its
    own value."""
    fd, inputs = forward("var_mean_rows", "fp32", False, 8, 512)
    _, k, _ = check(fd, inputs)
    for j in (0, 1):
        op = _write_of(k, _output_buffer(k, j))
        assert op.vector == 1
        assert PT.TIDy in {lp.parallel for lp in op.nest}


def test_reading_another_threads_registers_is_refused(monkeypatch):
    """The schedule that wrote rows 2..8 of a block with row 1's statistic: the rule that
    vectorized every output's innermost axis turned the [M] output's threadIdx.y axis into a
    vector axis, one thread storing the values the block's other rows hold in their
    registers. Lowering refuses such a schedule."""
    monkeypatch.setattr(ip, "vectorize_along",
                        lambda tv, axis, graph, width=None: tv.parallelize(-1, PT.Vectorize))
    fd, inputs = forward("var_rows", "fp32", False, 8, 512)
    st = setup(fd, inputs, alignment=16)
    p = ip.compute_heuristics(st.fusion, st.info)
    ip.schedule(st.fusion, p)
    assert st.fusion.outputs[0].domain.loop[-1].parallel_type == PT.Vectorize
    with pytest.raises(LoweringError, match="registers along .*TIDy.* the values are another"):
        lower(st.fusion)


def test_the_executor_runs_statistic_kernels_on_the_interpreter():
    fd, inputs = forward("layernorm_stats", "fp32", True, 9, 256)
    outs = fd.execute(inputs, options={"enable": ["interpret"]})
    run = fd.last_run
    assert run.kind == "kernels" and run.backend == "interpreter", run
    assert run.schedulers == ("inner_persistent",) and not run.internal_error
    refs = evaluate(fd.fusion, inputs, promote_to_double=True,
                    extent_bindings=check_inputs(fd.fusion, inputs))
    for o, r in zip(outs, refs):
        assert rel_error(o, r) <= TOLERANCE[from_torch(o.dtype)]


# Forward, persistent grid (TMA, warp-specialized): rows of a block taken in grid-stride turns ---
@pytest.mark.parametrize("keepdim", [True, False], ids=["keepdim", "squeezed"])
@pytest.mark.parametrize("name", ["rmsnorm_rstd", "layernorm_stats", "softmax_stats"])
@pytest.mark.parametrize("feature", ["tma_inner_persistent", "ws_inner_persistent"])
def test_grid_stride_statistics(name, keepdim, feature):
    """A persistent grid of 2 blocks takes the rows' groups (4 rows, TMA; 12, warp-specialized)
    in turns, the last one partial."""
    fd, inputs = forward(name, "fp32", keepdim, 29, 256)
    p = forced_inner_persistent(fd, inputs, feature, grid=2)
    p, _, it = check(fd, inputs, params=p, scheduler=ip)
    assert p.stages >= 2 and p.bdimy > 1 and it.grid[0] == 2, p
    assert 29 > 2 * p.bdimy and 29 % p.bdimy, p


# Forward, rows split over a cluster along blockIdx.y ---------------------------------------------
def _cluster_params(fd, inputs, cluster):
    st = setup(fd, inputs, alignment=16)
    p = ip.compute_heuristics(st.fusion, st.info)
    N = inputs[0].shape[1]
    batch, bdimx = ip.persistent_batch(N // cluster // p.vector)
    return dataclasses.replace(p, cluster=cluster, persistent_batch=batch, bdimx=bdimx)


@pytest.mark.parametrize("keepdim", [True, False], ids=["keepdim", "squeezed"])
@pytest.mark.parametrize("name", ["rmsnorm_rstd", "layernorm_stats", "var_mean_rows",
                                  "softmax_stats"])
@pytest.mark.parametrize("M,N,cluster", [(5, 1024, 2), (3, 2048, 4)])
def test_cluster_split_statistics(name, keepdim, M, N, cluster):
    """Each block of the cluster holds N / C of the row and gets the row's statistic through
    distributed shared memory: one block of the cluster (blockIdx.y 0) writes it."""
    fd, inputs = forward(name, "fp32", keepdim, M, N)
    p, k, _ = check(fd, inputs, params=_cluster_params(fd, inputs, cluster), scheduler=ip)
    assert k.launch.cluster == (1, cluster, 1) and p.bdimy == 2, p
    assert any(isinstance(s, K.ClusterReduce) for s in K.walk(k.body))


def test_the_heuristic_splits_long_rows_over_a_cluster():
    """The shapes the forced clusters above stand for: 65536-element rows of 16-bit inputs
    take a cluster of 4 blocks."""
    fd, _ = forward("layernorm_stats", "bf16", True, 1, 1)
    inputs = [torch.empty(4096, 65536, dtype=torch.bfloat16),
              torch.empty(65536, dtype=torch.bfloat16), torch.empty(65536, dtype=torch.bfloat16)]
    st = setup(fd, inputs, alignment=16)
    assert ip.compute_heuristics(st.fusion, st.info).cluster == 4


# Backward: mean / rstd as [M, 1] or [M] inputs --------------------------------------------------
@pytest.mark.parametrize("keepdim", [True, False], ids=["M1", "M"])
@pytest.mark.parametrize("name", ["rmsnorm_bwd", "layernorm_bwd"])
@pytest.mark.parametrize("dt,M,N", [("fp32", 9, 512), ("fp32", 7, 1000), ("bf16", 10, 256)])
def test_norm_backward_with_statistic_inputs(name, keepdim, dt, M, N):
    fd, inputs = norm_backward(name, dt, keepdim, M, N)
    st = setup(fd, inputs, alignment=16)
    # The whole persistent grid of the H100 is slow to interpret; 4 blocks still take several
    # rows each in turn.
    p = dataclasses.replace(iop.compute_heuristics(st.fusion, st.info), grid=4)
    check(fd, inputs, params=p, scheduler=iop)


def test_var_of_one_element_rows_is_nan_on_the_interpreter():
    """0 / 0 per row, as torch gives it; run_and_check compares the NaN positions (the GPU
    twin checks the kernel does not contract the recomputed product, fuzz 20261127:735)."""
    from statistic_fusions import var_of_a_recomputed_product
    from pyfuser.testing import run_and_check

    fd, inputs = var_of_a_recomputed_product(64)
    _, var = run_and_check(fd, inputs, options={"enable": ["interpret"]})
    assert var.isnan().all()
