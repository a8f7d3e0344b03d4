"""The registry: which scheduler takes each catalogue fusion, in which order they are tried, and
why none does (the reference fallback)."""
import warnings

import pytest
import torch

from pyfuser import DataType, FusionDefinition, catalogue
from pyfuser.runtime.executor import FallbackWarning
from pyfuser.testing import run_and_check
from pyfuser.schedule.schedulers import pointwise, reduction, registry


@pytest.mark.parametrize("name", catalogue.names())
def test_registry_choice_for_every_catalogue_fusion(name):
    entry = catalogue.get(name)
    choice = registry.choose(catalogue.define(name).fusion)
    tried = [n for n, _ in choice.rejected]
    if entry.kind in ("pointwise", "reduction", "transpose"):
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
    if entry.kind not in ("pointwise", "reduction", "transpose"):
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
    with pytest.raises(KeyError, match="no scheduler named 'conv2d'"):
        registry.by_name("conv2d")
    before = list(registry.SCHEDULERS)
    try:
        registry.register(pointwise)                 # already there: no change
        assert registry.SCHEDULERS == before
    finally:
        registry.SCHEDULERS[:] = before


def _reshaped_beside_itself():
    """t1 [a, b, n] flattened to [1] (a * b * n elements: all three must be 1) and broadcast
    back to [1, 1, a*b*n] beside t0 [a, b, n], which a where() ties to t1 dim by dim: n and
    a * b * n land in one exact group (fuzz 20261124:2807)."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True],
                              dtype=DataType.Float)
        t1 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True],
                              dtype=DataType.Float)
        v3 = fd.ops.where(fd.ops.lt(t1, 0.5), t0, -0.5)
        v5 = fd.ops.mean(t1, [-3, -1])
        fd.ops.var_mean(v5, [0], keepdim=True, correction=1)
        v12 = fd.ops.where(fd.ops.gt(t1, 0.5), fd.ops.erf(t1), v3)
        # (The fuzz case reshaped to [1]; a reshape to all ones is now a window of the one
        # element, which ties nothing: the flattening [-1] keeps the tie.)
        v15 = fd.ops.logical_or(fd.ops.eq(t0, 0.5), fd.ops.ge(fd.ops.reshape(t1, [-1]), 0.5))
        fd.add_output(v15)
        fd.add_output(v12)
    return fd


def test_a_reshape_mapped_onto_its_own_source_dim_is_refused_with_the_reason():
    fd = _reshaped_beside_itself()
    choice = registry.choose(fd.fusion)
    assert choice.scheduler is None
    assert "maps onto" in choice.reason and "one of the dims it is made from" in choice.reason
    # Without the tie (no where() between t0 and t1), a flattening reshape is an ordinary one.
    with FusionDefinition() as ok:
        t1 = ok.define_tensor(shape=[-1, -1, -1], dtype=DataType.Float)
        ok.add_output(ok.ops.exp(ok.ops.reshape(t1, [-1])))
    assert registry.choose(ok.fusion).scheduler is pointwise


def test_a_reshape_mapped_onto_its_own_source_dim_runs_as_segments():
    """The fuzz case 20261124:2807 used to end in 'cannot index T22's axis iS48{i0} from its
    loops' (an internal error): the whole fusion is refused before scheduling, and the
    segmenter takes the reshape of input t1 as a view of it (no kernel), read by the kernel of
    the op that ties its dims."""
    fd = _reshaped_beside_itself()
    t0 = torch.rand(8)[7:].as_strided((1, 1, 1), (1, 1, 1))
    t1 = torch.randn(1, 1, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        outs = fd.execute([t0, t1], options={"enable": ["interpret"]})
    run = fd.last_run
    assert run.kind == "kernels" and not run.internal_error
    assert [(s.kind, s.name) for s in run.segments] == [("view", "view")] + [
        ("kernel", "pointwise")] * 2
    assert "one of the dims it is made from" in run.reason
    assert torch.equal(outs[0], (t0 == 0.5) | (t1.reshape(1) >= 0.5))
    assert torch.equal(outs[1], torch.where(t1 > 0.5, torch.erf(t1),
                                            torch.where(t1 < 0.5, t0, -0.5)))


def test_every_fusion_op_has_a_segment_kind():
    """Each expression type of the fusion IR (tensor and scalar ops; not the IterDomain
    transforms) is listed once in schedule/op_support.py: what a new op runs in is decided
    there, not found out by a scheduler's error."""
    import inspect

    from pyfuser.ir import exprs, scalar
    from pyfuser.ir.base import Expr
    from pyfuser.schedule import op_support
    ops = [c for m in (exprs, scalar) for _, c in inspect.getmembers(m, inspect.isclass)
           if issubclass(c, Expr) and c is not Expr and c.__module__ == m.__name__]
    assert scalar.ScalarOp in ops
    for c in ops:
        listed = [kind for kind, types in (("kernel", op_support.KERNEL_OPS),
                                           ("library", op_support.LIBRARY_OPS)) if c in types]
        assert len(listed) <= 1, (c.__name__, listed)
        assert listed, f"{c.__name__} is in no list of schedule/op_support.py"


def test_a_fusion_with_scalar_arithmetic_is_scheduled():
    """var_mean with a correction computes 1 / (N - 1) with ScalarOps: the registry must not
    count those as ops no kernel takes (it did, for a day: every var_mean ran the reference)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        var, mean = fd.ops.var_mean(x, [1], correction=1)
        fd.add_output(var)
        fd.add_output(mean)
    from pyfuser.ir.scalar import ScalarOp
    assert any(isinstance(e, ScalarOp) for e in fd.fusion.exprs())
    assert registry.choose(fd.fusion).scheduler is not None
    run_and_check(fd, [torch.randn(5, 300)], options={"enable": ["interpret"]})
