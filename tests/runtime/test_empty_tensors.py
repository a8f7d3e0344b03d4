"""Tensors with a dim of size 0 (no element): every layout is valid, fusions run and return
outputs of torch's shape, dtype and strides, on the reference evaluator and on the generated
kernels (the kernel-IR interpreter); a sum over an empty dim is 0, and a max or min over one is
refused as torch refuses it, where its value would reach an output."""
import warnings

import pytest
import torch

from pyfuser import DataType, FusionDefinition, InputError, catalogue
from pyfuser.runtime import inputs as inputs_mod

PATHS = {"reference": None, "interpret": {"enable": ["interpret"]}}


pytestmark = pytest.mark.usefixtures("isolated_cache")   # tests/conftest.py


# RunInfo.reason of a run of the fusion specialized to its empty dims (runtime/empty_dims.py).
EMPTY_SUM = "over a dim of size 0: a fill of 0 (torch's sum of no elements)"
EMPTY_OUTPUTS = "no elements: allocated, not computed"


def _run(fd, inputs, path, specialized=None):
    """Run on `path`; `specialized`: what RunInfo.reason must say the kernels' fusion was
    specialized for (a sum of nothing filled with 0, empty outputs left out of it)."""
    from pyfuser.runtime.executor import FallbackWarning
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        outs = fd.execute(inputs, options=PATHS[path])
    fallbacks = [str(w.message) for w in seen if issubclass(w.category, FallbackWarning)]
    assert not fallbacks, fallbacks
    info = fd.last_run
    if path == "reference":
        assert info.kind == "reference" and "not on a CUDA device" in info.reason, info
    else:
        assert info.kind == "kernels" and info.backend == "interpreter", info
        assert not info.internal_error
        if specialized is not None:
            assert specialized in info.reason and info.num_kernels >= 1, info
    return outs


def _same(out, want, path="reference", expanded=None):
    """Shape, dtype, device and values of torch's result. Strides: the reference evaluator
    returns torch's own result; kernels write outputs dense, as torch.empty allocates them, but
    with stride 0 along the dims an expanded input broadcasts (`expanded` flags), as
    torch.expand gives them (for an empty output torch's strides are arbitrary: -x * 2 of a
    [3, 0, 1] has (0, 1, 0))."""
    assert (out.shape, out.dtype, out.device) == (want.shape, want.dtype, want.device)
    expanded = list(expanded or [False] * len(want.shape))
    # Dense over the dims that are not expanded; an expanded dim takes no room (stride 0).
    dense = list(torch.empty([1 if e else n for n, e in zip(want.shape, expanded)]).stride())
    dense = [0 if e else st for st, e in zip(dense, expanded)]
    assert out.stride() == (want.stride() if path == "reference" else tuple(dense))
    torch.testing.assert_close(out, want, equal_nan=True)


# Layouts -----------------------------------------------------------------------------------------
# (tensor, define_tensor keyword arguments): torch gives empty tensors strides that no dense
# layout has ([4, 0]: (1, 1)); each must be accepted by a contiguous definition.
EMPTY = {
    "0_columns": (lambda: torch.empty(4, 0), {"shape": [-1, -1]}),
    "0_rows": (lambda: torch.empty(0, 4), {"shape": [-1, -1]}),
    "0_columns_contiguous": (lambda: torch.empty(4, 0).contiguous(), {"shape": [-1, -1]}),
    "0_rows_transposed": (lambda: torch.empty(4, 0).t(), {"shape": [-1, -1]}),
    "0_columns_sliced": (lambda: torch.randn(4, 6)[:, 6:], {"shape": [-1, -1]}),
    "0_in_the_middle": (lambda: torch.empty(3, 0, 5), {"shape": [-1, -1, -1]}),
    "0_middle_then_broadcast": (lambda: torch.empty(3, 0, 1), {"shape": [-1, -1, 1]}),
    "0_middle_then_expanded": (lambda: torch.empty(3, 0, 1).expand(3, 0, 5),
                               {"shape": [-1, -1, -1], "expanded": [False, False, True]}),
    "0_middle_dense_where_expanded": (lambda: torch.empty(3, 0, 5),
                                      {"shape": [-1, -1, -1], "expanded": [False, False, True]}),
    "expanded_to_0": (lambda: torch.empty(3, 1, 5).expand(3, 0, 5),
                      {"shape": [-1, -1, -1], "expanded": [False, True, False]}),
    "0_then_expanded_0": (lambda: torch.empty(0, 1).expand(0, 5),
                          {"shape": [-1, -1], "expanded": [False, True]}),
}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("layout", list(EMPTY))
def test_empty_inputs_of_any_layout_run(layout, path):
    make, define = EMPTY[layout]
    t = make()
    with FusionDefinition() as fd:
        x = fd.define_tensor(dtype=DataType.Float, **define)
        fd.add_output(fd.ops.mul(fd.ops.neg(x), 2.0))
    (out,) = _run(fd, [t], path)
    _same(out, -t * 2.0, path, define.get("expanded"))


@pytest.mark.parametrize("layout", list(EMPTY))
def test_from_pytorch_describes_an_empty_tensor_as_dense(layout):
    """Its strides say nothing, so the definition is the dense one torch allocates, and it
    takes non-empty dense tensors of the same rank afterwards."""
    t = EMPTY[layout][0]()
    shape, contiguity, stride_order, expanded = inputs_mod.tensor_descriptor(t.shape, t.stride())
    assert stride_order is None and not any(expanded)
    assert all(c in (True, None) for c in contiguity)
    with FusionDefinition() as fd:
        x = fd.from_pytorch(t)
        fd.add_output(fd.ops.neg(x))
    (out,) = fd.execute([t])
    _same(out, -t)
    full = torch.randn([s or 2 for s in t.shape])
    torch.testing.assert_close(fd.execute([full])[0], -full)


def test_a_non_empty_tensor_is_still_checked():
    """Only the empty tensor's layout is free: a strided [4, 6] still breaks contiguity."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.neg(x))
    fd.execute([torch.empty(4, 0)])
    with pytest.raises(InputError, match="not contiguous as defined"):
        fd.execute([torch.randn(4, 12)[:, ::2]])


# Reductions over empty dims ----------------------------------------------------------------------
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("shape, dims", [((4, 0), [1]), ((0, 4), [0]), ((2, 0, 3), [1]),
                                         ((2, 0, 3), [0, 1]), ((2, 3, 0), [2])])
def test_sum_over_an_empty_dim_is_zero(shape, dims, path):
    """The executor sees the reduction of nothing and runs the fusion with a fill of 0 in its
    place: a kernel writes the zeros (for CUDA tensors too)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1] * len(shape))
        fd.add_output(fd.ops.sum(x, dims))
    t = torch.randn(shape)
    (out,) = _run(fd, [t], path, specialized=EMPTY_SUM)
    _same(out, t.sum(dims), path)
    assert out.numel() and not out.any()


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("op", ["mean", "var"])
def test_mean_and_var_over_an_empty_dim_are_nan(op, path):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(getattr(fd.ops, op)(x, [1]))
    t = torch.randn(4, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")         # torch warns about var's degrees of freedom
        want = getattr(t, op)(1)
    (out,) = _run(fd, [t], path, specialized=EMPTY_SUM)
    _same(out, want, path)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("op", ["max", "min"])
def test_max_over_an_empty_dim_is_refused_as_torch_refuses_it(op, path):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(getattr(fd.ops, op)(x, [1]))
    t = torch.randn(4, 0)
    with pytest.raises(IndexError, match="non-zero size"):
        getattr(t, "a" + op)(1)
    with pytest.raises(InputError, match=rf"{op} over a dim of size 0: T1 reduces dim 1 of T0, "
                                         r"i1 = 0 \(input 0 \(T0\) dim 1\)"):
        fd.execute([t], options=PATHS[path])
    assert fd._executor._plans == {}, "a refused signature is not cached"
    # Rows of length 0 kept (a max over the other dim): torch gives an empty result.
    (out,) = _run(fd, [torch.randn(0, 4)], path)
    _same(out, torch.randn(0, 4).amax(1), path)
    good = torch.randn(4, 3)
    torch.testing.assert_close(fd.execute([good], options=PATHS[path])[0],
                               getattr(good, "a" + op)(1))


@pytest.mark.parametrize("path", list(PATHS))
def test_max_whose_value_reaches_no_element_is_not_refused(path):
    """softmax of rows of length 0: its row max reduces nothing, but every output is empty,
    so torch returns an empty tensor, and so does pyfuser."""
    fd = catalogue.define("softmax", "fp32")
    t = torch.randn(5, 0)
    (out,) = _run(fd, [t], path)
    _same(out, torch.softmax(t, 1), path)


def test_max_over_an_empty_dim_through_an_empty_intermediate_is_not_refused():
    """sum over rows of (x - max(x)): the max's value only meets an empty tensor, and the sum
    of no elements is 0 whatever it holds."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        m = fd.ops.max(x, [1], keepdim=True)
        fd.add_output(fd.ops.sum(fd.ops.sub(x, m), [1]))
    for path in PATHS:
        (out,) = _run(fd, [torch.randn(4, 0)], path, specialized=EMPTY_SUM)
        _same(out, torch.zeros(4), path)


# Some outputs empty, others not ------------------------------------------------------------------
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("name", ["rmsnorm_bwd", "layernorm_bwd"])
def test_norm_backward_of_no_rows(name, path):
    """dx has no element, dw (and db) are column sums over no rows: zeros."""
    fd = catalogue.define(name, "fp32")
    small = catalogue.make_inputs(name, 3, 5, "fp32", seed=0)
    inputs = [torch.randn([{3: 0, 5: 24}.get(d, d) for d in t.shape]) for t in small]
    outs = _run(fd, inputs, path, specialized=EMPTY_SUM)
    want = catalogue.get(name).torch_reference(inputs, 1e-6)
    assert any(o.numel() == 0 for o in outs) and any(o.numel() for o in outs)
    for o, w in zip(outs, want):
        _same(o, w, path)


@pytest.mark.parametrize("path", list(PATHS))
def test_all_outputs_empty_launch_nothing(path):
    fd = catalogue.define("rmsnorm_fwd", "fp32")
    small = catalogue.make_inputs("rmsnorm_fwd", 3, 5, "fp32", seed=0)
    inputs = [torch.randn([{3: 0, 5: 24}.get(d, d) for d in t.shape]) for t in small]
    outs = _run(fd, inputs, path)
    if path == "interpret":
        assert fd.last_run.num_kernels == 0 and "nothing to launch" in fd.last_run.reason
    for o, w in zip(outs, catalogue.get("rmsnorm_fwd").torch_reference(inputs, 1e-6)):
        _same(o, w, path)


@pytest.mark.parametrize("path", list(PATHS))
def test_empty_outputs_beside_outputs_with_elements(path):
    """Case 20261123:89: the row means of [1, 0, 2048] (no rows) beside a [1, 1, 1] constant.
    The reduction kernel's grid follows the 0 rows, clamped to one block for the constant,
    whose unguarded row loop read past the input: the empty mean is left out of the kernels'
    fusion (allocated, not computed), and a pointwise kernel writes the constant."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([1, -1, -1], dtype=DataType.Int32)
        fd.add_output(fd.ops.relu(fd.ops.mean(fd.ops.cast(x, DataType.Float), [2], keepdim=True)))
        fd.add_output(fd.ops.gt(fd.ops.full([1, 1, 1], -1.0, dtype=DataType.Half), 3.0))
    inputs = [torch.zeros(1, 0, 2048, dtype=torch.int32)]
    mean, flag = _run(fd, inputs, path)
    assert mean.shape == (1, 0, 1) and flag.shape == (1, 1, 1) and not bool(flag)
    if path == "interpret":
        assert fd.last_run.schedulers == ("pointwise",)
        assert fd.last_run.reason.startswith("output 0 has no elements: allocated, not computed")
        # explain names the specialized fusion's kernel as its executor does.
        from pyfuser.runtime.explain import explain_fusion
        (seg,) = explain_fusion(fd.fusion, inputs, device="h100-4sm", name=fd.name).segments
        assert (seg.kernel.name,) == fd.last_run.kernel_names
        assert "_nonempty_" in seg.kernel.name
