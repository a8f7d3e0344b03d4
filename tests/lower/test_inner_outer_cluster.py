"""Norm backward (inner-outer persistent) with rows split over a thread-block cluster (CPU).

Rows too long for one block's registers are split over C blocks along blockIdx.y: the heuristic's
choice of C and its reasons, the lowered kernel (cluster reductions for dx, a workspace slice per
block, phase 2 spread over blockIdx.y), the interpreter running small forced clusters against
the reference with every output element written once, and NVRTC compiles with no spills.
"""
import dataclasses

import pytest
import torch

from kir_testing import compile_clean  # noqa: E402
from kir_testing import empty_inputs, interpret, reference, schedule_and_lower, setup
from pyfuser import catalogue
from pyfuser.codegen.cuda import generate_cuda
from pyfuser.ir import scalar as S
from pyfuser.kir import nodes as K
from pyfuser.schedule.schedulers import inner_outer_persistent as iop
from pyfuser.schedule.schedulers.base import SchedulerError

NAMES = ["rmsnorm_bwd", "layernorm_bwd"]
ROW_REDUCTIONS = {"rmsnorm_bwd": 1, "layernorm_bwd": 2}
TOL = {"fp32": dict(rtol=1e-5, atol=1e-5), "bf16": dict(rtol=2e-2, atol=2e-2)}


def heuristic(name, M, N, dtype="bf16"):
    fd = catalogue.define(name, dtype)
    st = setup(fd, empty_inputs(name, M, N, dtype), alignment=16)
    return iop.compute_heuristics(st.fusion, st.info), st


# The heuristic -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name,M,N,dtype,cluster", [
    ("rmsnorm_bwd", 4096, 65536, "bf16", 2), ("layernorm_bwd", 4096, 65536, "bf16", 4),
    ("rmsnorm_bwd", 2048, 131072, "bf16", 4), ("layernorm_bwd", 2048, 131072, "bf16", 8),
    ("rmsnorm_bwd", 4096, 65536, "fp32", 4), ("layernorm_bwd", 4096, 65536, "fp32", 4),
    ("layernorm_bwd", 2048, 32768, "bf16", 2),
])
def test_long_rows_take_the_smallest_cluster_that_fits(name, M, N, dtype, cluster):
    p, st = heuristic(name, M, N, dtype)
    assert p.cluster == cluster
    share = N // cluster
    assert share % p.vector == 0 and p.row_extents == (N,)
    # P x bdimx x V covers the block's share, with fewer than one vector per thread to spare.
    assert p.persistent_batch * p.bdimx * p.vector >= share
    assert p.persistent_batch * (p.bdimx - 1) * p.vector < share
    # The smallest: half the cluster leaves a share no block can hold.
    in_bytes = 4 if dtype == "fp32" else 2
    cols = ROW_REDUCTIONS[name]
    assert iop._block_share(2 * share, p.vector, in_bytes, cols)[0] is None
    assert iop._block_share(share, p.vector, in_bytes, cols)[0] is not None
    # G x C blocks, all resident (one or two per SM).
    sms = st.info.device.sm_count
    assert p.grid * p.cluster <= 2 * sms and p.grid >= sms // p.cluster
    for text in (p.reason, p.describe()):
        assert f"cluster of {cluster} blocks" in text
    assert "registers" in p.reason and "distributed shared memory" in p.reason


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("M,N", [(16384, 1024), (16384, 4096), (2048, 16384), (1000, 5120),
                                 (3, 1000)])
def test_rows_that_fit_one_block_keep_one_block(name, M, N):
    p, _ = heuristic(name, M, N)
    assert p.cluster == 1 and "fits one block" in p.reason and "cluster" not in p.describe()
    _, _, _, k = schedule_and_lower(catalogue.define(name, "bf16"), empty_inputs(name, M, N),
                                    params=p, scheduler=iop, alignment=16)
    assert k.launch.cluster is None and k.launch.cooperative
    assert not any(isinstance(s, K.ClusterReduce) for s in K.walk(k.body))
    assert not any(isinstance(s, K.ForLoop) and s.parallel == "BIDy" for s in K.walk(k.body))
    src = generate_cuda(k)
    kernel_text = src[src.index("typedef"):]
    assert "cluster" not in kernel_text and "pf_bidy *" not in kernel_text


def test_rmsnorm_32768_keeps_one_block_with_partials_in_shared_memory():
    p, _ = heuristic("rmsnorm_bwd", 2048, 32768)
    assert (p.cluster, p.partials_in_shared) == (1, True)


def test_rows_beyond_the_largest_cluster_are_refused():
    fd = catalogue.define("layernorm_bwd", "fp32")
    st = setup(fd, empty_inputs("layernorm_bwd", 64, 1 << 20, "fp32"), alignment=16)
    with pytest.raises(SchedulerError, match="split over a cluster of 8 blocks: 131072 elements "
                                             "per block need about"):
        iop.compute_heuristics(st.fusion, st.info)


# Lowering, CUDA and ptxas ------------------------------------------------------------------------


def _enclosing_parallel(kernel, target) -> list:
    from kir_testing import enclosing
    return [s.parallel for s in enclosing(kernel, target) if isinstance(s, K.ForLoop)]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("M,N,dtype", [(4096, 65536, "bf16"), (2048, 131072, "bf16"),
                                       (4096, 65536, "fp32")])
def test_cluster_kernels_lower_and_compile_without_spills(name, M, N, dtype):
    fd = catalogue.define(name, dtype)
    st, _, p, k = schedule_and_lower(fd, empty_inputs(name, M, N, dtype), scheduler=iop,
                                     alignment=16)
    c = p.cluster
    assert c > 1
    assert k.launch.cluster == (1, c, 1) and k.launch.cooperative
    grid = [int(S.evaluate(g, dict(st.bindings))) for g in k.launch.grid]
    assert grid == [p.grid, c, 1]
    # dx: a block all-reduce over threadIdx.x, then a cluster all-reduce over blockIdx.y per
    # row reduction; no grid reduction (the column sums are phase 2, after the grid sync).
    reds = [s for s in K.walk(k.body) if isinstance(s, K.ClusterReduce)]
    assert len(reds) == ROW_REDUCTIONS[name]
    assert all(r.dim == "y" and r.size == c for r in reds)
    col_outs = [j for j, o in enumerate(fd.fusion.outputs)
                if len(o.domain.logical_no_reductions) == 1]
    assert col_outs
    # Block all-reduces: one per row reduction, and one per column sum (phase 2's tiles).
    assert len([s for s in K.walk(k.body) if isinstance(s, K.BlockReduce)]) == \
        len(reds) + len(col_outs)
    assert not any(isinstance(s, K.GridReduce) for s in K.walk(k.body))
    assert sum(isinstance(s, K.GridSync) for s in K.walk(k.body)) == 1
    # Phase 2: each column sum (an output of N elements) is written inside a loop over
    # blockIdx.y and a grid-stride loop over blockIdx.x: the C slices, not C copies.
    for j in col_outs:
        buf = next(q.buffer for q in k.params if q.source == ("output", j))
        (store,) = [s for s in K.walk(k.body) if isinstance(s, K.TensorOp)
                    and isinstance(s.out, K.TensorIndex) and s.out.buffer is buf]
        loops = _enclosing_parallel(k, store)
        assert "BIDy" in loops and "GridStride" in loops and "BIDx" not in loops, loops
    src = generate_cuda(k)
    assert src.count(f"pf::cluster_allreduce_row<{c}>(") == len(reds)
    assert "pf::grid_sync(" in src and "pf::cluster_sync();" in src
    # The blocks of a cluster index their slice: blockIdx.y is bounded by C, so the slice
    # offsets need no predicate against N (predicates would cost registers here).
    assert f"(pf_bidy * {N // c})" in src and f") < {N}))" not in src
    rep = compile_clean(src)
    print(f"{name} {dtype} {M}x{N}: C={c} G={p.grid} P={p.persistent_batch} bdimx={p.bdimx} "
          f"partials_in_shared={p.partials_in_shared}: {rep.summary()}")


# The interpreter against the reference -----------------------------------------------------------
def _forced(name, dtype, M, N, cluster, batch, grid, partials_in_shared):
    fd = catalogue.define(name, dtype)
    inputs = catalogue.make_inputs(name, M, N, dtype, seed=M + N + cluster)
    p, _ = heuristic(name, M, N, dtype)
    vecs = N // cluster // p.vector
    return fd, inputs, dataclasses.replace(
        p, cluster=cluster, persistent_batch=batch, bdimx=-(-vecs // batch), grid=grid,
        partials_in_shared=partials_in_shared, stages=0, prefetch=0, tma_inputs=(),
        warp_specialized=False, compute_rows=0,
        col_vector=iop.phase2_columns(N // cluster, grid))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype,M,N,cluster,batch,grid,shared", [
    ("fp32", 5, 1040, 2, 4, 3, False),   # 33 threads x 4 x 4 > 520: predicated shares
    ("fp32", 5, 1040, 2, 4, 3, True),    # column partials in shared memory
    ("fp32", 2, 1040, 2, 4, 3, False),   # fewer rows than blocks
    ("bf16", 7, 1024, 4, 2, 2, False),
    ("fp32", 9, 2048, 8, 1, 2, False),
])
def test_interpreted_cluster_kernel_matches_the_reference(name, dtype, M, N, cluster, batch,
                                                          grid, shared):
    fd, inputs, p = _forced(name, dtype, M, N, cluster, batch, grid, shared)
    st, _, p, k = schedule_and_lower(fd, inputs, params=p, scheduler=iop, alignment=16)
    assert k.launch.cluster == (1, cluster, 1)
    outs, it = interpret(k, st.bindings, inputs)
    assert it.grid == [grid, cluster, 1]
    for o, r in zip(outs, reference(fd, inputs)):
        torch.testing.assert_close(o.double(), r.double(), **TOL[dtype])
    # Every output element is written exactly once: dx by the block owning its slice, each
    # column sum by one block of its slice's blockIdx.y (not once per cluster block).
    for j, o in enumerate(outs):
        buf = next(q.name for q in k.params if q.source == ("output", j))
        counts = [n for (b, _), n in it.writes.items() if b == buf]
        assert len(counts) == o.numel() and set(counts) == {1}, (j, p)


def test_interpreter_refuses_a_cluster_reduction_some_blocks_skip():
    # A cluster reduction under a predicate that differs between the blocks of a cluster would
    # hang on the GPU (the cluster barrier): the interpreter reports it.
    from kir_testing import Interpreter, InterpreterError
    fd, inputs, p = _forced("rmsnorm_bwd", "fp32", 5, 1040, 2, 4, 3, False)
    st, _, p, k = schedule_and_lower(fd, inputs, params=p, scheduler=iop, alignment=16)
    (node,) = [s for s in K.walk(k.body) if isinstance(s, K.ClusterReduce)]

    def wrap(body):
        for n, s in enumerate(body):
            if s is node:
                body[n] = K.IfThenElse(K.eq(K.Special("blockIdx.y"), K.Const(0)), [s], [])
                return True
            if isinstance(s, K.ForLoop) and wrap(s.body):
                return True
        return False
    assert wrap(k.body)
    with pytest.raises(InterpreterError, match="cluster reduction reached by 1 of 2 CTAs"):
        Interpreter(k, st.bindings).run(inputs)
