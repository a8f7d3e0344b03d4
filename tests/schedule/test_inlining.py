"""inline_at / inline_most / max_inline_position: compute-at positions and their limits."""
import warnings

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.ir import ParallelType, ScheduleError
from pyfuser.schedule import (cache_before, inline_at, inline_most, max_inline_position,
                              propagate_transforms)
from pyfuser.testing import run_and_check


def _chain():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        a = fd.ops.exp(x)
        b = fd.ops.neg(a)
        fd.add_output(fd.ops.abs(b))
    return fd, x, a, b, fd.fusion.outputs[0]


def _norm():
    """x -> e = exp(x) -> s = sum(e, 1) -> sb = broadcast(s) -> y = e / sb."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        e = fd.ops.exp(x)
        s = fd.ops.sum(e, [1], keepdim=True)
        y = fd.ops.div(e, s)
        fd.add_output(y)
    sb = y.definition.inputs[1]
    red = sb.definition.inputs[0]
    return fd, x, e, red, sb, y


def test_inline_at_sets_positions():
    fd, x, a, b, out = _chain()
    inline_at(a, 1)
    assert a.compute_at_pos == 1 and b.max_producer_pos == 1
    inline_at(b, 2)
    assert b.compute_at_pos == 2 and out.max_producer_pos == 2
    inline_at(a, -1)  # -1: all loops
    assert a.compute_at_pos == 2 and b.max_producer_pos == 2


def test_inline_at_out_of_range():
    fd, x, a, b, out = _chain()
    with pytest.raises(ScheduleError, match=r"inline_at on T1: position 3 is out of range 0\.\.2"):
        inline_at(a, 3)
    assert a.compute_at_pos == 0


def test_inline_most_pointwise_chain_inlines_fully():
    fd, x, a, b, out = _chain()
    inline_most(fusion=fd.fusion)
    assert (x.compute_at_pos, a.compute_at_pos, b.compute_at_pos, out.compute_at_pos) == (0, 2, 2, 0)
    assert max_inline_position(x) == (0, "fusion inputs are not computed")
    assert max_inline_position(out) == (0, "no consumer")


def test_inline_most_after_split_and_propagation():
    fd, x, a, b, out = _chain()
    out.merge(0)
    out.split(0, 128)
    propagate_transforms(out)
    inline_most(fusion=fd.fusion)
    assert a.compute_at_pos == 2 and b.compute_at_pos == 2


def test_reduction_axis_stops_inlining():
    fd, x, e, red, sb, y = _norm()
    pos, why = max_inline_position(red)
    assert pos == 1 and "axis 1 is a reduction" in why
    with pytest.raises(ScheduleError) as err:
        inline_at(red, 2)
    msg = str(err.value)
    assert msg.startswith(f"inline_at on T{red.name}: position 2 is past the legal limit 1")
    assert "axis 1 is a reduction" in msg
    assert red.compute_at_pos == 0


def test_norm_pattern_keeps_producer_resident():
    # e feeds the reduction and, directly, y (computed after the reduction): e's row must stay
    # allocated across the reduction's loop, so it can share only the row loop.
    fd, x, e, red, sb, y = _norm()
    # Consumers not placed yet: e inside both red's and y's own row loops would merge them,
    # and y needs red's result.
    pos, why = max_inline_position(e)
    assert pos == 0 and "would merge the own loops" in why
    # Placed as inline_most places them (consumers first), the row loop is y's.
    inline_at(sb, 2)
    inline_at(red, 1)
    pos, why = max_inline_position(e)
    assert pos == 1
    assert f"T{e.name} stays resident" in why
    with pytest.raises(ScheduleError, match=rf"inline_at on T{e.name}: position 2 is past the "
                                            r"legal limit 1"):
        inline_at(e, 2)
    inline_most(fusion=fd.fusion)
    assert e.compute_at_pos == 1
    assert red.compute_at_pos == 1
    assert sb.compute_at_pos == 2  # the broadcast of the result is computed inside y's loops
    assert y.max_producer_pos == 2


def test_norm_pattern_after_split_still_max_one():
    fd, x, e, red, sb, y = _norm()
    red.split(1, 128)
    propagate_transforms(red)
    inline_at(sb, 2)
    inline_at(red, 1)
    assert max_inline_position(e)[0] == 1
    assert max_inline_position(red)[0] == 1


def test_producer_of_reduction_alone_inlines_fully():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        e = fd.ops.exp(x)
        fd.add_output(fd.ops.sum(e, [1]))
    assert max_inline_position(e) == (2, "fully inlined")


def test_vectorized_axis_stops_inlining():
    fd, x, a, b, out = _chain()
    out.split(1, 4)
    propagate_transforms(out)
    out.parallelize(2, ParallelType.Vectorize)
    pos, why = max_inline_position(b)
    assert pos == 2 and "V" in why and f"T{out.name}" in why
    with pytest.raises(ScheduleError, match=rf"inline_at on T{b.name}: position 3 is past the "
                                            r"legal limit 2"):
        inline_at(b, 3)
    # The producer's own vectorized axis is an own loop too.
    a.parallelize(2, ParallelType.Vectorize)
    pos, why = max_inline_position(a)
    assert pos == 2 and "axis 2 is V" in why


def test_unmappable_axis_stops_inlining():
    fd, x, a, b, out = _chain()
    b.reorder([1, 0])  # b's loop order no longer matches a's
    pos, why = max_inline_position(a)
    assert pos == 0 and f"consumer T{b.name}" in why
    with pytest.raises(ScheduleError, match=rf"inline_at on T{a.name}: position 1 is past the "
                                            r"legal limit 0"):
        inline_at(a, 1)
    # out keeps the logical order, b is swapped: b cannot be inlined into out either.
    assert max_inline_position(b)[0] == 0


def test_split_mismatch_stops_inlining_at_the_split():
    fd, x, a, b, out = _chain()
    a.split(1, 4)
    b.split(1, 8)
    pos, why = max_inline_position(a)
    assert pos == 1 and "axis 1" in why


def _tensor_and_its_broadcast():
    """y = x - 1 [M, N] beside its broadcast b [1, M, N]; outputs mul(y, sigmoid(b)), b and
    sigmoid(b). The implicit broadcast of y in the mul and the explicit b both read y."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1])
        y = fd.ops.sub(t0, 1.0)
        b = fd.ops.broadcast_in_dim(y, [1, -1, -1], [1, 2])
        s = fd.ops.sigmoid(b)
        fd.add_output(fd.ops.mul(y, s))
        fd.add_output(b)
        fd.add_output(s)
    return fd, y, b, s


def test_a_producer_is_not_inlined_into_two_own_loops_one_needing_the_other():
    """y is inlined into the mul's loops (through its implicit broadcast) and into b's. With
    b's and the mul's staging tensors computed in their own vector loops (they feed vectorized
    outputs), sharing y's inner loop would merge those two loops, and the mul's needs sigmoid(b)
    computed after b's: a cycle lowering cannot order (fuzz 20261124:4371, GPU fuzz 2:883)."""
    fd, y, b, s = _tensor_and_its_broadcast()
    fusion = fd.fusion
    out = fusion.outputs[0]
    # Each output written through a register stage, flat, in 4-wide vectors.
    stages = {o: cache_before(o) for o in fusion.outputs}
    out.merge(0).merge(0).split(0, 4)
    propagate_transforms(out)
    for o in fusion.outputs:
        o.parallelize(1, ParallelType.Vectorize)
    inline_most(fusion=fusion)
    assert y.compute_at_pos == 1
    pos, why = max_inline_position(y)
    assert pos == 1 and "would merge the own loops" in why
    # Each stage keeps its own vector loop; the mul's stage is inlined up to it.
    assert all(st.compute_at_pos == 1 for st in stages.values())


def test_a_tensor_and_its_broadcast_to_a_new_dim_in_one_output_run_as_one_kernel():
    """The fuzz case 20261124:4371 end to end on the interpreter (it fell back with 'cyclic
    dependency between loops')."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True],
                              dtype=DataType.Float)
        v3 = fd.ops.sub(t0, 1.0)
        v4 = fd.ops.broadcast_in_dim(v3, [1, -1, -1, -1], [1, 2, 3])
        v6 = fd.ops.sigmoid(v4)
        fd.add_output(fd.ops.mul(v3, v6))
        fd.add_output(v4)
        fd.add_output(v6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_and_check(fd, [torch.rand(2, 4, 8)], scheduler="pointwise",
                      options={"enable": ["interpret"]})


def test_broadcast_chain_beside_its_rank_2_source_in_a_transposed_layout_runs_as_one_kernel():
    """v1 [4, N] (of a column-major input) is read directly by the first output and, broadcast
    to [1, 4, N], by the other two; the vector loops of five tensors end up ordered in a
    cycle (GPU fuzz case 2:883, seed 2, max elements 4194304)."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float,
                              stride_order=[0, 1])
        v1 = fd.ops.logical_or(fd.ops.gt(t0, 0.5), True)
        v3 = fd.ops.broadcast(fd.ops.tanh(v1), [True, False, False])
        v7 = fd.ops.sqrt(fd.ops.add(fd.ops.mul(v3, v3), 0.5))
        v8 = fd.ops.zeros([4, 2104], dtype=DataType.BFloat16)
        v11 = fd.ops.where(fd.ops.le(v8, 0.5), v7, 2.0)
        fd.add_output(fd.ops.where(v1, v11, 0.25))
        fd.add_output(v3)
        fd.add_output(v11)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_and_check(fd, [torch.randn(2104, 4).t()], scheduler="pointwise",
                      options={"enable": ["interpret"]})


def test_a_chain_of_broadcast_reductions_of_one_element_runs_as_one_kernel():
    """Fuzz 20261127:1975: x [1, 1] (both dims broadcast), its max and sum over dim 1 (squeezes
    of one element) and x - max read again at the end. x - max was inlined, in the thread and
    block loops, into the own loops of exp(x - max) (whose squeeze the sum reads) and of the
    output (which reads that sum): lowering merged the two and found a cycle. The limit now
    holds in thread and block loops too."""
    x = torch.randn(1, 1).to(torch.float16)
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        v0 = fd.ops.cast(t0, dtype=DataType.Float)
        v2 = fd.ops.sub(v0, fd.ops.max(v0, [1], keepdim=True))
        v4 = fd.ops.sum(fd.ops.exp(v2), [1], keepdim=True)
        v9 = fd.ops.log(fd.ops.add(fd.ops.sigmoid(fd.ops.tanh(fd.ops.mul(v4, 2.0 ** -12))), 0.5))
        fd.add_output(fd.ops.cast(fd.ops.sub(v2, v9), dtype=DataType.Half))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_and_check(fd, [x], scheduler="pointwise", options={"enable": ["interpret"]})


def test_a_squeeze_of_the_merged_loop_dim_keeps_the_loops_apart():
    """Fuzz 20261124:3145: m = max(x, [0], keepdim) [1, N]; s = silu(m); t = s * 0.25 summed
    over the size-1 dim 0 (a squeeze) and broadcast back; maximum(s, that). s was inlined into
    the own loops of t and of the maximum over the kept size-1 dim; lowering merged them, but
    the squeeze between them has no such dim: it runs above the merged loop, which then needed
    its own result (a cycle between loops). A path through a tensor without the merged
    loop's dim now limits the inlining."""
    x = (torch.rand(256, 44) < 0.5).t()
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        v0 = fd.ops.cast(t0, dtype=DataType.Float)
        v4 = fd.ops.exp2(fd.ops.pow(fd.ops.add(v0, 1.0), 3))
        v7 = fd.ops.silu(fd.ops.max(v4, [0], keepdim=True))
        v11 = fd.ops.sum(fd.ops.mul(v7, 0.25), [0], keepdim=True)
        fd.add_output(fd.ops.maximum(v7, v11))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_and_check(fd, [x], scheduler="reduction", options={"enable": ["interpret"]})


@pytest.mark.parametrize("rows, cols", [(1, 1), (5, 3)])
def test_a_weight_of_one_element_read_by_the_rows_and_its_column_sum_stays_in_its_own_loops(
        rows, cols):
    """Fuzz 20261203:3622: w [1, 1] (both dims broadcast) cast once, read by the rows of a
    norm-backward-like fusion (w * x, its row mean broadcast back, its column sum) and by its
    own column sum (a squeeze, outside the row loops). w's cache was inlined into both casts,
    which merged the own broadcast loops of the cast the squeeze reads (not inlinable into
    the rows) into the persistent row loop: lowering wanted a register buffer of runtime size
    ceilDiv(i0, G), and the cast would have run only in blocks that have rows. The cache now
    stays out of the row loop; the cast is computed once, before it."""
    x = torch.randn(rows, cols).to(torch.bfloat16)
    w = torch.randn(1, 1).to(torch.bfloat16)
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
        t1 = fd.from_pytorch(w)
        v0 = fd.ops.cast(t0, dtype=DataType.Float)
        v1 = fd.ops.cast(t1, dtype=DataType.Float)
        v2 = fd.ops.mul(v1, v0)
        fd.add_output(fd.ops.sub(v2, fd.ops.mean(v2, [1], keepdim=True)))
        fd.add_output(fd.ops.sum(v2, [0]))
        fd.add_output(fd.ops.sum(v1, [0]))
    run_and_check(fd, [x, w], scheduler="inner_outer_persistent",
                  options={"enable": ["interpret"]})


def test_a_reader_of_a_full_reduction_stays_out_of_the_loops_it_reduces():
    """CPU fuzz 20261608:116: x [N] read by eq(x, y) and by sum(x); y [1] read by eq and by
    mean(x) * y. y's cache, inlined into both, merged the output's loops with eq's; x's cache,
    inlined into eq and the sum's input, then merged eq's loops with the sum's, so the output
    landed inside the loop it needs reduced (lowering: a cyclic dependency; with the merge at
    the outer loop alone: the output read the sum before its block reduction, a wrong value).
    Inlining now follows the loops merged by producers already placed, and keeps a reader out
    of a reduction loop of what it reads."""
    x = torch.rand(2489).bfloat16() + 0.5
    y = torch.randn(1).bfloat16()
    with FusionDefinition() as fd:
        tx = fd.define_tensor(shape=[2489], contiguity=[True], dtype=DataType.BFloat16)
        ty = fd.from_pytorch(y)
        fd.add_output(fd.ops.eq(tx, ty))
        fd.add_output(fd.ops.mul(fd.ops.mean(tx, [0], keepdim=True), ty))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_and_check(fd, [x, y], scheduler="reduction", options={"enable": ["interpret"]})
    assert not fd.last_run.internal_error


def test_an_index_of_one_element_read_by_its_gather_and_by_a_broadcast_stays_one_kernel():
    """Fuzz case 20264000:2900, shrunk: index_select(x, i, 0) + i with i of one element. i's
    cache was inlined into the gather's vectorized loop and into the add's serial one, which
    lowering cannot merge (LoweringError, the segment ran the reference evaluator); inlining
    now stops where the owners' loops differ in parallel type."""
    x = torch.randint(-3, 13, (64, 48))
    i = torch.tensor([5])
    with FusionDefinition() as fd:
        tx = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Int)
        ti = fd.from_pytorch(i)
        fd.add_output(fd.ops.add(fd.ops.index_select(tx, ti, 0), ti))
    run_and_check(fd, [x, i], scheduler="pointwise", options={"enable": ["interpret"]})
