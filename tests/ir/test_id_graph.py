"""IdGraph's broadcast forwarding: which merges with a broadcast iterate what their other input
does (exact graph), expanded broadcasts included."""
from pyfuser import DataType, FusionDefinition
from pyfuser.ir.id_graph import IdGraph


def _exp_of(**define):
    with FusionDefinition() as fd:
        x = fd.define_tensor(dtype=DataType.Float, **define)
        fd.add_output(fd.ops.exp(x))
    return fd.fusion, fd.fusion.outputs[0]


def test_merge_with_an_expanded_broadcast_iterates_the_other_dim():
    """[M(expanded), N] merged: the merge's extent is N's and the expanded dim's index is 0, so
    the merge is N's iteration, as with a plain [1, N] (a cache of such an input lines up with
    the broadcast that puts it under a new outer dim)."""
    for expanded in ([True, False], [False, False]):
        shape = [-1, -1] if expanded[0] else [1, -1]
        fusion, y = _exp_of(shape=shape, expanded=expanded)
        b, n = y.loop
        y.merge(0, 1)
        assert IdGraph(fusion).mapped(y.loop[0], n)


def test_merge_of_a_plain_and_an_expanded_broadcast_forwards_the_expanded_one():
    fusion, y = _exp_of(shape=[1, -1, -1], expanded=[False, True, False])
    b, e, n = y.loop
    y.merge(0, 1)
    g = IdGraph(fusion)
    assert g.mapped(y.loop[0], e) and not g.mapped(y.loop[0], b)


def test_merge_of_two_plain_broadcasts_forwards_neither():
    """Forwarding both would put the two dims in one group, and with them, in the permissive
    graph, the dims they broadcast to."""
    fusion, y = _exp_of(shape=[1, 1, -1])
    b0, b1, n = y.loop
    y.merge(0, 1)
    g = IdGraph(fusion)
    assert not g.mapped(y.loop[0], b0) and not g.mapped(y.loop[0], b1) and not g.mapped(b0, b1)
