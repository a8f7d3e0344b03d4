"""Issue 6, item 6: a fusion over an input whose size-1 dim lies between the others in memory.

T0: shape [1, M, N], allocation (i1, b0, i2), contiguity (t, n, t)
T1 = squeeze(T0); T2 = sum(T1, 1); T3 = broadcast(T2) to [1, M, 1]; T4 = T0 + T3 (output);
T5 = squeeze(T4); T6 = sum(T5, 0) (output)

A row reduction broadcast back over its row and a column reduction of the same rows: the
registry gives it to the inner-outer persistent scheduler, which runs it as one cooperative
kernel. What is checked, all on the CPU and through the automatic path (registry, heuristic,
scheduler; no hand-written schedule):
- which scheduler takes it, and why the others do not;
- the register cache of T0 is allocated from its own loop IDs right of its compute-at position,
  in T0's allocation order, never naming an ID the loop nest split;
- the scheduled fusion and every lowering pass verify;
- the kernel-IR interpreter matches the float64 reference at small shapes (odd ones included)
  with the heuristic's and with forced schedules (several rows per block, a persistent batch,
  partials in shared memory);
- at [1, 4096, 4096] NVRTC compiles the kernel for sm_90a with no spills.
"""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lower"))
from kir_testing import interpret, schedule_and_lower, setup  # noqa: E402

from pyfuser import DataType, FusionDefinition  # noqa: E402
from pyfuser.ir import MemoryType  # noqa: E402
from pyfuser.ir import ParallelType as PT  # noqa: E402
from pyfuser.ir.exprs import LoadStoreOp  # noqa: E402
from pyfuser.ir.iter_domain import ancestors, id_exprs_between  # noqa: E402
from pyfuser.ir.printer import tv_transforms_str  # noqa: E402
from pyfuser.ir.verifier import verify  # noqa: E402
from pyfuser.kir import nodes as K  # noqa: E402
from pyfuser.runtime.inputs import check_inputs  # noqa: E402
from pyfuser.runtime.reference import evaluate  # noqa: E402
from pyfuser.schedule.schedulers import inner_outer_persistent, registry  # noqa: E402
from pyfuser.schedule.schedulers.inner_outer_persistent import InnerOuterParams  # noqa: E402
from pyfuser.testing import TOLERANCE, rel_error, run_and_check  # noqa: E402

TORCH = {DataType.Float: torch.float32, DataType.BFloat16: torch.bfloat16}


def define(dtype=DataType.Float, sizes=(-1, -1)):
    """The fusion of the item; `sizes` (M, N) fixed or -1 (symbolic)."""
    with FusionDefinition("issue6_item6") as fd:
        t0 = fd.define_tensor([1, *sizes], contiguity=[True, None, True], dtype=dtype,
                              stride_order=[1, 2, 0])
        t1 = fd.ops.squeeze(t0, [0])
        t2 = fd.ops.sum(t1, [1])
        t3 = fd.ops.broadcast_in_dim(t2, [1, -1, 1], [1])
        t4 = fd.ops.add(t0, t3)
        fd.add_output(t4)
        t5 = fd.ops.squeeze(t4, [0])
        fd.add_output(fd.ops.sum(t5, [0]))
    return fd


def make_input(M, N, dtype=DataType.Float, seed=0, empty=False):
    """[1, M, N] laid out as (i1, b0, i2): the size-1 dim between the others in memory."""
    if empty:
        x = torch.empty(M, 1, N, dtype=TORCH[dtype])
    else:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(M, 1, N, generator=g).to(TORCH[dtype])
    return x.permute(1, 0, 2)


def t0_cache(fusion):
    """The tensor the scheduler copies T0 into (its only use after cache_after)."""
    (use,) = fusion.uses_of(fusion.inputs[0])
    assert isinstance(use, LoadStoreOp)
    return use.outputs[0]


# Definition and scheduler choice ----------------------------------------------------------------
def test_definition_shapes_and_input_layout():
    fd = define()
    t0 = fd.fusion.inputs[0]
    b0, i1, i2 = t0.logical
    assert b0.is_broadcast and not i1.is_broadcast and not i2.is_broadcast
    assert t0.domain.allocation == [i1, b0, i2]
    assert t0.domain.contiguity == [True, None, True]
    t4, t6 = fd.fusion.outputs
    assert [i.is_broadcast for i in t4.logical] == [True, False, False]
    assert len(t6.domain.logical_no_reductions) == 1
    # Both a contiguous [1, M, N] tensor and the permuted one match the definition.
    for x in (make_input(5, 7), torch.randn(1, 5, 7)):
        assert set(check_inputs(fd.fusion, [x]).values()) == {5, 7}


@pytest.mark.parametrize("sizes", [(-1, -1), (4096, 4096)], ids=["symbolic", "static"])
def test_registry_chooses_inner_outer_persistent(sizes):
    fd = define(DataType.Float, sizes)
    choice = registry.choose(fd.fusion)
    assert choice.scheduler is inner_outer_persistent, choice.reason
    assert choice.rejected == ()                      # tried first, taken
    assert "row reductions broadcast back" in choice.reason
    # The schedulers after it would refuse: the reductions run over different dims.
    others = {s.NAME: s.can_schedule(fd.fusion) for s in registry.SCHEDULERS
              if s is not inner_outer_persistent}
    assert not any(ok for ok, _ in others.values()), others
    assert "row and column" in others["inner_persistent"][1]


# The cache of T0 ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,vector,bdimx", [(DataType.Float, 4, 256),
                                                (DataType.BFloat16, 8, 128)])
@pytest.mark.parametrize("sizes", [(-1, -1), (4096, 4096)], ids=["symbolic", "static"])
def test_t0_cache_is_allocated_from_its_own_loop_ids(dtype, vector, bdimx, sizes):
    fd = define(dtype, sizes)
    st, sch, params, kernel = schedule_and_lower(fd, [make_input(4096, 4096, dtype, empty=True)])
    assert sch is inner_outer_persistent
    assert (params.vector, params.persistent_batch, params.bdimx) == (vector, 4, bdimx)
    verify(st.fusion)
    t0 = st.fusion.inputs[0]
    c = t0_cache(st.fusion)
    assert c.memory_type == MemoryType.Local
    b0, i1, i2 = c.logical
    # C inherited T0's allocation order (i1, b0, i2) in its own IDs.
    assert c.domain.allocation == [i1, b0, i2]
    # Loop: [rows / G, G (BIDx), P, threads (TIDx), V (Vectorize), b0]; rows are shared with
    # the consumers (compute-at 2), the rest is the thread's slice of the row.
    ca = c.compute_at_pos
    assert ca == 2 and c.loop[-1] is b0
    own = c.loop[ca:]
    alloc = c.allocation_domain
    assert set(alloc) == set(own)
    # In T0's allocation order: b0, then the pieces of i2 in loop order.
    assert alloc == [b0] + [i for i in own if i2 in ancestors(i, c.logical)]
    assert [i.parallel_type for i in alloc] == [PT.Serial, PT.Serial, PT.TIDx, PT.Vectorize]
    assert [alloc[0].const_extent, alloc[1].const_extent, alloc[3].const_extent] == [1, 4, vector]
    # No allocation ID was split (or merged) further by the loop nest.
    transformed = {x for e in id_exprs_between(c.logical, c.loop) for x in e.inputs}
    assert not transformed & set(alloc)
    assert {i1, i2} <= transformed
    line = next(ln for ln in tv_transforms_str(c).splitlines() if "allocation domain" in ln)
    assert repr(i1) not in line and repr(i2) not in line
    # T0 itself keeps its global allocation of logical IDs.
    assert t0.allocation_domain == [t0.logical[1], t0.logical[0], t0.logical[2]]
    assert t0.allocation_contiguity == [True, None, True]
    # The kernel's register array of C holds P x V elements (threads and b0 take no room).
    (buf,) = [s.buffer for s in K.walk(kernel.body)
              if isinstance(s, K.Allocate) and s.buffer.tv is c]
    assert buf.memory == "local" and buf.size.value == 4 * vector


# The kernel-IR interpreter against the float64 reference ----------------------------------------
def _check_interpreted(fd, x, dtype, params=None):
    st, sch, params, kernel = schedule_and_lower(fd, [x], params=params,
                                                 scheduler=inner_outer_persistent)
    verify(st.fusion)
    outs, it = interpret(kernel, st.bindings, [x])
    ref = evaluate(fd.fusion, [x], promote_to_double=True,
                   extent_bindings=check_inputs(fd.fusion, [x]))
    xd = x.double()
    t4 = xd + xd.sum(2, keepdim=True)
    by_hand = [t4, t4.squeeze(0).sum(0)]
    for k, (o, r, h) in enumerate(zip(outs, ref, by_hand)):
        assert o.dtype == TORCH[dtype] and o.shape == h.shape
        assert rel_error(o, r) <= TOLERANCE[dtype], (k, params)
        assert rel_error(o, h) <= TOLERANCE[dtype], (k, params)
    # Every output element is written exactly once.
    for j, o in enumerate(outs):
        buf = next(p.name for p in kernel.params if p.source == ("output", j))
        counts = [n for (b, _), n in it.writes.items() if b == buf]
        assert len(counts) == o.numel() and set(counts) == {1}, (j, params)
    return params, kernel


@pytest.mark.parametrize("dtype", [DataType.Float, DataType.BFloat16])
@pytest.mark.parametrize("static", [False, True], ids=["symbolic", "static"])
@pytest.mark.parametrize("M,N", [(64, 96), (33, 40), (7, 33), (300, 17), (2, 2)])
def test_interpreted_kernel_matches_the_reference(M, N, static, dtype):
    fd = define(dtype, (M, N) if static else (-1, -1))
    x = make_input(M, N, dtype, seed=M * N)
    params, _ = _check_interpreted(fd, x, dtype)
    assert params.row_extents == (N,)


@pytest.mark.parametrize("M,N", [(1, 5), (5, 1), (1, 1)])
def test_one_row_or_one_column_at_run_time(M, N):
    # Symbolic sizes that turn out to be 1 run through the same kernel structure.
    _check_interpreted(define(DataType.Float), make_input(M, N, seed=3), DataType.Float)


@pytest.mark.parametrize("M,N", [(1, 5), (5, 1)])
def test_a_size_1_dim_fixed_at_definition_has_no_row_and_column_reduction(M, N):
    # A sum over a dim defined as size 1 is a squeeze, so the fusion lacks one of its two
    # reductions: the inner-outer scheduler refuses and says why instead of failing in
    # lowering, and the plan is other kernels (one reduction kernel at (5, 1): T0, of more
    # dims than the reduction's input, iterates only its reduced dim).
    fd = define(DataType.Float, (M, N))
    choice = registry.choose(fd.fusion)
    assert choice.scheduler is not inner_outer_persistent
    assert ("inner_outer_persistent", "needs both row and column reductions of the same rows") \
        in choice.rejected
    run_and_check(fd, [make_input(M, N, seed=3)], kernels=0, options={"enable": ["interpret"]})
    assert fd.last_run.kind == "kernels" and fd.last_run.num_kernels == (2 if M == 1 else 1)


@pytest.mark.parametrize("M,N,dtype,params", [
    # Several rows per block (grid < M) and a persistent batch that does not divide the row.
    (9, 37, DataType.Float, InnerOuterParams(1, 4, 10, 4, (), (37,))),
    (20, 70, DataType.Float, InnerOuterParams(2, 2, 18, 3, (0,), (70,))),
    (5, 200, DataType.BFloat16, InnerOuterParams(8, 4, 7, 2, (0,), (200,))),
    # Column partials in shared memory.
    (9, 37, DataType.Float, InnerOuterParams(1, 4, 10, 4, (), (37,), partials_in_shared=True)),
    (11, 72, DataType.BFloat16, InnerOuterParams(8, 2, 5, 3, (0,), (72,),
                                                 partials_in_shared=True)),
])
@pytest.mark.parametrize("static", [False, True], ids=["symbolic", "static"])
def test_forced_schedules_match_the_reference(M, N, dtype, params, static):
    fd = define(dtype, (M, N) if static else (-1, -1))
    _, kernel = _check_interpreted(fd, make_input(M, N, dtype, seed=N), dtype, params)
    assert kernel.launch.cooperative and kernel.launch.grid[0] == params.grid


# NVRTC at the item's size ---------------------------------------------------------------------
@pytest.mark.parametrize("dtype,vector", [(DataType.Float, 4), (DataType.BFloat16, 8)])
@pytest.mark.parametrize("M,N,static", [(4096, 4096, True), (4096, 4096, False),
                                        (1000, 1027, False)])
def test_compiles_for_sm90a_without_spills(M, N, static, dtype, vector, tmp_path, monkeypatch):
    pytest.importorskip("cuda.bindings.nvrtc")
    from pyfuser.runtime.fusion_kernel import build_kernel
    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(tmp_path))
    fd = define(dtype, (M, N) if static else (-1, -1))
    st = setup(fd, [make_input(M, N, dtype, empty=True)])
    choice = registry.choose(fd.fusion)
    assert choice.scheduler is inner_outer_persistent
    params = choice.scheduler.compute_heuristics(st.fusion, st.info)
    # As the executor builds it: schedule the clone, lower, print CUDA, compile (NVRTC).
    fk = build_kernel(st.fusion, choice.scheduler, params, "int", "issue6_item6")
    rep = fk.module.ptxas
    assert (rep.spill_store_bytes, rep.spill_load_bytes, rep.stack_frame_bytes) == (0, 0, 0), \
        rep.summary()
    assert rep.warnings == () and 0 < rep.registers <= 255, rep.summary()
    launch = fk.kernel.launch
    assert launch.cooperative and launch.grid[0] == params.grid == 264
    src = fk.source
    # One block all-reduce for the row sum, one for phase 2's column tiles (the threads of a
    # block share the G partials of a tile).
    assert src.count("pf::grid_sync(") == 1
    assert src.count("pf::block_allreduce_x(") + src.count("pf::block_allreduce_x_group<") == 2
    t0, t4 = (next(p.name for p in fk.kernel.params if p.source == role)
              for role in (("input", 0), ("output", 0)))
    width = vector if N % vector == 0 else 1
    assert params.vector == width
    if width > 1:
        # T0 read and T4 written with 16-byte accesses (the trailing b0 loop folds away).
        elem = "float" if dtype == DataType.Float else "pf::bf16"
        assert f"pf::Array<{elem}, {width}>*>(&" in src and f"&{t0}[" in src
        assert f"pf::store_global_vec(&{t4}[" in src
    # T5 = squeeze(T4) reads T4's registers, not the output it just stored.
    assert f"= {t4}[" not in src and f"({t4}[" not in src
