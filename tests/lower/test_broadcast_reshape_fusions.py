"""Pointwise fusions that iterate the output's elements through broadcasts of a wider dtype,
expanded dims broadcast over new dims and reshapes (tests/lower/broadcast_reshape_fusions.py),
run by the kernel-IR interpreter against the float64 reference, each element in memory written
once. Each was an internal error (a fallback) in the fuzzer's first runs:

- a [1, N] input wider than the output (int64 beside fp32) is read in narrower vectors than the
  output's loop: its loops are the same split of the output's loop, replayed (lower/context.py);
- an expanded (stride 0) dim merged with an iteration dim iterates what that dim does, as a
  plain broadcast does (ir/id_graph.py), so the input's cache lines up with the broadcast that
  adds a new outer dim, and is inlined instead of needing registers of runtime size;
- a reshape output reached from its input takes the merges of its own root -> logical history,
  and its consumers map to the root IDs its logical IDs forward (schedule/transform_propagation.py),
  so outputs related through a reshape are all scheduled;
- a size-1 dim a reshape splits off is indexed 0 wherever it appears (lower/indexing.py).
"""
import math

import pytest
import torch

from broadcast_reshape_fusions import FUSIONS
from kir_testing import interpret, schedule_and_lower
from pyfuser import DataType, FusionDefinition
from pyfuser.ir.dtype import from_torch
from pyfuser.runtime.inputs import check_inputs, output_strides
from pyfuser.runtime.reference import evaluate
from pyfuser.schedule.schedulers import registry
from pyfuser.testing import TOLERANCE, rel_error, run_and_check


def check(fd, inputs):
    """Lower with the registry's choice (pointwise), interpret; every output within tolerance
    of the float64 reference and each element in memory written exactly once."""
    st, sch, params, k = schedule_and_lower(fd, inputs, alignment=None)
    assert sch.NAME == "pointwise"
    outs, it = interpret(k, st.bindings, inputs)
    refs = evaluate(fd.fusion, list(inputs), promote_to_double=True,
                    extent_bindings=check_inputs(fd.fusion, inputs))
    for j, (o, r) in enumerate(zip(outs, refs)):
        assert o.shape == r.shape
        assert rel_error(o, r) <= TOLERANCE[from_torch(o.dtype)], (j, params)
        buf = next(p.name for p in k.params if p.source == ("output", j))
        counts = [c for (b, _), c in it.writes.items() if b == buf]
        strides = output_strides(fd.fusion.outputs[j], list(r.shape))
        assert len(counts) == math.prod(n for n, s in zip(r.shape, strides) if s != 0)
        assert set(counts) <= {1}, (j, params)
    # And through execute, whose build refuses schedules it cannot index (a size-1 dim of a
    # reshape was taken for a merge of a dim with itself: the H100 run fell back).
    run_and_check(fd, inputs, scheduler="pointwise", options={"enable": ["interpret"]})
    return params, k


@pytest.mark.parametrize("shape", [(7, 8), (3, 40), (5, 7), (4, 1)])
@pytest.mark.parametrize("name", sorted(FUSIONS))
def test_fusion(name, shape):
    fd, inputs = FUSIONS[name](*shape)
    check(fd, inputs)


def test_fuzz_7_664_expanded_input_is_inlined_into_its_broadcast():
    """The expanded input's cache is computed in the output's loops (it needed a register
    buffer of the row's runtime size when it was not)."""
    fd, inputs = FUSIONS["where_of_an_expanded_bf16"](1021, 13)
    params, k = check(fd, inputs)
    assert params.vector == 2


def test_dims_that_meet_only_through_a_broadcast_are_two_pointwise_segments():
    """Fuzz case 20261123:629, shrunk: t0 [M, N] * t1 [1, 1] and logical_and(t1, zeros [1, K])
    as outputs: N and K meet only through t1's broadcast, so they may differ; one pointwise
    kernel cannot loop over both (the registry refuses it with the reason), and the segmenter
    runs each output's pointwise segment (a reference fallback before)."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1], dtype=DataType.Float)
        t1 = fd.define_tensor([1, 1], dtype=DataType.Double)
        fd.add_output(fd.ops.logical_and(t1, fd.ops.zeros([1, 37], dtype=DataType.Half)))
        fd.add_output(fd.ops.mul(t1, t0))
    ok, why = registry.choose(fd.fusion).scheduler, registry.choose(fd.fusion).reason
    assert ok is None and "output 0 does not iterate the elements of output 1" in why
    x, s = torch.randn(1, 37), torch.randn(1, 1, dtype=torch.float64)
    run_and_check(fd, [x, s], kernels=2, options={"enable": ["interpret"]},
                  segments=(("kernel", "pointwise"), ("kernel", "pointwise")))
