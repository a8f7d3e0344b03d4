"""One tensor read in two roles, run by the kernel-IR interpreter (CPU) against the float64
reference, with each output element written exactly once.

x.squeeze(1) - x for x [N, 1] (fuzz triage P1), outer products a[:, None] * a[None, :], a
vector added as a row and as a column, x + x.T: through its two uses, one dim of the tensor
lines up with two dims of the output, and the exact ID graph mapped those onto each other.
The pointwise kernel then loaded x once per output element, used that value for both operands
and wrote the diagonal only, each element N times (the rest unwritten); a row sum of x + x.T
was silently wrong. schedule/roles.py gives the second role a copy of its computation, read
from an alias input of the same runtime tensor. The fusions are those of two_role_fusions.py,
which the GPU tests also run.
"""
import warnings
import pytest
import torch

from kir_testing import interpret, lower_upto, schedule_and_lower
from pyfuser import FusionDefinition
from pyfuser.ir.dtype import DataType, from_torch
from pyfuser.lower.context import LoweringError
from pyfuser.runtime.executor import FallbackWarning
from pyfuser.runtime.inputs import check_inputs, output_strides
from pyfuser.runtime.reference import evaluate
from pyfuser.schedule.roles import fusion_self_mapping, scheduling_clone, separate_roles
from pyfuser.schedule.schedulers import pointwise, registry
from pyfuser.testing import TOLERANCE, rel_error, run_and_check
from two_role_fusions import FUSIONS

POINTWISE = ["squeezed_minus_column", "squeezed_equals_column",
             "squeezed_minus_column_and_column_out", "outer_product", "outer_product_of_exp",
             "bias_along_both_dims", "plus_transpose"]
ROWS = ["softmax_of_row_and_column_bias", "layernorm_weight_as_row_and_column",
        "norm_backward_weight_as_row_and_column", "row_sums_of_plus_transpose",
        "column_sums_of_times_transpose"]


def _references(fd, inputs):
    return evaluate(fd.fusion, list(inputs), promote_to_double=True,
                    extent_bindings=check_inputs(fd.fusion, inputs))


def check(fd, inputs, scheduler_name):
    """Schedule with the scheduler the registry picks (asserted), lower, interpret: every output
    within tolerance of the float64 reference, each of its elements written exactly once."""
    st, sch, params, k = schedule_and_lower(fd, inputs)
    assert sch.NAME == scheduler_name, sch.NAME
    outs, it = interpret(k, st.bindings, inputs)
    for j, (o, r) in enumerate(zip(outs, _references(fd, inputs))):
        err = rel_error(o, r)
        assert err <= TOLERANCE[from_torch(o.dtype)], (j, err, params)
        buf = next(q.name for q in k.params if q.source == ("output", j))
        counts = {off: n for (b, off), n in it.writes.items() if b == buf}
        strides = output_strides(fd.fusion.outputs[j], list(r.shape))
        assert all(s != 0 for s in strides)
        assert len(counts) == r.numel() and set(counts.values()) == {1}, (
            j, len(counts), r.numel(), sorted(set(counts.values())), params)
    return k


@pytest.mark.parametrize("N", [5, 32, 37, 130])
@pytest.mark.parametrize("name", POINTWISE)
def test_pointwise_kernel_computes_each_role(name, N):
    """5: the triage repro; 32: fuzz case 7:343, which the vector check caught; 37 and 130: odd
    sizes over several blocks."""
    build, scheduler = FUSIONS[name]
    fd, inputs = build("fp32", N)
    check(fd, inputs, scheduler)


@pytest.mark.parametrize("N", [37, 64, 256])
@pytest.mark.parametrize("name", ROWS)
def test_row_and_reduction_kernels_compute_each_role(name, N):
    build, scheduler = FUSIONS[name]
    fd, inputs = build("fp32", N)
    check(fd, inputs, scheduler)


@pytest.mark.parametrize("name", ["outer_product", "bias_along_both_dims",
                                  "layernorm_weight_as_row_and_column",
                                  "row_sums_of_plus_transpose"])
def test_bf16_kernels_compute_each_role(name):
    """16-bit inputs: 8-wide vectors of the input and of its alias, each along its own dim."""
    build, scheduler = FUSIONS[name]
    fd, inputs = build("bf16", 64)
    check(fd, inputs, scheduler)


@pytest.mark.parametrize("name", POINTWISE + ROWS)
def test_execute_on_the_interpreter(name):
    """Through fd.execute: generated kernels ran (no fallback, no internal error), outputs
    poisoned beforehand, each within tolerance of the float64 reference."""
    build, scheduler = FUSIONS[name]
    fd, inputs = build("fp32", 37)
    outs = fd.execute(inputs, options={"enable": ["interpret", "poison_outputs"]})
    run = fd.last_run
    assert run.kind == "kernels" and run.backend == "interpreter", run
    assert run.schedulers == (scheduler,), run
    for j, (o, r) in enumerate(zip(outs, _references(fd, inputs))):
        assert rel_error(o, r) <= TOLERANCE[from_torch(o.dtype)], (j, o, r)


def test_triage_repro():
    """The P1 repro as reported: 0 on the diagonal and NaN (unwritten) elsewhere before."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 1], dtype=DataType.Float)
        fd.add_output(fd.ops.sub(fd.ops.squeeze(x, [1]), x))
    x = torch.tensor([[10.], [20.], [30.], [40.], [50.]])
    (d,) = fd.execute([x], options={"enable": ["interpret", "poison_outputs"]})
    assert fd.last_run.kind == "kernels", fd.last_run
    assert torch.equal(d, x.squeeze(1)[None, :] - x)


def test_second_role_reads_an_alias_input():
    """The squeeze path keeps x; the direct operand reads an alias input of x with IDs of its
    own. The kernel takes both pointers (and strides) from runtime input 0."""
    fd, inputs = FUSIONS["squeezed_minus_column"][0]("fp32", 5)
    assert fusion_self_mapping(fd.fusion) is not None
    clone, _ = fd.fusion.clone()
    notes = separate_roles(clone)
    assert len(notes) == 1 and "second role" in notes[0], notes
    assert len(clone.inputs) == 2 and clone.input_aliases == {1: 0}
    assert clone.input_position(clone.inputs[1]) == 0
    assert fusion_self_mapping(clone) is None
    assert len(fd.fusion.inputs) == 1           # the definition is left alone
    _, _, _, k = schedule_and_lower(fd, inputs)
    sources = [p.source for p in k.params if p.kind == "ptr"]
    assert sources.count(("input", 0)) == 2 and ("input", 1) not in sources, sources


def test_fusions_without_two_roles_are_left_alone():
    """A tensor used twice with its dims lined up the same way (x * exp(x), a bias and its own
    output) gets no copy."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        b = fd.define_tensor([-1], dtype=DataType.Float)
        fd.add_output(fd.ops.add(fd.ops.mul(x, fd.ops.exp(x)), fd.ops.broadcast(b, [True, False])))
        fd.add_output(fd.ops.mul(b, 2.0))
    clone, _ = scheduling_clone(fd.fusion)
    assert len(clone.inputs) == 2 and clone.input_aliases == {}
    assert repr(clone) == repr(fd.fusion)


def test_roles_that_need_a_copy_of_a_reduction_are_a_reduction_then_a_pointwise_kernel():
    """m = max(x, 1); m[:, None] - m[None, :]: the second role would recompute the reduction.
    No scheduler takes it whole (the reason names the two roles); the segmenter runs the
    reduction, then the pointwise outer difference reading m twice (the reference evaluator
    ran it before)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        m = fd.ops.max(x, [1])
        fd.add_output(fd.ops.sub(fd.ops.broadcast(m, [False, True]),
                                 fd.ops.broadcast(m, [True, False])))
    choice = registry.choose(fd.fusion)
    assert choice.scheduler is None and "two roles" in choice.reason, choice.reason
    x = torch.randn(9, 20)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        (o,) = run_and_check(fd, [x], kernels=2, options={"enable": ["interpret"]},
                             segments=(("kernel", "reduction"), ("kernel", "pointwise")))
    m = x.max(1).values
    assert torch.equal(o, m[:, None] - m[None, :])


def test_lowering_refuses_a_fusion_whose_roles_were_not_separated():
    """Scheduled without separating the roles (a plain clone), the kernel would be wrong:
    lowering refuses it instead."""
    fd, _ = FUSIONS["squeezed_minus_column"][0]("fp32", 5)
    clone, _ = fd.fusion.clone()
    pointwise.schedule(clone, pointwise.PointwiseParams())
    with pytest.raises(LoweringError, match="two roles"):
        lower_upto(clone)
