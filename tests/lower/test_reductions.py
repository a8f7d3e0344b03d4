"""Pass lower_reductions: accumulator initialization, block and grid reductions, grouping."""
import pytest
import torch

from kir_testing import (clone_bindings, enclosing, eval_expr, interpret, lower_upto, op_writing,
                         skeleton)
from pyfuser import FusionDefinition
from pyfuser.ir import ParallelType as PT
from pyfuser.ir.tensor import MemoryType
from pyfuser.kir import nodes as K
from pyfuser.lower import LoweringError
from pyfuser.schedule import (cache_before, inline_most, parallelize_like, propagate_transforms,
                              rfactor, set_memory_type)


def _sum_fd(dim, op="sum"):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(getattr(fd.ops, op)(x, [dim]))
    return fd


def _row_sum(grid_split=False):
    """sum(x, 1): rows on blockIdx.x, columns split by 32 over threadIdx.x and rfactored; with
    grid_split the column steps are also split over 2 blocks of blockIdx.y."""
    fd = _sum_fd(1)
    f, mapping = fd.fusion.clone()
    red = cache_before(f.outputs[0])
    red.split(1, 32)
    if grid_split:
        red.split(1, 2, inner_split=False)
        red.parallelize(0, PT.BIDx).parallelize(1, PT.BIDy).parallelize(3, PT.TIDx)
        rf = rfactor(red, [2])
    else:
        red.parallelize(0, PT.BIDx).parallelize(2, PT.TIDx)
        rf = rfactor(red, [1])
    propagate_transforms(rf)
    parallelize_like(rf)
    inline_most(fusion=f)
    return fd, f, mapping


def _col_sum_grouped():
    """sum(x, 0) of [R, I]: I split by 4 (grouped in the block reduction), R split by 8 over
    threadIdx.y and rfactored: [I/4 (BIDx), R/8, 8 (TIDy), 4]."""
    fd = _sum_fd(0)
    f, mapping = fd.fusion.clone()
    red = cache_before(f.outputs[0])
    red.split(1, 4).split(0, 8).reorder([2, 0, 1, 3])
    red.parallelize(0, PT.BIDx).parallelize(2, PT.TIDy)
    rf = rfactor(red, [1])
    propagate_transforms(rf)
    parallelize_like(rf)
    inline_most(fusion=f)
    return fd, f, mapping


def test_rfactored_row_sum_before_and_after():
    fd, f, mapping = _row_sum()
    texts = {}
    k = lower_upto(f, "lower_reductions", texts=texts)
    assert "block_allreduce" not in texts["allocate"] and "[*] = " not in texts["allocate"]
    assert skeleton(k.body) == ["for BIDx[i0]", [
        "alloc local T2[1]", "init T2",                      # final result, then its init
        "alloc local T3[1]", "init T3",                      # rfactor partial, then its init
        "for S[ceilDiv(i1, 32)]", ["for TIDx[32]", ["T3 = sum(T0)"]],
        "for TIDx[32]", ["T2 = sum(T3)"],
        "block_reduce<x> T2",                                # after the TIDx reduction loop
        "T1 = LoadStoreOp(T2)"]]
    inits = [s for s in K.walk(k.body) if isinstance(s, K.InitValue)]
    assert [(s.out.name, s.value.value) for s in inits] == [("T2", 0.0), ("T3", 0.0)]
    assert k.workspaces == [] and not any(isinstance(s, K.GridReduce) for s in K.walk(k.body))


def test_row_sum_reduces_correctly_for_odd_sizes():
    for shape in [(3, 37), (1, 1), (2, 64), (5, 33)]:
        fd, f, mapping = _row_sum()
        k = lower_upto(f)
        x = torch.randn(*shape)
        (o,), it = interpret(k, clone_bindings(fd, mapping, [x]), [x])
        torch.testing.assert_close(o, x.sum(1))
        assert set(it.writes.values()) == {1}        # threadIdx.x == 0 alone writes each row
        out_op = op_writing(k, "T1")
        assert "threadIdx.x" in repr(out_op.predicate)


def test_max_reduction_initializes_to_minus_infinity():
    fd = _sum_fd(1, "max")
    f, mapping = fd.fusion.clone()
    red = cache_before(f.outputs[0])
    red.split(1, 32).parallelize(0, PT.BIDx).parallelize(2, PT.TIDx)
    rf = rfactor(red, [1])
    propagate_transforms(rf)
    parallelize_like(rf)
    inline_most(fusion=f)
    k = lower_upto(f)
    inits = [s for s in K.walk(k.body) if isinstance(s, K.InitValue)]
    assert inits and all(s.value.scalar.value == float("-inf") for s in inits)
    x = -torch.rand(3, 45) - 1                     # all negative: a 0 init would be wrong
    (o,), _ = interpret(k, clone_bindings(fd, mapping, [x]), [x])
    torch.testing.assert_close(o, x.max(1).values)


def test_serial_reduction_needs_no_cross_thread_step():
    fd = _sum_fd(1, "max")
    f, mapping = fd.fusion.clone()
    red = cache_before(f.outputs[0])
    red.parallelize(0, PT.TIDx)
    propagate_transforms(red)
    parallelize_like(red)
    inline_most(fusion=f)
    k = lower_upto(f)
    assert not any(isinstance(s, (K.BlockReduce, K.GridReduce)) for s in K.walk(k.body))
    assert skeleton(k.body) == ["for TIDx[i0]", ["alloc local T2[1]", "init T2",
                                                 "for S[i1]", ["T2 = max(T0)"],
                                                 "T1 = LoadStoreOp(T2)"]]


def test_grouped_outer_reduction_reduces_its_iteration_values_together():
    fd, f, mapping = _col_sum_grouped()
    k = lower_upto(f)
    br = [s for s in K.walk(k.body) if isinstance(s, K.BlockReduce)]
    assert len(br) == 1
    assert br[0].dims == ("y",)
    # The 4 columns of the inner split are one group: one TensorIndex of 4 values from T2[0].
    (v,) = br[0].values
    assert (v.buffer.name, v.vector, repr(v.index)) == ("T2", 4, "0")
    assert [s.loop.parallel for s in enclosing(k, br[0])] == [PT.BIDx]
    for shape in [(37, 5), (8, 4), (1, 9)]:
        x = torch.randn(*shape)
        (o,), it = interpret(k, clone_bindings(fd, mapping, [x]), [x])
        torch.testing.assert_close(o, x.sum(0))
        assert set(it.writes.values()) == {1}


def test_grid_reduction_adds_workspace_parameters_and_last_block_predicate():
    fd, f, mapping = _row_sum(grid_split=True)
    texts = {}
    k = lower_upto(f, "lower_reductions", texts=texts)
    assert [p.name for p in k.params][-2:] == ["pf_gws0", "pf_gsem0"]
    assert [(b.name, kind) for b, kind in k.workspaces] == [("pf_gws0", "grid_reduce_data"),
                                                           ("pf_gsem0", "semaphore")]
    nodes = [s for s in K.walk(k.body) if isinstance(s, (K.BlockReduce, K.GridReduce))]
    assert [type(s).__name__ for s in nodes] == ["BlockReduce", "GridReduce"]
    grid = nodes[1]
    assert grid.dims == ("y",) and grid.thread_dims == ("x",)
    # Both follow the blockIdx.y loop, in the blockIdx.x loop.
    assert enclosing(k, grid) == enclosing(k, nodes[0]) == [k.body[0]]
    k = lower_upto(f)
    out = op_writing(k, "T1")
    assert "pf_grid_last" in repr(out.predicate) and "threadIdx.x" in repr(out.predicate)
    for shape in [(3, 150), (2, 33), (1, 64)]:
        x = torch.randn(*shape)
        (o,), it = interpret(k, clone_bindings(fd, mapping, [x]), [x])
        torch.testing.assert_close(o, x.sum(1))
        assert set(it.writes.values()) == {1}


def test_reduction_into_global_memory_is_refused():
    fd = _sum_fd(1)
    f, _ = fd.fusion.clone()
    out = f.outputs[0]
    out.split(1, 32).parallelize(0, PT.BIDx).parallelize(2, PT.TIDx)
    with pytest.raises(LoweringError, match=r"T1 is the output of a reduction in global memory.*"
                                            "cache_before"):
        lower_upto(f, "lower_reductions")


def test_reduction_into_shared_memory_is_refused():
    fd = _sum_fd(1)
    f, _ = fd.fusion.clone()
    red = cache_before(f.outputs[0])
    set_memory_type(red, MemoryType.Shared)
    red.split(1, 32).parallelize(2, PT.TIDx)
    with pytest.raises(LoweringError, match="a block or grid reduction reduces registers"):
        lower_upto(f, "lower_reductions")


def test_block_reduce_values_index_the_first_group_element():
    fd, f, mapping = _row_sum()
    k = lower_upto(f)
    br = next(s for s in K.walk(k.body) if isinstance(s, K.BlockReduce))
    assert eval_expr(br.values[0].index, {"blockIdx.x": 3}) == 0


def _grid_reduce(name):
    from types import SimpleNamespace
    from pyfuser.ir.dtype import DataType
    ws = K.Buffer(f"{name}_ws", DataType.Float, "global")
    sem = K.Buffer(f"{name}_sem", DataType.Int32, "global")
    node = K.GridReduce([], "sum", DataType.Float, ("y",), ws, sem, None, ("x",))
    node.tv = SimpleNamespace(name=name)
    return node


def test_grid_reductions_over_the_same_dims_follow_the_first_last_block():
    """The second grid reduction over blockIdx.y of a scope follows the first one's last block
    (one block holds both results); one under a loop the first is not in cannot, and is a
    LoweringError rather than outputs written by a block holding only one of them."""
    from pyfuser.lower.reductions import _follow_the_first_last_block
    from types import SimpleNamespace
    first, second, other = _grid_reduce("T1"), _grid_reduce("T2"), _grid_reduce("T3")
    other.dims = ("x",)
    _follow_the_first_last_block(SimpleNamespace(body=[first, other, second]))
    assert (first.follows_last_block, second.follows_last_block, other.follows_last_block) == (
        False, True, False)
    nested = _grid_reduce("T4")
    loop = K.ForLoop(K.Var("j0", "index"), K.Const(0), K.Const(4), K.Const(1), [nested])
    with pytest.raises(LoweringError, match="different scopes"):
        _follow_the_first_last_block(SimpleNamespace(body=[_grid_reduce("T5"), loop]))
