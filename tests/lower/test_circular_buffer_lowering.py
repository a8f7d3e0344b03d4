"""The TMA variant of the inner persistent scheduler and the circular-buffer pass (CPU).

Structure of the lowered kernel (mbarrier init, prologue, main loop, epilogue, parities,
invalidation), the interpreter running it against the reference (the interpreter models
mbarrier phases and bulk copies, so a wrong parity, slot or byte count fails here), the choice
and its reasons, and NVRTC compiles for sm_90a with a clean ptxas report.
"""
import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kir_testing import compile_clean  # noqa: E402
from kir_testing import (InterpreterError, empty_inputs, forced_inner_persistent,  # noqa: E402
                         interpret, lowered_inner_persistent, reference, schedule_and_lower,
                         setup)
from pyfuser import FusionDefinition, catalogue, options  # noqa: E402
from pyfuser.codegen.cuda import generate_cuda  # noqa: E402
from pyfuser.kir import nodes as K  # noqa: E402
from pyfuser.lower.pipeline import EPILOGUE, MAIN_LOOP  # noqa: E402
from pyfuser.schedule.schedulers import inner_persistent as ip  # noqa: E402
from pyfuser.schedule.tma_rules import check_bulk_rows  # noqa: E402

FORWARD = ["rmsnorm_fwd", "layernorm_fwd", "softmax", "log_softmax", "add_rmsnorm_fwd"]
TOL = {"fp32": dict(rtol=1e-5, atol=1e-5), "bf16": dict(rtol=2e-2, atol=2e-2)}


def forced_tma(fd, inputs, **changes):
    return forced_inner_persistent(fd, inputs, "tma_inner_persistent", **changes)


def lowered(name, M, N, dtype="bf16", **changes):
    return lowered_inner_persistent(name, M, N, dtype, "tma_inner_persistent", **changes)


def _loops(kernel, label):
    return [s for s in K.walk(kernel.body) if isinstance(s, K.ForLoop) and s.label == label]


def test_pipelined_structure():
    fd, inputs, st, p, k = lowered("rmsnorm_fwd", 100, 1024, stages=4, prefetch=3, grid=5)
    assert [(s, pf, kind) for _, s, pf, kind in k.circular_buffers] == [(4, 3, "pipelined")]
    body = k.body
    allocs = [s for s in body if isinstance(s, K.MBarrierAlloc)]
    assert len(allocs) == 1 and allocs[0].bars.count == 4
    # One thread initializes every stage's barrier (one arrival each), fences, then the block
    # synchronizes before any copy.
    init_if = next(s for s in body if isinstance(s, K.IfThenElse)
                   and any(isinstance(x, K.MBarrierInit) for x in s.then_body))
    inits = [x for x in init_if.then_body if isinstance(x, K.MBarrierInit)]
    assert [x.bar.index.value for x in inits] == [0, 1, 2, 3]
    assert all(x.arrivals.value == 1 for x in inits)
    assert isinstance(init_if.then_body[-1], K.FenceMBarrierInit)
    assert isinstance(body[body.index(init_if) + 1], K.BlockSync)
    # Prologue: `prefetch` guarded issues of iterations 0, 1, 2 into stages 0, 1, 2.
    prologue = [s for s in body if isinstance(s, K.IfThenElse)
                and any(isinstance(x, K.BulkLoad) for x in K.walk(s.then_body))]
    assert len(prologue) == 3
    for j, s in enumerate(prologue):
        loads = [x for x in K.walk(s.then_body) if isinstance(x, K.BulkLoad)]
        assert {x.bar.index.value for x in loads} == {j}
        assert all(x.bytes.value == 1024 * 2 for x in loads)
        arrives = [x for x in K.walk(s.then_body) if isinstance(x, K.MBarrierArrive)]
        assert [a.bar.index.value for a in arrives] == [j]
    (main,) = _loops(k, MAIN_LOOP)
    (epi,) = _loops(k, EPILOGUE)
    assert repr(main.stop) == "(pf_cb_trips_j11 - 3)" or re.fullmatch(r"\(pf_cb_trips_\w+ - 3\)",
                                                                      repr(main.stop))
    kinds = [type(s).__name__ for s in main.body]
    # The main loop issues iteration k + 3, then waits for k, computes, and ends with a barrier
    # (every thread done with slot k % 4 before iteration k + 1 refills it).
    first_wait = kinds.index("MBarrierWait")
    assert any(isinstance(x, K.BulkLoad) for s in main.body[:first_wait] for x in K.walk([s]))
    assert kinds[-1] == "BlockSync"
    k_var = main.var.name
    issue = next(x for x in K.walk(main.body) if isinstance(x, K.BulkLoad))
    assert repr(issue.bar.index) == f"(({k_var} + 3) % 4)"
    wait = main.body[first_wait]
    assert repr(wait.bar.index) == f"({k_var} % 4)"
    assert repr(wait.parity) == f"(({k_var} / 4) % 2)"
    # The epilogue drains: it waits and computes, and issues nothing.
    assert not any(isinstance(x, K.BulkLoad) for x in K.walk(epi.body))
    assert any(isinstance(x, K.MBarrierWait) for x in epi.body)
    assert repr(epi.start) == f"max({main.stop!r}, 0)"
    # After the loops: a barrier, then one thread invalidates every stage's barrier.
    inval_if = body[-1]
    assert isinstance(body[-2], K.BlockSync)
    assert [x.bar.index.value for x in inval_if.then_body] == [0, 1, 2, 3]
    # Reads of the buffered tensor address the iteration's slot.
    slot_reads = [i for s in K.walk(main.body) if isinstance(s, K.TensorOp) for i in s.ins
                  if isinstance(i, K.TensorIndex) and i.buffer.memory == "shared"]
    assert slot_reads and all(f"(({k_var} % 4) * 2048)" in repr(i.index) for i in slot_reads)
    assert k.bulk_sources == {"T0"}


@pytest.mark.parametrize("name", FORWARD)
@pytest.mark.parametrize("M,N", [(1, 64), (7, 40), (37, 64)])
@pytest.mark.parametrize("stages,grid", [(2, 1), (3, 2), (4, 3)])
def test_interpreted_tma_kernels_match_the_reference(name, M, N, stages, grid):
    fd, inputs, st, p, k = lowered(name, M, N, "fp32", stages=stages, grid=grid)
    outs, it = interpret(k, st.bindings, inputs)
    for o, r in zip(outs, reference(fd, inputs)):
        torch.testing.assert_close(o.double(), r.double(), **TOL["fp32"])
    for j, o in enumerate(fd.fusion.outputs):
        buf = next(q.name for q in k.params if q.source == ("output", j))
        counts = [c for (b, _), c in it.writes.items() if b == buf]
        assert set(counts) == {1} and len(counts) == reference(fd, inputs)[j].numel()


def test_prefetch_below_stages_minus_one():
    fd, inputs, st, p, k = lowered("softmax", 29, 64, "fp32", stages=4, prefetch=1, grid=2)
    outs, _ = interpret(k, st.bindings, inputs)
    torch.testing.assert_close(outs[0].double(), reference(fd, inputs)[0].double(), **TOL["fp32"])


def test_a_wrong_parity_is_caught_by_the_interpreter():
    fd, inputs, st, p, k = lowered("rmsnorm_fwd", 200, 64, "fp32", stages=2, grid=1)
    (main,) = _loops(k, MAIN_LOOP)
    wait = next(s for s in main.body if isinstance(s, K.MBarrierWait))
    wait.parity = K.Const(0)     # right for iteration 0, wrong from the third
    with pytest.raises(InterpreterError, match="would never return"):
        interpret(k, st.bindings, inputs)


def test_choice_and_reasons():
    fd = catalogue.define("rmsnorm_fwd", "bf16")
    inputs = empty_inputs("rmsnorm_fwd", 4096, 4096)
    st = setup(fd, inputs, alignment=16)
    p = ip.compute_heuristics(st.fusion, st.info)
    assert p.stages == 0 and "measured" in p.reason and "tma_inner_persistent" in p.reason
    with options.override(disable=["tma_inner_persistent"]):
        s1 = setup(fd, inputs, alignment=16)
        p = ip.compute_heuristics(s1.fusion, s1.info)
    assert p.stages == 0 and p.reason.startswith("TMA disabled")
    with options.override(enable=["tma_inner_persistent"]):
        s2 = setup(fd, inputs, alignment=16)
        p = ip.compute_heuristics(s2.fusion, s2.info)
        assert (p.stages, p.prefetch, p.tma_inputs) == (4, 3, (0,))
        assert p.grid == 132 * 2 and p.blocks_per_sm == 2
        assert "TMA forced on" in p.describe()
        # An 8-byte aligned input cannot be copied by cp.async.bulk: per-thread cp.async copies
        # of 8 bytes instead (tests/lower/test_cp_async_lowering.py), and why.
        s3 = setup(fd, inputs, alignment=8)
        p = ip.compute_heuristics(s3.fusion, s3.info)
        assert p.stages == 4 and p.tma_inputs == () and p.cp_async_bytes == (8,)
        assert "8-byte aligned, not 16" in p.reason and "not possible" in p.reason
        # A row of 1001 bf16 elements is 2002 bytes.
        odd = empty_inputs("rmsnorm_fwd", 8, 1001)
        s4 = setup(fd, odd, alignment=16)
        p = ip.compute_heuristics(s4.fusion, s4.info)
        assert p.stages == 0 and "2002 bytes" in p.reason


def test_heuristic_reason_is_not_part_of_the_kernel_key():
    a = ip.InnerPersistentParams(8, 4, 128, 2, reason="one")
    b = ip.InnerPersistentParams(8, 4, 128, 2, reason="two")
    assert a == b and hash(a) == hash(b)


@pytest.mark.parametrize("sizes,strides,align,problem", [
    ((4, 64), (64, 1), 16, None),
    ((4, 64), (72, 1), 16, None),
    ((4, 64), (68, 1), 16, "stride 68"),
    ((4, 64), (64, 1), 8, "8-byte aligned"),
    ((4, 60), (64, 1), 16, "120 bytes"),
    ((4, 64), (1, 4), 16, "not contiguous"),
    ((1, 64), (3, 1), 16, None),
])
def test_bulk_row_rules(sizes, strides, align, problem):
    bad = check_bulk_rows(sizes, strides, align, 2)
    if problem is None:
        assert bad == []
    else:
        assert any(problem in b for b in bad), bad


@pytest.mark.parametrize("name", FORWARD)
@pytest.mark.parametrize("M,N", [(16384, 1024), (16384, 4096), (16384, 16384), (7, 5120)])
def test_tma_kernels_compile_clean(name, M, N):
    fd = catalogue.define(name, "bf16")
    inputs = empty_inputs(name, M, N)
    with options.override(enable=["tma_inner_persistent"]):
        st, _, p, k = schedule_and_lower(fd, inputs, alignment=16)
    assert p.stages >= 2, p.reason
    src = generate_cuda(k)
    assert "pf::bulk_copy_g2s(" in src and "pf::mbarrier_wait_parity(" in src
    assert f"__launch_bounds__({k.launch.max_threads}, {p.blocks_per_sm})" in src
    assert k.launch.grid[0] == p.grid
    compile_clean(src)


def test_tma_load_without_a_loop_is_refused():
    from pyfuser.ir import LoadKind
    from pyfuser.lower import LoweringError, lower
    from pyfuser.schedule import cache_after
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, 64])
        fd.add_output(fd.ops.exp(x))
    c = cache_after(x, LoadKind.TmaBulk)
    del c
    with pytest.raises(LoweringError, match="compute-at 0"):
        lower(fd.fusion)


# Long rows: a thread-block cluster per row, reduced through distributed shared memory --------
@pytest.mark.parametrize("n,elem,want", [(16384, 2, 1), (16392, 2, 1), (32768, 2, 2),
                                         (65536, 2, 4), (131072, 2, 8), (262144, 2, 8),
                                         (65536, 4, 8), (131080, 2, 1)])
def test_cluster_size(n, elem, want):
    vector = 16 // elem if n % (16 // elem) == 0 else 1
    assert ip.cluster_size(n, vector, elem, 8, 1) == want


@pytest.mark.parametrize("name", FORWARD)
@pytest.mark.parametrize("M,N", [(4096, 65536), (2048, 131072), (3, 262144)])
def test_cluster_kernels(name, M, N):
    fd = catalogue.define(name, "bf16")
    # A softmax's rows, read twice in all once its max and sum of exp are one pass, go to the
    # looped variant by default (test_inner_looped.py); the cluster is forced here.
    with options.override({"disable": ["looped_inner_persistent"]}):
        st, _, p, k = schedule_and_lower(fd, empty_inputs(name, M, N), alignment=16)
    assert p.cluster == min(8, N // 16384) and "cluster" in p.reason
    assert k.launch.cluster == (1, p.cluster, 1) and not k.launch.cooperative
    assert not k.workspaces, "a cluster reduction needs no global workspace"
    reds = [s for s in K.walk(k.body) if isinstance(s, K.ClusterReduce)]
    n_reductions = {"layernorm_fwd": 2, "softmax": 2, "log_softmax": 2}.get(name, 1)
    assert len(reds) == n_reductions and all(r.dim == "y" and r.size == p.cluster for r in reds)
    assert not any(isinstance(s, K.GridReduce) for s in K.walk(k.body))
    src = generate_cuda(k)
    assert src.count("pf::cluster_allreduce_row<") == n_reductions
    assert "pf::cluster_sync();" in src
    compile_clean(src)
