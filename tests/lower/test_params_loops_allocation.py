"""Passes kernel_params, build_loops and allocate, before and after, on small kernels."""
import pytest
import torch

from kir_testing import (clone_bindings, enclosing, interpret, lower_upto, op_writing, ops,
                         skeleton)
from pyfuser import DataType, FusionDefinition
from pyfuser.ir import ParallelType as PT
from pyfuser.ir.tensor import MemoryType
from pyfuser.kir import nodes as K
from pyfuser.lower import LoweringError
from pyfuser.schedule import (cache_after, inline_at, inline_most, parallelize_like,
                              propagate_transforms, set_memory_type)


# kernel_params ------------------------------------------------------------------------------------
def _params(kernel):
    return [(p.name, p.kind, p.source[0]) for p in kernel.params]


def test_params_dense_inputs_outputs_extents_and_scalars():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
        s = fd.define_scalar(dtype=DataType.Float)
        n = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.mul(fd.ops.mul(fd.ops.cast(x, DataType.Float), s), n))
    f, _ = fd.fusion.clone()
    k = lower_upto(f, "kernel_params")
    assert k.body == []                                  # nothing but parameters yet
    x0, out = f.inputs[0], f.outputs[0]
    o = f"T{out.name}"
    assert _params(k) == [
        ("T0", "ptr", "input"), ("T0_s0", "index", "stride"),   # inner dim: stride 1, no param
        ("s1", "float", "scalar"), ("s2", "int64", "scalar"),
        (o, "ptr", "output"), (f"{o}_s0", "index", "stride"),
        ("i0", "index", "extent"), ("i1", "index", "extent")]
    assert [repr(v) for v in k.ctx.strides[x0]] == ["T0_s0", "1"]
    assert [repr(v) for v in k.ctx.strides[out]] == [f"{o}_s0", "1"]
    assert k.ctx.buffers[x0].memory == "global" and k.ctx.buffers[x0].dtype == DataType.BFloat16
    assert {repr(v) for v in k.ctx.names.values()} >= {"i0", "i1", "s1", "s2"}


def test_params_permuted_non_contiguous_and_broadcast_inputs():
    with FusionDefinition() as fd:
        # stride_order [0, 1]: dim 0 is innermost in memory (a transposed tensor).
        t = fd.define_tensor([-1, -1], stride_order=[0, 1])
        nc = fd.define_tensor([-1, -1], contiguity=[True, False])
        b = fd.define_tensor([1, -1])
        fd.add_output(fd.ops.add(fd.ops.add(t, nc), b))
    f, _ = fd.fusion.clone()
    k = lower_upto(f, "kernel_params")
    t0, nc0, b0 = f.inputs
    assert [repr(v) for v in k.ctx.strides[t0]] == ["1", "T0_s1"]        # unit stride moves
    assert [repr(v) for v in k.ctx.strides[nc0]] == ["T1_s0", "T1_s1"]   # inner not unit
    assert [repr(v) for v in k.ctx.strides[b0]] == ["0", "1"]            # broadcast: none
    assert "T2_s0" not in [p.name for p in k.params]


# build_loops --------------------------------------------------------------------------------------
def _chain(shape=(4, 8)):
    with FusionDefinition() as fd:
        x = fd.define_tensor(list(shape))
        a = fd.ops.exp(x)
        b = fd.ops.neg(a)
        fd.add_output(fd.ops.abs(b))
    f, _ = fd.fusion.clone()
    a, b = [e.outputs[0] for e in f.exprs()][:2]
    return f, a, b, f.outputs[0]


def test_loops_fully_inlined_chain_shares_one_nest():
    f, a, b, out = _chain()
    inline_most(fusion=f)
    k = lower_upto(f, "build_loops")
    assert skeleton(k.body) == ["for S[4]", ["for S[8]", ["T1 = exp(T0)", "T2 = neg(T1)",
                                                          "T3 = abs(T2)"]]]
    outer = k.body[0]
    assert outer.loop.owner is out and outer.body[0].loop.owner is out
    for op in ops(k):
        assert [f_.loop for f_ in enclosing(k, op)] == op.nest


def test_loops_partial_inlining_shares_the_outer_loop_only():
    f, a, b, out = _chain()
    inline_at(a, 1)
    inline_at(b, 2)
    k = lower_upto(f, "build_loops")
    assert skeleton(k.body) == ["for S[4]", ["for S[8]", ["T1 = exp(T0)"],
                                             "for S[8]", ["T2 = neg(T1)", "T3 = abs(T2)"]]]
    own_a, shared_b = k.body[0].body
    assert own_a.loop.owner is a and shared_b.loop.owner is out
    assert own_a.loop is not shared_b.loop


def test_loops_without_inlining_are_separate_nests_in_dependency_order():
    f, a, b, out = _chain()
    k = lower_upto(f, "build_loops")
    assert skeleton(k.body) == ["for S[4]", ["for S[8]", ["T1 = exp(T0)"]],
                                "for S[4]", ["for S[8]", ["T2 = neg(T1)"]],
                                "for S[4]", ["for S[8]", ["T3 = abs(T2)"]]]
    assert len({id(s.loop) for s in K.walk(k.body) if isinstance(s, K.ForLoop)}) == 6


def test_loops_parallel_kinds_and_order_follow_the_loop_domain():
    f, a, b, out = _chain((6, 10))
    out.reorder([1, 0]).split(0, 4)          # [ceilDiv(10, 4), 4, 6]
    out.parallelize(0, PT.BIDx).parallelize(1, PT.TIDy).parallelize(2, PT.TIDx)
    propagate_transforms(out)
    parallelize_like(out)
    inline_most(fusion=f)
    k = lower_upto(f, "build_loops")
    assert skeleton(k.body) == ["for BIDx[3]", ["for TIDy[4]", ["for TIDx[6]", [
        "T1 = exp(T0)", "T2 = neg(T1)", "T3 = abs(T2)"]]]]


def test_loops_norm_pattern_keeps_the_producer_row_resident():
    """e = exp(x) feeds s = sum(e, 1) and y = e / s: e is computed in the row loop, the sum runs
    over its own inner loop, y over another; the row loop is shared."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 16])
        e = fd.ops.exp(x)
        s = fd.ops.sum(e, [1], keepdim=True)
        fd.add_output(fd.ops.div(e, s))
    f, _ = fd.fusion.clone()
    inline_most(fusion=f)
    k = lower_upto(f, "allocate")
    sk = skeleton(k.body)
    assert sk[0] == "for S[i0]"
    inner = sk[1]
    loops = [x for x in inner if isinstance(x, str) and x.startswith("for")]
    assert loops == ["for S[16]", "for S[16]", "for S[16]"]
    bodies = [inner[i + 1] for i, x in enumerate(inner) if isinstance(x, str) and x.startswith("for")]
    assert bodies[0] == ["T1 = exp(T0)"] and bodies[1] == ["T2 = sum(T1)"]
    assert "T4 = div(T1, T3)" in bodies[2]
    # e's row buffer covers the whole row: it is read after the reduction loop finished.
    alloc = next(s for s in K.walk(k.body) if isinstance(s, K.Allocate) and s.buffer.name == "T1")
    assert alloc.buffer.size.value == 16 and alloc in k.body[0].body


def test_loops_of_three_consumers_of_one_inlined_tensor_merge_into_one():
    """t = exp(x) inlined into three outputs, each with its own loops: all four run in one loop
    nest. (The third merge once overwrote the second: t was computed in the loops of two
    outputs while the other read it outside them.)"""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        t = fd.ops.exp(x)
        for k in range(3):
            fd.add_output(fd.ops.add(t, float(k)))
    f, mapping = fd.fusion.clone()
    inline_at(f.outputs[0].definition.inputs[0], 2)
    k = lower_upto(f)
    assert skeleton(k.body) == ["for S[i0]", ["for S[i1]", [
        "alloc local T1[1]", "T1 = exp(T0)", "T2 = add(T1, 0.0)", "T3 = add(T1, 1.0)",
        "T4 = add(T1, 2.0)"]]]
    xs = torch.randn(3, 5)
    outs, _ = interpret(k, clone_bindings(fd, mapping, [xs]), [xs])
    for j, o in enumerate(outs):
        torch.testing.assert_close(o, xs.exp() + j)


def test_loops_over_a_split_broadcast_run_once():
    """A [M, 1] tensor split like a row of 8 by 4 has broadcast axes of extent 4 (a split of a
    broadcast keeps the factor): nothing indexes them, so their loops run once, a buffer over
    them holds one value and the [M, 1] output is written once per row."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 8])
        s = fd.ops.sum(x, [1], keepdim=True)
        fd.add_output(fd.ops.exp(fd.ops.neg(s)))
    f, mapping = fd.fusion.clone()
    e = f.outputs[0]
    n = e.definition.inputs[0]
    for tv in (n, e):
        tv.split(1, 4)
        assert tv.domain.loop[2].is_broadcast and tv.domain.loop[2].extent.value == 4
    inline_most(fusion=f)
    inline_at(n, 1)
    k = lower_upto(f)
    for tv in (n, e):
        assert [lp.extent.value for lp in k.ctx.nest(tv)[1:]] == [1, 1]
    assert _alloc(k, f"T{n.name}").buffer.size.value == 1
    xs = torch.randn(3, 8)
    (o,), it = interpret(k, clone_bindings(fd, mapping, [xs]), [xs])
    torch.testing.assert_close(o, (-xs.sum(1, keepdim=True)).exp())
    assert sorted(it.writes.values()) == [1, 1, 1]


# allocate -----------------------------------------------------------------------------------------
def _alloc(k, name):
    return next(s for s in K.walk(k.body) if isinstance(s, K.Allocate) and s.buffer.name == name)


def test_allocate_places_register_buffers_at_their_compute_at_scope():
    f, a, b, out = _chain()
    inline_at(a, 1)
    inline_at(b, 2)
    texts = {}
    k = lower_upto(f, "allocate", texts=texts)
    assert "alloc" not in texts["build_loops"]
    a1, a2 = _alloc(k, "T1"), _alloc(k, "T2")
    assert (a1.buffer.memory, a1.buffer.size.value) == ("local", 8)   # T1's own loop of 8
    assert (a2.buffer.memory, a2.buffer.size.value) == ("local", 1)   # fully inlined
    assert k.body[0].body[0] is a1                                    # top of the row loop
    assert [s.loop.owner for s in enclosing(k, a2)] == [out, out]
    assert enclosing(k, a2)[-1].body[0] is a2


def test_allocate_without_inlining_sizes_the_whole_tensor():
    f, a, b, out = _chain()
    k = lower_upto(f, "allocate")
    assert [s.buffer.name for s in k.body[:2]] == ["T2", "T1"]
    assert [s.buffer.size.value for s in k.body[:2]] == [32, 32]


def test_allocate_drops_thread_dims_from_registers_and_block_dims_from_shared():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 4, 32])
        fd.add_output(fd.ops.neg(x))
    f, _ = fd.fusion.clone()
    y = f.outputs[0]
    reg = cache_after(f.inputs[0])
    y.parallelize(0, PT.BIDx).parallelize(2, PT.TIDx)
    propagate_transforms(y)
    parallelize_like(y)
    inline_at(reg, 1)
    k = lower_upto(f, "allocate")
    assert (_alloc(k, "T2").buffer.memory, _alloc(k, "T2").buffer.size.value) == ("local", 4)
    f, _ = fd.fusion.clone()
    y = f.outputs[0]
    sh = cache_after(f.inputs[0])
    set_memory_type(sh, MemoryType.Shared)
    y.parallelize(0, PT.BIDx).parallelize(2, PT.TIDx)
    propagate_transforms(y)
    parallelize_like(y)
    inline_at(sh, 0)
    k = lower_upto(f, "allocate")
    buf = _alloc(k, "T2")
    assert k.body[0].buffer is buf.buffer                  # shared: at the kernel's top
    assert (buf.buffer.memory, buf.buffer.size.value) == ("shared", 4 * 32)   # no BIDx


def test_allocate_broadcast_materialized_across_a_loop_takes_the_loop_extent():
    """out[4, 6] = x * b[6] with the loops reordered to (6, 4): the broadcast T2 inlined at 1
    holds one value per row of the inner loop of 4."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 6])
        b = fd.define_tensor([6])
        fd.add_output(fd.ops.mul(x, b))
    f, mapping = fd.fusion.clone()
    out = f.outputs[0]
    bc = out.definition.inputs[1]
    out.reorder([1, 0])
    propagate_transforms(out)
    inline_at(bc, 1)
    k = lower_upto(f)
    assert _alloc(k, "T2").buffer.size.value == 4
    xs, bs = torch.randn(4, 6), torch.randn(6)
    (o,), it = interpret(k, clone_bindings(fd, mapping, [xs, bs]), [xs, bs])
    torch.testing.assert_close(o, xs * bs)


def test_allocate_refuses_runtime_sized_registers():
    f, a, b, out = _chain((-1, 8))
    with pytest.raises(LoweringError, match=r"T1 needs a register buffer of runtime size .*i0.*"
                                            r"split the axes right of its compute-at position"):
        lower_upto(f, "allocate")


def test_global_intermediate_becomes_a_workspace_behind_a_grid_sync():
    """exp(x) placed in global memory between two loop nests over blocks: a dense workspace
    parameter, and a grid barrier before the nest that reads it (a cooperative launch)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 8])
        a = fd.ops.exp(x)
        fd.add_output(fd.ops.neg(a))
    f, mapping = fd.fusion.clone()
    a = f.exprs()[0].outputs[0]
    set_memory_type(a, MemoryType.Global)
    for t in (a, f.outputs[0]):
        t.parallelize(0, PT.BIDx)
    texts = {}
    k = lower_upto(f, texts=texts)
    ws = dict((b.name, kind) for b, kind in k.workspaces)
    assert ws["T1"] == "intermediate"
    buf = k.ctx.buffers[a]
    assert (buf.memory, buf.size.value) == ("global", 32)
    assert [repr(s) for s in k.ctx.strides[a]] == ["8", "1"]
    assert ("workspace", "T1") in [p.source for p in k.params]
    assert "GridSync" not in texts["vectorize_and_unroll"]
    assert skeleton(k.body) == ["for BIDx[4]", ["for S[8]", ["T1 = exp(T0)"]], "GridSync",
                                "for BIDx[4]", ["for S[8]", ["T2 = neg(T1)"]]]
    assert k.launch.cooperative
    xs = torch.randn(4, 8)
    (o,), _ = interpret(k, clone_bindings(fd, mapping, [xs]), [xs])
    torch.testing.assert_close(o, -torch.exp(xs))


def test_allocated_buffers_are_in_scope_of_every_reader():
    f, a, b, out = _chain()
    inline_at(a, 1)
    inline_at(b, 2)
    k = lower_upto(f, "index_and_predicate")
    reader = op_writing(k, "T2")
    assert reader.ins[0].buffer.name == "T1"
    scopes = [s.body for s in enclosing(k, reader)]
    assert any(_alloc(k, "T1") in body for body in [k.body] + scopes)
