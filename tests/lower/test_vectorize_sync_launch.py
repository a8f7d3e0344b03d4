"""Passes vectorize_and_unroll, insert_syncs and launch_config, before and after."""
import re

import pytest
import torch

from kir_testing import (clone_bindings, enclosing, eval_expr, interpret, lower_upto, op_writing,
                         skeleton)
from pyfuser import DataType, FusionDefinition
from pyfuser.codegen.device_library import (block_allreduce_x_smem_elems,
                                            block_allreduce_y_smem_elems)
from pyfuser.ir import ParallelType as PT
from pyfuser.ir import scalar as S
from pyfuser.ir.tensor import MemoryType, ScheduleError
from pyfuser.kir import nodes as K
from pyfuser.lower import LoweringError
from pyfuser.schedule import (cache_after, cache_before, inline_at, inline_most, parallelize_like,
                              propagate_transforms, rfactor, set_memory_type)


def _vectorized_square(dtype=DataType.Half, vec=8, vectorize_math=False, n=-1):
    """y = a * a: a's register cache and y's register copy are vectorized by `vec`; threads 32."""
    with FusionDefinition() as fd:
        a = fd.define_tensor([n], dtype=dtype)
        fd.add_output(fd.ops.mul(a, a))
    f, mapping = fd.fusion.clone()
    y = f.outputs[0]
    ca = cache_after(f.inputs[0])
    cb = cache_before(y)
    y.split(0, vec).split(0, 32).parallelize(0, PT.BIDx).parallelize(1, PT.TIDx)
    propagate_transforms(y)
    parallelize_like(y)
    ca.parallelize(-1, PT.Vectorize)
    y.parallelize(-1, PT.Vectorize)
    if vectorize_math:
        cb.parallelize(-1, PT.Vectorize)
    inline_most(fusion=f)
    return fd, f, mapping


# vectorize_and_unroll -----------------------------------------------------------------------------
@pytest.mark.parametrize("vectorize_math", [False, True])
def test_copies_in_vector_loops_become_one_vector_access(vectorize_math):
    fd, f, mapping = _vectorized_square(vectorize_math=vectorize_math)
    texts = {}
    k = lower_upto(f, "vectorize_and_unroll", texts=texts)
    assert texts["index_and_predicate"].count("in Vectorize[0, 8)") == 2 + vectorize_math
    assert skeleton(k.body) == ["for BIDx[ceilDiv(ceilDiv(i0, 8), 32)]", ["for TIDx[32]", [
        "alloc local T3[8]", "alloc local T2[8]",
        "T2 = LoadStoreOp(T0) <8>",
        "for S[8]", ["T3 = mul(T2, T2)"],          # math is not a copy: an unrolled loop
        "T1 = LoadStoreOp(T3) <8>"]]]
    math_loop = next(s for s in K.walk(k.body) if isinstance(s, K.ForLoop) and s.parallel == "Serial")
    assert math_loop.unroll
    load, store = op_writing(k, "T2"), op_writing(k, "T1")
    for op in (load, store):
        assert op.vector == 8 and all(a.vector == 8 for a in [op.out] + op.ins)
        assert "j" not in repr(op.out.index) + repr(op.ins[0].index)   # no lane variable left
    for bx in range(3):
        for tx in range(32):
            env = {"blockIdx.x": bx, "threadIdx.x": tx, "i0": 700}
            lane0 = (bx * 32 + tx) * 8
            assert eval_expr(load.ins[0].index, env) == lane0
            assert eval_expr(load.out.index, env) == 0
            assert eval_expr(store.out.index, env) == lane0
            assert eval_expr(load.predicate, env) == (lane0 < 700)
    assert k.vector_widths == {"T0": 8, "T1": 8}


@pytest.mark.parametrize("n", [8, 256, 1024, 2056])
def test_vectorized_kernel_runs(n):
    fd, f, mapping = _vectorized_square(DataType.Float, vec=4)
    k = lower_upto(f)
    x = torch.randn(n)
    (o,), it = interpret(k, clone_bindings(fd, mapping, [x]), [x])
    torch.testing.assert_close(o, x * x)
    assert len(it.writes) == n and set(it.writes.values()) == {1}


def _vector_loop_around_a_broadcast_loop():
    """y = -x for x of shape [1, M, N]: loops (M on BIDx, N / 4 on TIDx, 4 vectorized, then the
    size-1 broadcast dim), so the broadcast dim's one-iteration loop sits inside the vector loop
    of x's register cache and of y's store."""
    with FusionDefinition() as fd:
        a = fd.define_tensor([1, -1, -1], contiguity=[True, None, True], stride_order=[1, 2, 0])
        fd.add_output(fd.ops.neg(a))
    f, mapping = fd.fusion.clone()
    y = f.outputs[0]
    ca = cache_after(f.inputs[0])
    cache_before(y)
    y.reorder([1, 2, 0]).split(1, 4)                       # [M, N / 4, 4, b0]
    y.parallelize(0, PT.BIDx).parallelize(1, PT.TIDx)
    propagate_transforms(y)
    parallelize_like(y)
    for tv in (ca, y):
        assert tv.loop[3].is_broadcast and tv.loop[3].const_extent == 1
        tv.parallelize(2, PT.Vectorize)
    inline_most(fusion=f)
    return fd, f, mapping


def test_one_iteration_loops_inside_a_vector_loop_fold_away():
    fd, f, mapping = _vector_loop_around_a_broadcast_loop()
    k = lower_upto(f)
    load, store = op_writing(k, "T2"), op_writing(k, "T1")     # x's cache, y
    for op in (load, store):
        assert op.vector == 4 and all(a.vector == 4 for a in [op.out] + op.ins)
        # Nothing but the block and thread dims encloses the copies: no lane or broadcast loop.
        assert [s.parallel for s in enclosing(k, op) if isinstance(s, K.ForLoop)] == [
            "BIDx", "TIDx"]
    assert k.vector_widths == {"T0": 4, "T1": 4}
    x = torch.randn(5, 1, 36).permute(1, 0, 2)
    (o,), it = interpret(k, clone_bindings(fd, mapping, [x]), [x])
    torch.testing.assert_close(o, -x)
    assert len(it.writes) == x.numel() and set(it.writes.values()) == {1}


def _vector_loop_off_the_stride_1_dim(kind):
    """A schedule that slips past parallelize's rule (the Vectorize type set directly on the
    axis): "size1", y = max(a, b) of a [N] and a [1] input, b's cache vectorized along its
    broadcast dim; "permute", y = permute(x) of an [A, B] input, x's cache vectorized along A,
    the output's stride-1 dim but not x's."""
    with FusionDefinition() as fd:
        if kind == "size1":
            a, b = fd.define_tensor([-1]), fd.define_tensor([1])
            fd.add_output(fd.ops.maximum(a, b))
        else:
            fd.add_output(fd.ops.set(fd.ops.permute(fd.define_tensor([-1, -1]), [1, 0])))
    f, _ = fd.fusion.clone()
    y = f.outputs[0]
    caches = [cache_after(x) for x in f.inputs]
    cache_before(y)
    if kind == "permute":
        y.merge(0, 1)
    y.split(0, 4).split(0, 32).parallelize(0, PT.BIDx).parallelize(1, PT.TIDx)
    propagate_transforms(y)
    parallelize_like(y)
    bad = caches[-1]
    with pytest.raises(ScheduleError, match="a vector access must be contiguous in memory"):
        bad.parallelize(-1, PT.Vectorize)
    bad.axis(-1).parallel_type = PT.Vectorize
    inline_most(fusion=f)
    return f, bad.definition.inputs[0]


@pytest.mark.parametrize("kind,walks", [("size1", "no single dim"), ("permute", "iS0{i0}")])
def test_a_vector_access_off_the_stride_1_dim_fails_to_lower(kind, walks):
    """Instead of all lanes reading the [1] input's one element (out of bounds), or lanes one
    row apart, lowering refuses the vector access (an internal error: the executor falls back)."""
    f, x = _vector_loop_off_the_stride_1_dim(kind)
    inner = "(none: every dim is a broadcast)" if kind == "size1" else "iS1{i1}"
    with pytest.raises(LoweringError, match=rf"a 4-wide vector access of T{x.name} steps through "
                                            rf"{re.escape(walks)}, not its stride-1 dim "
                                            rf"{re.escape(inner)}"):
        lower_upto(f)


def test_unroll_small_constant_serial_loops_only():
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, 48, 16])
        fd.add_output(fd.ops.neg(a))
    f, _ = fd.fusion.clone()
    y = f.outputs[0]
    y.split(2, 4).parallelize(3, PT.Unroll)     # [i0, 48, 4, 4 (Unroll)]
    k = lower_upto(f, "vectorize_and_unroll")
    loops = [s for s in K.walk(k.body) if isinstance(s, K.ForLoop)]
    assert [(repr(s.stop), s.unroll) for s in loops] == [
        ("i0", False), ("48", False), ("4", True), ("4", True)]
    assert loops[3].parallel == "Unroll"


def _lane_loop(guard, extra_unguarded_write_outside=False):
    """for j in 0..8 (unrolled): float T1[1]; T1[0] = f(T5[j]); if (guard(j)) T7[0] += T1[0]."""
    from pyfuser.lower.vectorize import _guarded_once
    j = K.Var("j")
    guard = guard(j)
    t1 = K.Buffer("T1", DataType.Float, "local", K.Const(1))
    t5 = K.Buffer("T5", DataType.Float, "local", K.Const(8))
    t7 = K.Buffer("T7", DataType.Float, "local", K.Const(1))
    body = [K.Allocate(t1),
            K.TensorOp(None, K.TensorIndex(t1, K.Const(0)), [K.TensorIndex(t5, j)]),
            K.TensorOp(None, K.TensorIndex(t7, K.Const(0)), [K.TensorIndex(t1, K.Const(0))],
                       predicate=guard, accumulate=True)]
    if extra_unguarded_write_outside:    # a register the loop does not allocate
        body.append(K.TensorOp(None, K.TensorIndex(t5, j), [K.TensorIndex(t1, K.Const(0))]))
    loop = K.ForLoop(j, K.Const(0), K.Const(8), K.Const(1), body, unroll=True)
    return loop, _guarded_once(loop)


def test_a_lane_free_per_thread_guard_is_hoisted_around_an_unrolled_loop():
    """A thread's accumulation of a vector's lanes, bounded by the vector's index (the same for
    every lane): one guard around the loop, none on the ops (nvcc kept a branch per lane)."""
    vec = K.add(K.mul(K.Var("j4"), K.Const(512)), K.Special("threadIdx.x"))
    guard = K.lt(vec, K.Var("n8"))
    loop, out = _lane_loop(lambda j: guard)
    assert isinstance(out, K.IfThenElse) and out.cond is guard
    (inner,) = out.then_body
    assert isinstance(inner, K.ForLoop) and inner.unroll
    assert all(isinstance(op.predicate, K.Const) and op.predicate.value is True
               for op in inner.body if isinstance(op, K.TensorOp))


@pytest.mark.parametrize("case", ["lane", "block_uniform", "escapes"])
def test_guards_that_stay_on_the_ops(case):
    """Left as it is: a guard that depends on the lane; one the same for every thread of the
    block (a persistent kernel's row guard, which nvcc predicates: hoisted, the layernorm
    backward lost 3%); an unguarded op writing a register the loop does not allocate."""
    j4, tid = K.Var("j4"), K.Special("threadIdx.x")
    guard = {"lane": lambda j: K.lt(K.add(K.mul(tid, K.Const(8)), j), K.Var("n")),
             "block_uniform": lambda j: K.lt(K.add(K.mul(j4, K.Const(264)),
                                                   K.Special("blockIdx.x")), K.Var("n")),
             "escapes": lambda j: K.lt(tid, K.Var("n"))}[case]
    loop, out = _lane_loop(guard, extra_unguarded_write_outside=case == "escapes")
    assert out is loop


# insert_syncs -------------------------------------------------------------------------------------
def _shared_copy(serial_rows=False):
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, 64])
        fd.add_output(fd.ops.neg(a))
    f, mapping = fd.fusion.clone()
    y = f.outputs[0]
    ca = cache_after(f.inputs[0])
    set_memory_type(ca, MemoryType.Shared)
    if not serial_rows:
        y.parallelize(0, PT.BIDx)
    y.parallelize(1, PT.TIDx)
    propagate_transforms(y)
    parallelize_like(y)
    inline_at(ca, 1)
    return fd, f, mapping


def test_shared_write_then_read_gets_a_block_sync():
    fd, f, mapping = _shared_copy()
    texts = {}
    k = lower_upto(f, "insert_syncs", texts=texts)
    assert "block_sync" not in texts["vectorize_and_unroll"]
    assert skeleton(k.body) == ["alloc shared T2[64]", "for BIDx[i0]", [
        "for TIDx[64]", ["T2 = LoadStoreOp(T0)"], "sync", "for TIDx[64]", ["T1 = neg(T2)"]]]
    x = torch.randn(3, 64)
    (o,), _ = interpret(lower_upto(f), clone_bindings(fd, mapping, [x]), [x])
    torch.testing.assert_close(o, -x)


def test_loop_that_rewrites_shared_memory_syncs_at_the_end_of_each_iteration():
    fd, f, mapping = _shared_copy(serial_rows=True)
    k = lower_upto(f, "insert_syncs")
    assert skeleton(k.body) == ["alloc shared T2[64]", "for S[i0]", [
        "for TIDx[64]", ["T2 = LoadStoreOp(T0)"], "sync", "for TIDx[64]", ["T1 = neg(T2)"],
        "sync"]]


def test_no_shared_memory_no_syncs():
    fd, f, _ = _vectorized_square()
    k = lower_upto(f)
    assert not any(isinstance(s, K.BlockSync) for s in K.walk(k.body))


# launch_config ------------------------------------------------------------------------------------
def test_launch_dims_from_parallel_extents():
    fd, f, mapping = _vectorized_square()
    k = lower_upto(f)
    lc = k.launch
    assert [repr(g) if not isinstance(g, int) else g for g in lc.grid][1:] == [1, 1]
    for n, blocks in [(1, 1), (256, 1), (257, 2), (8192, 32)]:
        assert S.evaluate(lc.grid[0], {f.inputs[0].logical[0].extent: n}) == blocks
    assert [S.evaluate(b, {}) for b in lc.block] == [32, 1, 1]
    assert lc.max_threads == 32 and not lc.cooperative and lc.cluster is None


def test_launch_hints_override_and_symbolic_blocks():
    fd, f, _ = _vectorized_square()
    f.launch_hints = {"grid_x": 7, "cooperative": True, "min_blocks": 2}
    k = lower_upto(f)
    assert k.launch.grid[0] == 7 and k.launch.cooperative and k.launch.min_blocks == 2
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1])
        fd.add_output(fd.ops.neg(a))
    f, _ = fd.fusion.clone()
    f.outputs[0].parallelize(0, PT.TIDx)
    k = lower_upto(f)
    assert repr(k.launch.block[0]) == "i0" and k.launch.max_threads is None


def _row_sum(bdimx, bdimy, grid_split=1):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sum(x, [1]))
    f, mapping = fd.fusion.clone()
    red = cache_before(f.outputs[0])
    red.split(1, bdimx).split(0, bdimy)         # [I/By, By, R/Bx, Bx]
    red.parallelize(0, PT.BIDx).parallelize(1, PT.TIDy).parallelize(3, PT.TIDx)
    if grid_split > 1:
        red.split(2, grid_split, inner_split=False)
        red.parallelize(2, PT.BIDy)
        rf = rfactor(red, [3])
    else:
        rf = rfactor(red, [2])
    propagate_transforms(rf)
    parallelize_like(rf)
    inline_most(fusion=f)
    return fd, f, mapping


@pytest.mark.parametrize("bdimx,bdimy", [(32, 4), (64, 2), (128, 1), (16, 8), (48, 2), (100, 1)])
def test_block_reduction_workspace_follows_the_device_library(bdimx, bdimy):
    fd, f, mapping = _row_sum(bdimx, bdimy)
    k = lower_upto(f)
    assert [S.evaluate(b, {}) for b in k.launch.block] == [bdimx, bdimy, 1]
    expected = max(1, block_allreduce_x_smem_elems(1, bdimx, bdimy))
    assert k.reduction_workspace == expected
    # The formula itself: Dx multiple of 32 -> (Dx/32)*rows, 0 for one warp; power-of-two
    # divisors of 32 -> shuffles only; one row of more than 32 threads -> its Dx values and the
    # result; anything else -> a Dx*rows tree.
    assert block_allreduce_x_smem_elems(1, bdimx, bdimy) == {
        32: 0, 64: 2 * bdimy, 128: 4 * bdimy, 16: 0, 48: 48 * bdimy, 100: 101}[bdimx]
    x = torch.randn(5, 3 * bdimx + 1)
    (o,), _ = interpret(k, clone_bindings(fd, mapping, [x]), [x])
    torch.testing.assert_close(o, x.sum(1))


def test_grouped_y_reduction_workspace():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sum(x, [0]))
    f, _ = fd.fusion.clone()
    red = cache_before(f.outputs[0])
    # [R, I] -> [I/(4*16), 16 (TIDx), 4 (group)] x [R/8, 8 (TIDy)]
    red.split(1, 4).split(1, 16).split(0, 8).reorder([2, 0, 1, 3, 4])
    red.parallelize(0, PT.BIDx).parallelize(2, PT.TIDy).parallelize(3, PT.TIDx)
    rf = rfactor(red, [1])
    propagate_transforms(rf)
    parallelize_like(rf)
    inline_most(fusion=f)
    k = lower_upto(f)
    br = next(s for s in K.walk(k.body) if isinstance(s, K.BlockReduce))
    assert br.dims == ("y",) and br.values[0].vector == 4
    assert k.reduction_workspace == block_allreduce_y_smem_elems(4, 16, 8) == 4 * 16 * 8


def test_grid_reduction_adds_no_shared_workspace():
    """The grid step goes through the global workspace; only the block step uses shared memory,
    so a grid split must not grow the block's shared workspace."""
    fd, f, mapping = _row_sum(64, 2, grid_split=2)
    k = lower_upto(f)
    assert any(isinstance(s, K.GridReduce) for s in K.walk(k.body))
    assert k.reduction_workspace == block_allreduce_x_smem_elems(1, 64, 2) == 4
    x = torch.randn(3, 300)
    (o,), _ = interpret(k, clone_bindings(fd, mapping, [x]), [x])
    torch.testing.assert_close(o, x.sum(1))
