"""Pointwise heuristics against the device table (H100, H200): vector width per dtype, inputs that
cannot take vectors (misaligned, odd sizes, strided, broadcast inner dim), the thread/unroll rule,
and the scheduled loop structure."""
import dataclasses
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lower"))
from kir_testing import Setup, empty_inputs, schedule_and_lower  # noqa: E402

from pyfuser import DataType, FusionDefinition, catalogue  # noqa: E402
from pyfuser.ir import ParallelType as PT  # noqa: E402
from pyfuser.runtime.device import DEVICE_TABLE  # noqa: E402
from pyfuser.schedule.schedulers import pointwise  # noqa: E402
from pyfuser.schedule.schedulers.pointwise import PointwiseParams  # noqa: E402

DEVICES = ["h100", "h200"]
TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def heur(fd, inputs, device="h100", alignment=16):
    st = Setup(fd, inputs, device, alignment)
    return pointwise.compute_heuristics(st.fusion, st.info)


def _from(tensors, body):
    with FusionDefinition() as fd:
        vs = [fd.from_pytorch(t) for t in tensors]
        fd.add_output(body(fd, *vs))
    return fd


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,vector", [("bf16", 8), ("fp16", 8), ("fp32", 4)])
def test_vector_is_16_bytes_of_the_output(device, dtype, vector):
    fd = catalogue.define("silu_mul", dtype)
    p = heur(fd, empty_inputs("silu_mul", 256, 1024, dtype), device)
    assert p.vector == vector and p.vector_inputs == (0, 1)
    assert p.vector * TORCH[dtype].itemsize == 16


@pytest.mark.parametrize("n,vector", [(1023, 1), (1, 1), (4097, 1), (1026, 2), (1028, 4),
                                      (1032, 8)])
def test_vector_divides_the_inner_extent(n, vector):
    # With a broadcast input (gelu_bias's bias [N], indexed by flat % N) the lanes of a vector
    # stay in one row. Without one (silu_mul), dense rows run vectors across rows
    # (PointwiseParams.ragged; tests/schedule/test_pointwise_ragged.py), except a run shorter
    # than one vector.
    fd = catalogue.define("gelu_bias", "bf16")
    p = heur(fd, empty_inputs("gelu_bias", 7, n))
    assert p.vector == vector and not p.ragged
    assert p.vector_inputs == ((0, 1) if vector > 1 else ())
    fd = catalogue.define("silu_mul", "bf16")
    p = heur(fd, empty_inputs("silu_mul", 7, n))
    assert p.ragged == (vector < 8 and 7 * n >= 8)
    assert p.vector == (8 if 7 * n >= 8 else 1)


def test_mixed_dtypes_read_each_input_with_its_own_16_byte_width():
    a = torch.empty(64, 1024, dtype=torch.float32)
    b = torch.empty(64, 1024, dtype=torch.bfloat16)
    fd = _from([a, b], lambda fd, x, y: fd.ops.cast(fd.ops.mul(x, y), DataType.BFloat16))
    p = heur(fd, [a, b])
    assert p.vector == 8                       # bf16 output: 8 x 2 bytes
    assert p.vector_inputs == (0, 1)           # the fp32 input: two loads of 4 x 4 bytes


@pytest.mark.parametrize("alignment,expect", [(16, (0, 1)), (8, (1,)), (2, (1,))])
def test_misaligned_pointer_drops_vector_loads_for_that_input(alignment, expect):
    fd = catalogue.define("silu_mul", "bf16")
    p = heur(fd, empty_inputs("silu_mul", 64, 1024), alignment=[alignment, 16])
    assert p.vector == 8 and p.vector_inputs == expect


@pytest.mark.parametrize("make,vectorized", [
    (lambda: torch.empty(64, 1030, dtype=torch.bfloat16)[:, 3:1027], False),   # rows 1030 apart
    (lambda: torch.empty(64, 1032, dtype=torch.bfloat16)[:, 8:1032], True),    # rows 1032 apart
    (lambda: torch.empty(1024, 64, dtype=torch.bfloat16).t(), False),           # transposed
    (lambda: torch.empty(64, 1, dtype=torch.bfloat16).expand(64, 1024), False),  # inner bcast
    (lambda: torch.empty(1, 1024, dtype=torch.bfloat16).expand(64, 1024), True),
])
def test_input_layouts_decide_vector_loads_per_input(make, vectorized):
    a, b = make(), torch.empty(64, 1024, dtype=torch.bfloat16)
    fd = _from([a, b], lambda fd, x, y: fd.ops.add(x, y))
    p = heur(fd, [a, b])
    assert p.vector == 8
    assert (0 in p.vector_inputs) == vectorized and 1 in p.vector_inputs


def test_odd_inner_size_gives_vector_1_everywhere():
    fd = catalogue.define("gelu_bias", "bf16")
    p = heur(fd, empty_inputs("gelu_bias", 4096, 4097))
    assert (p.vector, p.vector_inputs) == (1, ())


def test_thread_and_unroll_rule():
    """Small tensors keep 128 threads (spread over the SMs); a large one without broadcast inputs
    takes 512 threads, one vector each; with a broadcast input, 128 threads unrolled 4 times."""
    sms = DEVICE_TABLE["h100"].sm_count
    fd = catalogue.define("silu_mul", "bf16")
    small = heur(fd, empty_inputs("silu_mul", 64, 1024))
    big = heur(fd, empty_inputs("silu_mul", 16384, 8192))
    assert (small.threads, small.unroll) == (128, 1)
    assert (big.threads, big.unroll) == (512, 1)
    sizes = [1 << k for k in range(10, 28)]
    threads = [heur(fd, empty_inputs("silu_mul", s // 1024, 1024)).threads for s in sizes]
    assert threads == sorted(threads) and set(threads) <= {128, 256, 512}
    # The switch to more threads comes when every SM still gets many blocks.
    first_256 = sizes[threads.index(256)]
    assert first_256 >= 128 * 8 * sms
    fd = catalogue.define("gelu_bias", "bf16")
    gb = heur(fd, empty_inputs("gelu_bias", 16384, 8192))
    assert (gb.threads, gb.unroll, gb.vector) == (128, 4, 8)
    assert heur(fd, empty_inputs("gelu_bias", 64, 1024)).unroll == 1


def test_heuristics_follow_the_sm_count():
    fd = catalogue.define("silu_mul", "bf16")
    inputs = empty_inputs("silu_mul", 2048, 1024)
    st = Setup(fd, inputs, "h100", 16)
    base = pointwise.compute_heuristics(st.fusion, st.info)
    few = dataclasses.replace(st.info.device, sm_count=8)
    st.info.device = few
    fewer = pointwise.compute_heuristics(st.fusion, st.info)
    assert base.threads < fewer.threads      # fewer SMs: bigger blocks at the same size


@pytest.mark.parametrize("name", ["gelu_bias", "silu_mul"])
def test_h100_and_h200_agree(name):
    # Same SM count and limits; the heuristics read nothing else that differs.
    for shape in [(7, 1023), (16384, 8192), (1, 1)]:
        ins = empty_inputs(name, *shape)
        fd = catalogue.define(name, "bf16")
        assert heur(fd, ins, "h100") == heur(fd, ins, "h200")


def test_heuristic_is_hashable_equal_across_equivalent_shapes():
    fd = catalogue.define("silu_mul", "bf16")
    a = heur(fd, empty_inputs("silu_mul", 256, 1024))
    b = heur(fd, empty_inputs("silu_mul", 512, 1024))
    c = heur(fd, empty_inputs("silu_mul", 256, 1023))
    assert a == b and hash(a) == hash(b) and a != c
    assert a.describe().startswith("pointwise: 128 threads, vector 8, unroll 1")


def test_empty_output():
    fd = catalogue.define("silu_mul", "fp32")
    p = heur(fd, [torch.empty(0, 16), torch.empty(0, 16)])
    assert p == PointwiseParams(note="empty output")


def test_can_schedule_reasons():
    assert pointwise.can_schedule(catalogue.define("row_sum").fusion) == (
        False, "the fusion has reductions")
    ok, why = pointwise.can_schedule(catalogue.define("gelu_bias").fusion)
    assert ok and "no reductions" in why
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        y = fd.define_tensor([-1])
        fd.add_output(fd.ops.neg(x))
        fd.add_output(fd.ops.neg(y))
    ok, why = pointwise.can_schedule(fd.fusion)
    assert not ok and why.startswith("output 1 does not iterate the elements of output 0")


@pytest.mark.parametrize("unroll", [1, 2])
def test_scheduled_loops(unroll):
    fd = catalogue.define("silu_mul", "bf16")
    ins = empty_inputs("silu_mul", 64, 1024)
    st, sch, p, k = schedule_and_lower(fd, ins, params=PointwiseParams(
        vector=8, threads=128, unroll=unroll, vector_inputs=(0, 1)), scheduler=pointwise)
    out = st.fusion.outputs[0]
    kinds = [i.parallel_type for i in out.domain.loop]
    if unroll == 1:
        assert kinds == [PT.BIDx, PT.TIDx, PT.Vectorize]
    else:
        assert kinds == [PT.BIDx, PT.Unroll, PT.TIDx, PT.Vectorize]
    assert [i.const_extent for i in out.domain.loop][1:] == ([128, 8] if unroll == 1 else
                                                              [unroll, 128, 8])


def test_a_reduction_over_an_expanded_dim_broadcast_back_is_another_segment():
    """min over an expanded [N] (a squeeze standing for the reduction: its one element) used
    through a broadcast beside that same [N] (fuzz 20261334:1080): in one flat loop the squeeze
    reads the loop's own tensors and the loop reads its result, a cycle of loops the lowering
    refused (the reference ran). The pointwise scheduler leaves the squeeze to its own segment."""
    from pyfuser.schedule.schedulers import pointwise
    from pyfuser.testing import run_and_check
    x = torch.randn(1).to(torch.bfloat16).expand(513)
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1], contiguity=[None], dtype=DataType.BFloat16, expanded=[True])
        f = fd.ops.cast(t, DataType.Float)
        fd.add_output(fd.ops.where(fd.ops.ne(t, 0.5), f, fd.ops.min(f, keepdim=True)))
    ok, why = pointwise.can_schedule(fd.fusion)
    assert not ok and "broadcast back" in why
    run_and_check(fd, [x], kernels=None, options={"enable": ["interpret"]})
    assert fd.last_run.kind == "kernels" and set(fd.last_run.schedulers) == {"pointwise"}
