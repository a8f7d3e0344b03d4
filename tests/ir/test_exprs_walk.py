"""Fusion.exprs() keeps its walk of the graph while neither the graph (ir/base.graph_changed)
nor the outputs change: every way the IR is rewired must show in the next walk."""
from pyfuser import DataType, FusionDefinition
from pyfuser.ir.arith import unary
from pyfuser.ir.fingerprint import fusion_text
from pyfuser.ir.exprs import UnaryOpType
from pyfuser.schedule.cache import cache_before


def _chain():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float)
        a = fd.ops.exp(x)
        b = fd.ops.neg(a)
        fd.add_output(b)
    return fd, x, a, b


def _ops(fusion):
    return [type(e).__name__ + ":" + str(getattr(e, "op", "")) for e in fusion.exprs()]


def test_a_new_expr_an_input_replaced_and_an_output_added_show_in_the_next_walk():
    fd, x, a, b = _chain()
    fusion = fd.fusion
    first = fusion.exprs()
    assert len(first) == 2 and fusion.exprs() == first
    first.clear()                                   # the caller's copy, not the kept walk
    assert len(fusion.exprs()) == 2
    with fusion:
        c = unary(UnaryOpType.Abs, x, DataType.Float)   # a new expr, not yet an output
    assert len(fusion.exprs()) == 2 and fusion.consumers(x) == [a]
    b.definition.replace_input(a, c)                # neg now reads abs(x): exp is dead
    assert [e.outputs[0] for e in fusion.exprs()] == [c, b]
    assert fusion.consumers(x) == [c] and fusion.uses_of(a) == []
    fusion.add_output(a)                            # an output added: exp is live again
    assert a.definition in fusion.exprs() and fusion.consumers(x) == [a, c]
    fusion.outputs = [a]                            # the list replaced
    assert fusion.exprs() == [a.definition] and fusion.tensors() == [x, a]


def test_cache_before_rewires_a_definition_in_place_and_the_walk_sees_it():
    fd, x, a, b = _chain()
    fusion = fd.fusion
    fusion.exprs()
    cache = cache_before(b)
    assert [e.outputs[0] for e in fusion.exprs()] == [a, cache, b]


def test_the_kept_walk_is_not_part_of_the_fingerprint_nor_of_a_clone():
    fd, *_ = _chain()
    fusion = fd.fusion
    fusion.__dict__.pop("_walked", None)
    before = fusion_text(fusion)
    fusion.exprs()
    assert "_walked" in vars(fusion) and fusion_text(fusion) == before
    new, _ = fusion.clone()
    assert "_walked" not in vars(new) and "_walked" in vars(fusion)
    assert fusion_text(new) == before and len(new.exprs()) == 2
