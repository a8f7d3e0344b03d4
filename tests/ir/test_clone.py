"""Fusion.clone: a deep copy of the whole graph (ir/fusion._deep_copy, copy.deepcopy's result
without its per-object protocol for the IR's plain nodes)."""
import copy

from pyfuser import catalogue
from pyfuser.ir.base import Expr, Val
from pyfuser.ir.fingerprint import fusion_text
from pyfuser.ir.fusion import _deep_copy


def _objects(fusion) -> list:
    vals = [v for t in fusion.tensors() for v in (t, *t.domain.all_ids())]
    return vals + list(fusion.exprs()) + list(fusion.inputs) + list(fusion.outputs)


def test_a_clone_is_the_same_fusion_and_shares_no_node():
    for name in catalogue.names():
        fusion = catalogue.define(name, "bf16").fusion
        new, mapping = fusion.clone()
        assert fusion_text(new) == fusion_text(fusion) == fusion_text(copy.deepcopy(fusion)), name
        old_ids = {id(x) for x in _objects(fusion)}
        assert not any(id(x) in old_ids for x in _objects(new)), name
        # Every Val of the original maps to its copy, the copy's graph links agree.
        for v in _objects(fusion):
            if isinstance(v, Val):
                c = mapping[id(v)]
                assert type(c) is type(v) and c is not v
                assert (c.definition is None) == (v.definition is None)
                assert [mapping[id(u.outputs[0])].definition for u in v.uses] == c.uses
            elif isinstance(v, Expr):
                assert [mapping[id(i)] for i in v.inputs] == \
                    mapping[id(v.outputs[0])].definition.inputs


class _Hooked:
    """An object with its own copy protocol: copied through copy.deepcopy, not field by field."""
    copies = 0

    def __init__(self, payload):
        self.payload = payload

    def __deepcopy__(self, memo):
        _Hooked.copies += 1
        return _Hooked(copy.deepcopy(self.payload, memo))


def test_objects_with_their_own_copy_protocol_keep_it_and_sharing_is_kept():
    shared = [1, 2]
    box = {"a": shared, "b": shared, "h": _Hooked(shared), "t": (shared, 3), "s": {4}}
    memo: dict = {}
    new = _deep_copy(box, memo)
    assert new == {"a": [1, 2], "b": [1, 2], "h": new["h"], "t": ([1, 2], 3), "s": {4}}
    assert new["a"] is new["b"] is new["t"][0] is new["h"].payload and new["a"] is not shared
    assert _Hooked.copies == 1 and isinstance(new["h"], _Hooked)
