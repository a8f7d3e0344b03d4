"""The registry: which scheduler takes each catalogue fusion, in which order they are tried, and
why none does (the reference fallback)."""
import pytest

from pyfuser import catalogue
from pyfuser.schedule.schedulers import pointwise, reduction, registry


@pytest.mark.parametrize("name", catalogue.names())
def test_registry_choice_for_every_catalogue_fusion(name):
    entry = catalogue.get(name)
    choice = registry.choose(catalogue.define(name).fusion)
    tried = [n for n, _ in choice.rejected]
    if entry.kind in ("pointwise", "reduction"):
        assert choice.scheduler is not None and choice.scheduler.NAME == entry.kind, choice.reason
    elif choice.scheduler is not None:
        # A normalization goes to its own (persistent) scheduler, never to the plain ones.
        assert choice.scheduler.NAME == entry.kind, choice.reason
    else:
        assert choice.reason.startswith("no scheduler takes the whole fusion (")
        for n, why in choice.rejected:
            assert f"{n}: {why}" in choice.reason
        assert {"reduction", "pointwise"} <= set(tried)
    # Schedulers are tried in registry order, and the plain ones refuse normalizations.
    order = [s.NAME for s in registry.SCHEDULERS]
    assert tried == order[:len(tried)]
    if entry.kind not in ("pointwise", "reduction"):
        assert not reduction.can_schedule(catalogue.define(name).fusion)[0]
        assert not pointwise.can_schedule(catalogue.define(name).fusion)[0]


def test_registry_norm_backward_falls_back():
    # No inner-outer persistent scheduler yet: the backward norms run through the reference.
    for name in ("rmsnorm_bwd", "layernorm_bwd"):
        if "inner_outer_persistent" in [s.NAME for s in registry.SCHEDULERS]:
            pytest.skip("an inner-outer persistent scheduler is registered")
        assert registry.choose(catalogue.define(name).fusion).scheduler is None


def test_registry_by_name_and_register():
    assert registry.by_name("pointwise") is pointwise
    with pytest.raises(KeyError, match="no scheduler named 'matmul'"):
        registry.by_name("matmul")
    before = list(registry.SCHEDULERS)
    try:
        registry.register(pointwise)                 # already there: no change
        assert registry.SCHEDULERS == before
    finally:
        registry.SCHEDULERS[:] = before
