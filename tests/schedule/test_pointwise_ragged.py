"""Pointwise fusions of dense tensors whose innermost extent holds no whole vectors (rows of
1001): the flat loop's vectors run across rows and only the last vector of the run is checked,
lane by lane (PointwiseParams.ragged, lower/vectorize.py). Heuristic, kernel IR and the
interpreter against float64 on the CPU."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lower"))
from kir_testing import empty_inputs, schedule_and_lower, setup  # noqa: E402
from pyfuser import DataType, FusionDefinition, catalogue  # noqa: E402
from pyfuser.schedule.schedulers import pointwise  # noqa: E402
from pyfuser.testing import run_and_check  # noqa: E402


def _params(name, M, N, dtype="bf16"):
    fd = catalogue.define(name, dtype)
    st = setup(fd, empty_inputs(name, M, N, dtype), device="h200")
    return pointwise.compute_heuristics(st.fusion, st.info)


@pytest.mark.parametrize("M,N,ragged", [(16383, 1001, True), (16384, 1001, True),
                                        (4096, 50257, True), (16384, 8192, False),
                                        (4096, 1002, True), (1, 3, False)])
def test_rows_without_whole_vectors_run_vectors_across_rows(M, N, ragged):
    # 16383 x 1001: element-wise before (0.78 of eager on the H200, session 18). A run shorter
    # than one vector keeps element-wise accesses.
    p = _params("silu_mul", M, N)
    assert p.ragged == ragged
    assert p.vector == (8 if ragged or N % 8 == 0 else 1)
    assert p.vector_inputs == ((0, 1) if p.vector == 8 else ())


def test_a_broadcast_input_keeps_rows_of_whole_vectors():
    # gelu_bias reads its bias [N] through flat % N: a lane past a row's end would read the
    # next row's bias element at the wrong place.
    p = _params("gelu_bias", 16383, 1001)
    assert not p.ragged and p.vector == 1


def test_the_unchecked_vectors_and_the_checked_tail():
    from pyfuser.codegen.cuda import generate_cuda
    fd = catalogue.define("silu_mul")
    _, _, p, kernel = schedule_and_lower(fd, empty_inputs("silu_mul", 16383, 1001),
                                         device="h200")
    assert p.ragged
    body = generate_cuda(kernel)
    body = body[body.index("__global__"):]
    # Two 16-byte loads and one 16-byte store, each under the last lane's check, each with its
    # lane-by-lane copy for the tail.
    assert body.count("load_global_vec") == 2 and body.count("store_global_vec") == 1
    assert body.count("* 8) + 7) < (i0 * i1)") == 3
    assert sorted(kernel.ragged_vectors) == sorted(["T0", "T1", "T6"])
    assert [r[3] for r in kernel.launch_description.vector_reads] == [True, True]


@pytest.mark.parametrize("M,N", [(3, 1001), (1, 13), (5, 7), (2, 8), (7, 3)])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_ragged_kernels_on_the_interpreter(M, N, dtype):
    fd = catalogue.define("silu_mul", dtype)
    inputs = catalogue.make_inputs("silu_mul", M, N, dtype, seed=N)
    run_and_check(fd, inputs, scheduler="pointwise", options={"enable": ["interpret"]})
    p = fd.last_run.heuristics[0]
    full = 8 if dtype == "bf16" else 4
    assert p.ragged == (N % full != 0 and M * N >= full), p


def test_mixed_widths_across_rows_on_the_interpreter():
    # An fp32 input beside bf16 ones: 8-wide bf16 vectors, the fp32 input read as two 4-wide
    # vectors, each checked at its own last lane.
    a = torch.randn(5, 1001, dtype=torch.bfloat16)
    b = torch.randn(5, 1001, dtype=torch.float32)
    with FusionDefinition() as fd:
        x, y = fd.from_pytorch(a), fd.from_pytorch(b)
        fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.cast(x, DataType.Float), y),
                                  DataType.BFloat16))
    run_and_check(fd, [a, b], scheduler="pointwise", options={"enable": ["interpret"]})
    p = fd.last_run.heuristics[0]
    assert p.ragged and p.vector == 8 and p.vector_inputs == (0, 1)


def test_a_strided_input_is_read_lane_by_lane():
    # A slice of wider rows is not one flat run: read element-wise while the others take
    # vectors.
    a = torch.randn(5, 1010)[:, :1001]
    b = torch.randn(5, 1001)
    with FusionDefinition() as fd:
        x, y = fd.from_pytorch(a), fd.from_pytorch(b)
        fd.add_output(fd.ops.add(x, y))
    run_and_check(fd, [a, b], scheduler="pointwise", options={"enable": ["interpret"]})
    p = fd.last_run.heuristics[0]
    assert p.ragged and p.vector_inputs == (1,), p


def test_a_reused_kernel_checks_the_flat_run_before_launch():
    # A heuristic forced onto a non-dense input: the executor refuses before any launch.
    from pyfuser.schedule.schedulers.base import InputFacts, input_vector_problems
    fd = catalogue.define("silu_mul")
    v = fd.fusion.inputs[0]
    assert not input_vector_problems(v, InputFacts((3, 1001), (1001, 1), 16), 8, ragged=True)
    assert input_vector_problems(v, InputFacts((3, 1001), (1008, 1), 16), 8, ragged=True)
    assert input_vector_problems(v, InputFacts((3, 1001), (1001, 1), 2), 8, ragged=True)
    assert input_vector_problems(v, InputFacts((3, 1001), (1001, 1), 16), 8)   # whole vectors


def test_a_flat_run_of_whole_vectors_over_rows_that_hold_none():
    # Fuzz 20261933:30: [64, 31] bf16, 1984 elements, a whole number of 8-wide vectors, so no
    # access needs the lane-by-lane tail; its vectors still cross rows of 31, and the executor
    # asked for rows of whole vectors (an internal error, the reference ran). Every vector
    # access of a ragged schedule is checked as a flat run.
    x = torch.randn(64 * 31 + 8, dtype=torch.bfloat16)[8:].view(64, 31)
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[64, -1], contiguity=[True, True], dtype=DataType.BFloat16)
        fd.add_output(fd.ops.exp2(fd.ops.tanh(t0)))
    run_and_check(fd, [x], scheduler="pointwise", options={"enable": ["interpret"]})
    p = fd.last_run.heuristics[0]
    assert p.ragged and p.vector == 8 and p.vector_inputs == (0,)
    _, _, _, kernel = schedule_and_lower(fd, [x])
    out = fd.fusion.outputs[0]
    assert kernel.ragged_vectors == {"T0", f"T{out.name}"}
    assert [r[3] for r in kernel.launch_description.vector_reads] == [True]
