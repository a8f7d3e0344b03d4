"""Pass index_and_predicate: index expressions and predicates, checked by evaluating them at every
loop point of small kernels (kir_testing.eval_expr), and whole kernels run by the interpreter."""
from collections import Counter

import pytest
import torch

from kir_testing import (clone_bindings, eval_expr, expr_vars, interpret, loop_points, lower_upto, op_writing,
                         reference)
from pyfuser import DataType, FusionDefinition
from pyfuser.ir import ParallelType as PT
from pyfuser.kir import nodes as K
from pyfuser.schedule import inline_most, parallelize_like, propagate_transforms


def _flat_split(shape, factor, bias=True, contiguity=None):
    """out[shape] = x + bias[shape[-1]] (bias broadcast over the rows), every tensor flattened
    and split by `factor` over threadIdx.x."""
    with FusionDefinition() as fd:
        x = fd.define_tensor(list(shape), contiguity=contiguity)
        if bias:
            b = fd.define_tensor([shape[-1]])
            fd.add_output(fd.ops.add(x, b))
        else:
            fd.add_output(fd.ops.neg(x))
    f, _ = fd.fusion.clone()
    out = f.outputs[0]
    while len(out.domain.loop) > 1:
        out.merge(0)
    out.split(0, factor).parallelize(1, PT.TIDx)
    propagate_transforms(out)
    parallelize_like(out)
    inline_most(fusion=f)
    return fd, f


def test_evaluator_uses_c_division():
    # C truncates toward zero; index math must never depend on it, but the evaluator must not
    # hide a negative index behind Python's floor division.
    e = K.Bin("/", K.Var("a"), K.Const(4))
    m = K.Bin("%", K.Var("a"), K.Const(4))
    assert eval_expr(e, {"a": -5}) == -1 and eval_expr(m, {"a": -5}) == -1
    assert eval_expr(K.ceil_div(K.Var("a"), 4), {"a": 9}) == 3
    assert eval_expr(K.Bin("&&", K.lt(K.Var("a"), 3), K.eq(K.Special("threadIdx.x"), 0)),
                     {"a": 2, "threadIdx.x": 0}) is True


@pytest.mark.parametrize("row_stride", [7, 9])
def test_5x7_split_by_4_with_broadcast_bias(row_stride):
    """Every loop point: the predicate is `flat < 35`, the output and x are indexed at
    (flat / 7, flat % 7) through their strides, the bias at flat % 7; each element once."""
    contiguity = [row_stride == 7, True]
    _, f = _flat_split((5, 7), 4, contiguity=contiguity)
    k = lower_upto(f, "index_and_predicate")
    op = op_writing(k, "T3")
    bc = op_writing(k, "T2")
    env0 = {"T0_s0": row_stride, "T3_s0": 7}
    if row_stride == 7:
        # A contiguous x has one stride parameter per row, none for the unit inner dim.
        assert [p.name for p in k.params] == ["T0", "T0_s0", "T1", "T3", "T3_s0"]
    points = list(loop_points(k, op, env0))
    assert len(points) == 9 * 4
    written = Counter()
    for env in points:
        flat = env["j0"] * 4 + env["threadIdx.x"]
        # The bias is read with no predicate: its index must stay in bounds everywhere.
        assert eval_expr(bc.ins[0].index, env) == flat % 7
        assert eval_expr(bc.out.index, env) == 0
        assert eval_expr(op.ins[1].index, env) == 0          # register T2 holds one value
        pred = eval_expr(op.predicate, env)
        assert pred == (flat < 35), env
        if pred:
            r, c = divmod(flat, 7)
            assert eval_expr(op.out.index, env) == r * 7 + c
            assert eval_expr(op.ins[0].index, env) == r * row_stride + c
            written[(r, c)] += 1
    assert written == {(r, c): 1 for r in range(5) for c in range(7)}
    assert K.is_true(bc.predicate)


@pytest.mark.parametrize("contiguous", [False, True])
def test_5x7_symbolic_sizes_index_through_runtime_extents(contiguous):
    """The flat loop over x [M, N] + b [N]. x with rows N + 2 apart is addressed row by row
    (flat / N, flat % N); x contiguous is addressed by the flat index itself (no division)."""
    pitch = 0 if contiguous else 2
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=[contiguous, True])
        b = fd.define_tensor([-1])
        fd.add_output(fd.ops.add(x, b))
    f, _ = fd.fusion.clone()
    out = f.outputs[0]
    out.merge(0).split(0, 4).parallelize(1, PT.TIDx)
    propagate_transforms(out)
    parallelize_like(out)
    inline_most(fusion=f)
    k = lower_upto(f, "index_and_predicate")
    op = op_writing(k, "T3")
    bc = op_writing(k, "T2")
    ext = [p.name for p in k.params if p.source[0] == "extent"]
    assert ext == ["i0", "i1", "i2"]
    # The bias extent i2 equals i1 (checked at every call): the index math uses one of them.
    assert len(expr_vars(bc.ins[0].index) & {"i1", "i2"}) == 1
    for M, N in [(5, 7), (3, 4), (1, 1), (2, 9)]:
        env0 = {"i0": M, "i1": N, "i2": N, "T0_s0": N + pitch, "T3_s0": N}
        written = Counter()
        for env in loop_points(k, op, env0):
            flat = env["j0"] * 4 + env["threadIdx.x"]
            assert eval_expr(bc.ins[0].index, env) == flat % N
            if eval_expr(op.predicate, env):
                r, c = divmod(flat, N)
                assert eval_expr(op.out.index, env) == r * N + c
                assert eval_expr(op.ins[0].index, env) == r * (N + pitch) + c
                written[(r, c)] += 1
            else:
                assert flat >= M * N
        assert written == {(r, c): 1 for r in range(M) for c in range(N)}
    # A dense tensor in the flat loop: no division in its index or its guard.
    assert ("/" in repr(op.ins[0].index)) != contiguous
    assert ("/" in repr(op.out.index)) is False
    assert "/" not in repr(op.predicate)


@pytest.mark.parametrize("n", [10, 8])
def test_non_divisible_split_gets_a_bound_predicate(n):
    _, f = _flat_split((n,), 4, bias=False)
    k = lower_upto(f, "index_and_predicate")
    op = op_writing(k, "T1")
    if n % 4 == 0:
        assert K.is_true(op.predicate)      # a divisible split needs no guard
        return
    assert not K.is_true(op.predicate)
    pts = list(loop_points(k, op, {}))
    assert len(pts) == 12
    for env in pts:
        idx = env["j0"] * 4 + env["threadIdx.x"]
        assert eval_expr(op.predicate, env) == (idx < n)
        assert eval_expr(op.out.index, env) == idx


def test_symbolic_split_is_always_guarded():
    _, f = _flat_split((-1,), 4, bias=False)
    k = lower_upto(f, "index_and_predicate")
    op = op_writing(k, "T1")
    assert expr_vars(op.predicate) >= {"i0"}
    for n in (8, 6):
        for env in loop_points(k, op, {"i0": n}):
            idx = env["j0"] * 4 + env["threadIdx.x"]
            assert eval_expr(op.predicate, env) == (idx < n)


def _outer_then_inner(n):
    """[n] split outer by 2 (blockIdx.x), the inner part split by 4 (threadIdx.x):
    in = b * ceilDiv(n, 2) + (s * 4 + t), where s * 4 + t may pass ceilDiv(n, 2)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([n])
        fd.add_output(fd.ops.neg(x))
    f, _ = fd.fusion.clone()
    o = f.outputs[0]
    o.split(0, 2, inner_split=False).split(1, 4)
    o.parallelize(0, PT.BIDx).parallelize(2, PT.TIDx)
    propagate_transforms(o)
    parallelize_like(o)
    inline_most(fusion=f)
    return f


@pytest.mark.parametrize("n", [9, 10, 11, 12, 16])
def test_intermediate_inner_id_that_passes_its_extent_is_predicated(n):
    k = lower_upto(_outer_then_inner(n), "index_and_predicate")
    op = op_writing(k, "T1")
    half = -(-n // 2)
    written = Counter()
    aliased = 0
    for env in loop_points(k, op, {}):
        inner = env["j0"] * 4 + env["threadIdx.x"]
        idx = env["blockIdx.x"] * half + inner
        pred = eval_expr(op.predicate, env)
        assert pred == (inner < half and idx < n), env
        if idx < n and inner >= half:
            aliased += 1                   # what `idx < n` alone would let through twice
        if pred:
            assert eval_expr(op.out.index, env) == idx
            written[idx] += 1
    assert written == {i: 1 for i in range(n)}
    # Where ceilDiv(n, 2) is not a multiple of 4, the intermediate predicate is what prevents
    # block 0 from writing block 1's elements.
    assert (aliased > 0) == (half % 4 != 0)


def test_thread_predicate_on_global_write_not_indexed_by_tidx():
    """y = a + a uses threadIdx.x; w = b * b runs in blocks only: one thread per block writes w;
    the grid is max(i0, i2) so each gets `blockIdx.x < extent`."""
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1])
        b = fd.define_tensor([-1])
        fd.add_output(fd.ops.add(a, a))
        fd.add_output(fd.ops.mul(b, b))
    f, _ = fd.fusion.clone()
    y, w = f.outputs
    y.parallelize(0, PT.BIDx).parallelize(1, PT.TIDx)
    w.parallelize(0, PT.BIDx)
    k = lower_upto(f)
    oy, ow = op_writing(k, "T2"), op_writing(k, "T3")
    assert "threadIdx.x" not in expr_vars(oy.predicate)
    env0 = {"i0": 3, "i1": 5, "i2": 6, "T0_s0": 5, "T2_s0": 5}
    writes = Counter()
    for bx in range(6):
        for tx in range(5):
            env = dict(env0, **{"blockIdx.x": bx, "threadIdx.x": tx})
            if eval_expr(ow.predicate, env):
                writes[eval_expr(ow.out.index, env)] += 1
            assert eval_expr(oy.predicate, env) == (bx < 3)
    assert writes == {i: 1 for i in range(6)}
    assert [str(x) for x in k.launch.grid][0] == "max(i0, i2)"


def test_thread_loop_shorter_than_the_block_is_predicated():
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, 32])
        b = fd.define_tensor([-1, 16])
        fd.add_output(fd.ops.neg(a))
        fd.add_output(fd.ops.neg(b))
    f, _ = fd.fusion.clone()
    for o in f.outputs:
        o.parallelize(0, PT.BIDx).parallelize(1, PT.TIDx)
    k = lower_upto(f)
    assert getattr(k.launch.block[0], "value", k.launch.block[0]) == 32    # static: an int
    short = op_writing(k, "T3")
    long_ = op_writing(k, "T2")
    for tx in range(32):
        env = {"threadIdx.x": tx, "blockIdx.x": 0, "i0": 1, "i1": 1}
        assert eval_expr(short.predicate, env) == (tx < 16)
        assert eval_expr(long_.predicate, env) is True


# Whole kernels, run by the interpreter ------------------------------------------------------
def _run(fd, f, mapping, inputs, **kw):
    k = lower_upto(f)
    outs, it = interpret(k, clone_bindings(fd, mapping, inputs), inputs, **kw)
    return outs, it, k


@pytest.mark.parametrize("layout", ["dense", "sliced", "transposed", "expanded"])
def test_flattened_kernel_reads_each_layout(layout):
    """x + bias for inputs in several layouts (the definition follows the tensor); every output
    element is written once with the reference value."""
    base = torch.randn(6, 11)
    x = {"dense": base[:5, :7].contiguous(), "sliced": base[:5, 2:9],
         "transposed": torch.randn(7, 5).t(),
         "expanded": torch.randn(5, 1).expand(5, 7)}[layout]
    bias = torch.randn(7)
    with FusionDefinition() as fd:
        xv = fd.from_pytorch(x)
        bv = fd.from_pytorch(bias)
        fd.add_output(fd.ops.add(xv, bv))
    f, mapping = fd.fusion.clone()
    out = f.outputs[0]
    out.merge(0).split(0, 4).parallelize(1, PT.TIDx)
    propagate_transforms(out)
    parallelize_like(out)
    inline_most(fusion=f)
    (o,), it, _ = _run(fd, f, mapping, [x, bias])
    torch.testing.assert_close(o, reference(fd, [x, bias])[0])
    assert sorted(it.writes.values()) == [1] * 35


def test_3d_merge_split_with_a_non_contiguous_middle_dim():
    x = torch.randn(3, 8, 5)[:, ::2, :]          # strides (40, 10, 1), [3, 4, 5]
    with FusionDefinition() as fd:
        xv = fd.from_pytorch(x)
        fd.add_output(fd.ops.mul(xv, xv))
    f, mapping = fd.fusion.clone()
    out = f.outputs[0]
    out.merge(0).merge(0).split(0, 8).parallelize(1, PT.TIDx)
    propagate_transforms(out)
    parallelize_like(out)
    inline_most(fusion=f)
    (o,), it, k = _run(fd, f, mapping, [x])
    assert {p.name for p in k.params if p.source[0] == "stride"} == {"T0_s0", "T0_s1", "T1_s0",
                                                                    "T1_s1"}
    torch.testing.assert_close(o, x * x)
    assert len(it.writes) == 60 and set(it.writes.values()) == {1}


def test_half_input_cast_chain():
    x = torch.randn(3, 10).to(torch.float16)
    with FusionDefinition() as fd:
        xv = fd.from_pytorch(x)
        y = fd.ops.exp(fd.ops.cast(xv, DataType.Float))
        fd.add_output(fd.ops.cast(y, DataType.Half))
    f, mapping = fd.fusion.clone()
    out = f.outputs[0]
    out.merge(0).split(0, 8).parallelize(1, PT.TIDx)
    propagate_transforms(out)
    parallelize_like(out)
    inline_most(fusion=f)
    (o,), _, _ = _run(fd, f, mapping, [x])
    torch.testing.assert_close(o, torch.exp(x.float()).half())


@pytest.mark.parametrize("divisible", [False, True])
def test_a_split_the_scheduler_declares_divisible_is_not_guarded(divisible):
    """x [N] + 1 split by 4 on a symbolic N: guarded by `index < N` unless the split is declared
    divisible (Split.divisible: the heuristic that chose the factor for this kernel guarantees
    it), which transform propagation carries to the tensors of the same extent."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1])
        fd.add_output(fd.ops.add(x, 1.0))
    f, _ = fd.fusion.clone()
    out = f.outputs[0]
    out.split(0, 4, divisible=divisible).parallelize(1, PT.TIDx)
    propagate_transforms(out)
    parallelize_like(out)
    inline_most(fusion=f)
    k = lower_upto(f, "index_and_predicate")
    for s in K.walk(k.body):
        if isinstance(s, K.TensorOp):
            assert K.is_true(s.predicate) == divisible, s.predicate


def test_a_divisible_split_replayed_onto_another_extent_is_guarded():
    from pyfuser.ir.iter_domain import replayed_divisible
    with FusionDefinition() as fd:
        x, y = fd.define_tensor([-1]), fd.define_tensor([-1])
        fd.add_output(fd.ops.neg(x))
        fd.add_output(fd.ops.neg(y))
    f, _ = fd.fusion.clone()
    a, b = (t.domain.logical[0] for t in f.inputs)
    f.inputs[0].split(0, 4, divisible=True)
    split = f.inputs[0].domain.loop[0].definition
    assert split.is_divisible and replayed_divisible(split, a.clone())
    assert not replayed_divisible(split, b)       # x's N is not y's


@pytest.mark.parametrize("shape", [(2, 16, 5, 7), (1, 8, 1, 3)])
def test_a_channels_last_input_in_an_outer_first_flat_loop_is_read_at_the_flat_index(shape):
    """relu(x * scale[C]) of a channels-last x, written channels-last: the pointwise loop merges
    its dims outermost first, ((N * H) * W) * C, so no inner-first merge (W * C) of them exists;
    x's run N, H, W, C is still the loop's merged index (any association of a run's merges, as
    (N * H) * W over the rows of a channels-last reduction): no division or remainder in x's
    loads (there were three of each). Checked on the interpreter against float64."""
    from pyfuser.catalogue import CHANNELS_LAST
    from pyfuser.testing import run_and_check
    x = torch.randn(*shape).to(memory_format=torch.channels_last)
    scale = torch.rand(shape[1]) + 0.5
    with FusionDefinition() as fd:
        tx, ts = fd.from_pytorch(x), fd.from_pytorch(scale)
        y = fd.ops.relu(fd.ops.mul(tx, fd.ops.broadcast(ts, [True, False, True, True])))
        fd.add_output(fd.ops.stride_order(y, CHANNELS_LAST))
    seg, = fd.explain([x, scale]).segments
    source = seg.kernel.kernel.source
    loads = [ln.split("&T0[", 1)[1].split("]);")[0] for ln in source.splitlines() if "&T0[" in ln]
    loads += [ln.split("= T0[", 1)[1].split("];")[0] for ln in source.splitlines() if "= T0[" in ln]
    assert loads and all("/" not in a and "%" not in a for a in loads), loads
    run_and_check(fd, [x, scale], scheduler="pointwise", options={"enable": ["interpret"]})
