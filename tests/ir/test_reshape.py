"""arith.reshape: output extents (expanded dims count their expanded size), the ID bookkeeping of
a reshape that merges an expanded dim, and the element-count check of a -1 reshape."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.ir import IterType
from pyfuser.ir import scalar as S
from pyfuser.ir.id_graph import IdGraph
from pyfuser.runtime.inputs import InputError, check_inputs


def _shape(fd, tv, inputs) -> list:
    b = check_inputs(fd.fusion, inputs)
    return [int(S.evaluate(i.user_extent, b)) for i in tv.domain.logical]


@pytest.mark.parametrize("sizes, expanded, new, want", [
    ([15, 4], [False, True], [60], [60]),              # the triage's repro (P12)
    ([15, 4], [False, True], [-1], [60]),
    ([15, 4], [False, True], [-1, 6], [10, 6]),
    ([5, 3, 4], [True, False, False], [-1, 6], [10, 6]),
    ([3, 4, 6], [False, True, False], [6, -1], [6, 12]),
    ([4, 3], [True, True], [2, -1], [2, 6]),           # every dim expanded
])
def test_reshape_counts_the_expanded_extent(sizes, expanded, new, want):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1] * len(sizes), dtype=DataType.Float, expanded=expanded)
        fd.add_output(fd.ops.reshape(x, new))
    src = torch.randn([1 if e else s for s, e in zip(sizes, expanded)]).expand(sizes)
    out = fd.fusion.outputs[0]
    assert _shape(fd, out, [src]) == want
    # Merged into the flat ID, an expanded dim is an iteration over its expanded size; the
    # output iterates its elements (it is not a broadcast).
    x_ids = fd.fusion.inputs[0].domain.logical
    for xi, ri in zip(x_ids, out.domain.root):
        if xi.expanded_extent is not None:
            assert ri.iter_type == IterType.Iteration and ri.expanded_extent is None
            assert ri.extent is xi.expanded_extent
    assert not any(i.is_broadcast for i in out.domain.logical)


def test_a_plain_broadcast_dim_stays_a_broadcast_of_extent_one():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 1], dtype=DataType.Float)
        fd.add_output(fd.ops.reshape(x, [-1]))
    out = fd.fusion.outputs[0]
    assert out.domain.root[1].is_broadcast
    assert _shape(fd, out, [torch.randn(15, 1)]) == [15]


def test_reshapes_of_one_expanded_tensor_iterate_the_same_elements():
    """The iteration IDs that concretize one expanded broadcast map to one another in the exact
    graph (a recomputed copy of a reshape beside the original), not to the broadcast itself."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float, expanded=[False, True])
        a = fd.ops.reshape(x, [-1, 8])
        b = fd.ops.reshape(x, [-1, 8])
        fd.add_output(fd.ops.add(a, b))
    f = fd.fusion
    xt = f.inputs[0]
    ra, rb = (e.outputs[0] for e in f.exprs() if type(e).__name__ == "ReshapeOp")
    exact = IdGraph(f)
    for i, j in zip(ra.domain.maybe_root + ra.domain.logical, rb.domain.maybe_root + rb.domain.logical):
        assert exact.mapped(i, j)
    assert not exact.mapped(xt.domain.logical[1], ra.domain.root[1])
    assert IdGraph(f, permissive=True).mapped(xt.domain.logical[1], ra.domain.root[1])


def test_a_minus_one_reshape_that_does_not_hold_the_elements_is_an_input_error():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        fd.add_output(fd.ops.reshape(x, [-1, 96]))
    check_inputs(fd.fusion, [torch.randn(3, 64)])           # 192 = 2 x 96
    with pytest.raises(InputError, match=r"reshape element count: .* = 670 .* = 672 .*: the new "
                                         r"shape does not hold the input's elements"):
        check_inputs(fd.fusion, [torch.randn(5, 134)])


@pytest.mark.parametrize("new", [[1, 4, 8], [1, 1, 4, 8], [4, 1, 8]])
def test_a_static_size_one_dim_of_a_reshape_broadcasts(new):
    """Without a -1, a leading size-1 dim was the one the splits left over, of extent
    ceilDiv(ceilDiv(N, 8), 4): an iteration dim that broadcast nowhere, so the reshape against
    a [1, 4, 1, 8] (where torch broadcasts it) was an InputError (fuzz 20261204:4628). Every
    size-1 dim of the new shape is a broadcast of static extent 1, and the fusion runs."""
    from pyfuser.testing import run_and_check
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        v = fd.ops.reshape(x, new)
        w = fd.ops.broadcast_in_dim(v, [*new[:-1], 1, 8], [*range(len(new) - 1), len(new)])
        fd.add_output(fd.ops.add(v, w))
    reshaped = next(e for e in fd.fusion.exprs() if type(e).__name__ == "ReshapeOp").outputs[0]
    for size, i in zip(new, reshaped.domain.logical):
        assert i.is_broadcast == (size == 1)
        assert i.extent.value == 1 or size != 1
    x = torch.randn(4, 8, dtype=torch.float64).float()
    (out,) = run_and_check(fd, [x], options={"enable": ["interpret"]})
    assert out.shape == torch.broadcast_shapes(tuple(new), (*new[:-1], 1, 8))
