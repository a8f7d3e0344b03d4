"""fd.explain / pyfuser.explain_fusion: the plan execute() would make, without a GPU.

The heuristics and kernels it reports are checked against what execute() runs (through the
interpreter, scheduled for the same device-table entry), so the explanation cannot drift from
the executor."""
import re
import sys
from pathlib import Path

import pytest
import torch

import pyfuser
from pyfuser import DataType, FusionDefinition, InputError, catalogue
from pyfuser.runtime.executor import FallbackWarning

# test_segmented_plans imports segment_testing from its folder, which tests/runtime/conftest.py
# puts on sys.path only once pytest collects that folder: not when this file runs alone.
sys.path.insert(0, str(Path(__file__).resolve().parent / "runtime"))
from tests.runtime.test_segmented_plans import adamw_inputs, adamw_two_params  # noqa: E402

ON_H100 = {"enable": ["interpret"], "device": "h100"}


def _define(body):
    fd = FusionDefinition()
    with fd:
        body(fd)
    return fd


def _meta(inputs):
    return [torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
            if isinstance(x, torch.Tensor) else x for x in inputs]


def _check_against_execute(fd, plan, inputs):
    fd.execute(inputs, options=ON_H100)
    run = fd.last_run
    assert run.kind == "kernels"
    assert run.kernel_names == tuple(k.name for k in plan.kernels)
    assert run.heuristics == tuple(k.params for k in plan.kernels)


def test_rmsnorm_is_one_inner_persistent_kernel():
    fd = catalogue.define("rmsnorm_fwd", "bf16")
    inputs = catalogue.make_inputs("rmsnorm_fwd", 64, 256, "bf16", seed=0)
    plan = fd.explain(_meta(inputs), device="h100")
    assert isinstance(plan, pyfuser.Explanation)
    assert [(s.kind, s.name) for s in plan.segments] == [("kernel", "inner_persistent")]
    seg = plan.segments[0]
    assert [name for name, _ in seg.rejected] == ["inner_outer_persistent", "outer_persistent"]
    k = seg.kernel
    assert k.ptxas is None and k.index_type == "int"
    assert k.heuristic == k.params.describe()
    assert seg.inputs == ("T0 [64, 256] bfloat16", "T1 [256] bfloat16")
    text = str(plan)
    assert text.startswith("rmsnorm_fwd on NVIDIA H100 80GB HBM3 (sm_90a): 1 segment:")
    assert "segment 0: kernel inner_persistent" in text
    assert f"launch: grid {k.grid}, block {k.block}" in text
    # The same plan as for CPU tensors, and as execute() makes.
    assert pyfuser.explain_fusion(fd.fusion, inputs).kernels[0].params == k.params
    _check_against_execute(fd, plan, inputs)


def test_device_table_entry_changes_the_heuristic_input():
    fd = catalogue.define("rmsnorm_fwd", "bf16")
    inputs = _meta(catalogue.make_inputs("rmsnorm_fwd", 64, 256, "bf16", seed=0))
    assert fd.explain(inputs, device="h200").device.name != fd.explain(inputs).device.name
    with pytest.raises(KeyError, match="unknown device 'b200'"):
        fd.explain(inputs, device="b200")


def test_adamw_two_params_is_two_pointwise_segments():
    fd = _define(adamw_two_params)
    inputs = adamw_inputs()
    plan = fd.explain(_meta(inputs))
    assert [(s.kind, s.name) for s in plan.segments] == [("kernel", "pointwise")] * 2
    assert plan.segments[0].inputs[0].endswith("[33, 20] float32")
    assert plan.segments[1].inputs[0].endswith("[7, 130] float32")
    assert [k.name for k in plan.kernels] == ["fusion_s0_pointwise_0", "fusion_s1_pointwise_0"]
    assert "unrelated shapes" in plan.segmentation
    _check_against_execute(fd, plan, inputs)


def _linear_gelu(dtype):
    def define(fd):
        x = fd.define_tensor([-1, -1], dtype=dtype)
        w = fd.define_tensor([-1, -1], dtype=dtype)
        fd.add_output(fd.ops.gelu(fd.ops.linear(x, w)))
    return define


def test_linear_gelu_is_a_library_segment_then_a_kernel_with_ptxas():
    # float32: no matmul kernel (it takes 16-bit floats), torch's linear then a gelu kernel.
    fd = _define(_linear_gelu(DataType.Float))
    inputs = [torch.empty(64, 128, dtype=torch.float32, device="meta"),
              torch.empty(256, 128, dtype=torch.float32, device="meta")]
    plan = fd.explain(inputs, compile=True)
    assert [(s.kind, s.name) for s in plan.segments] == [("library", "linear"),
                                                         ("kernel", "pointwise")]
    lib, gelu = plan.segments
    assert lib.kernel is None and "torch.nn.functional.linear" in lib.library_call
    # The tensor between the segments, as the plan allocates it.
    assert lib.outputs == gelu.inputs
    assert re.fullmatch(r"T\d+ \[64, 256\] float32", gelu.inputs[0])
    assert re.search(r"\d+ registers, .* spill stores", gelu.kernel.ptxas)
    assert re.search(r"ptxas: fusion_s1_pointwise_0: \d+ registers", str(plan))


def test_bf16_linear_gelu_is_one_matmul_kernel():
    fd = _define(_linear_gelu(DataType.BFloat16))
    inputs = [torch.empty(192, 128, dtype=torch.bfloat16, device="meta"),
              torch.empty(256, 128, dtype=torch.bfloat16, device="meta")]
    plan = fd.explain(inputs, compile=True)
    assert [(s.kind, s.name) for s in plan.segments] == [("kernel", "matmul")]
    assert re.search(r"ptxas: fusion_matmul_0: \d+ registers", str(plan)), str(plan)


def _full_sum(fd):
    x = fd.define_tensor([-1, -1])
    fd.add_output(fd.ops.sum(x, [0, 1]))


def test_full_sum_is_a_reduction_kernel():
    fd = _define(_full_sum)
    plan = fd.explain([torch.empty(8, 33, device="meta")])
    (seg,) = plan.segments
    assert (seg.kind, seg.name) == ("kernel", "reduction") and seg.kernel is not None
    assert "reduction (full)" in str(plan)


def test_full_sum_is_a_reference_segment_that_every_scheduler_rejected(monkeypatch, isolated_cache):
    """With the reduction scheduler refusing full reductions (as before it had a schedule for
    them), no scheduler takes the sum: a reference segment, its rejections listed."""
    from pyfuser.schedule.schedulers import reduction
    takes = reduction.can_schedule
    monkeypatch.setattr(reduction, "can_schedule", lambda f: (False, "refused by this test")
                        if takes(f)[1].startswith("full") else takes(f))
    fd = _define(_full_sum)
    plan = fd.explain([torch.empty(8, 33, device="meta")])
    (seg,) = plan.segments
    assert (seg.kind, seg.kernel) == ("reference", None)
    assert [name for name, _ in seg.rejected] == [
        "inner_outer_persistent", "outer_persistent", "inner_persistent", "reduction",
        "transpose", "pointwise"]
    assert seg.outputs[0].endswith("[] float32")
    assert "execute() runs this segment with the reference evaluator" in str(plan)
    with pytest.warns(FallbackWarning):
        fd.execute([torch.randn(8, 33)], options=ON_H100)
    assert fd.last_run.kind == "reference"


def _squeeze_transposed(fd):
    x = fd.define_tensor([-1, 1, -1], stride_order=[0, 2, 1])
    fd.add_output(fd.ops.sum(fd.ops.logical_and(fd.ops.gt(x, 0.5), False), [-2]))


def test_a_schedule_that_refuses_late_is_replanned_as_execute_does(monkeypatch, isolated_cache):
    """A scheduler whose schedule() refuses a fusion its heuristic took (fuzz case 5:79 at a
    GPU's element budget: the transpose schedule refused a tile with a size-1 dim left in its
    loop) is planned without, by execute() and, since this session, by explain, which caught
    only the heuristic's refusal and raised the SchedulerError. The schedule here refuses by
    the test's hand: the transpose scheduler now takes that tile."""
    from pyfuser.schedule.schedulers import transpose
    from pyfuser.schedule.schedulers.base import SchedulerError

    def refuse(fusion, params):
        raise SchedulerError("transpose: refused by this test")
    monkeypatch.setattr(transpose, "schedule", refuse)
    fd = _define(_squeeze_transposed)
    x = torch.empty_strided((256, 1, 837), (1, 256, 256), device="meta")
    plan = fd.explain([x], device="h200")
    (seg,) = plan.segments
    assert seg.refused == "transpose: refused by this test", seg.refused
    (again,) = seg.again.segments
    assert (again.kind, again.name) == ("kernel", "pointwise")
    assert "execute() plans this segment again without the transpose scheduler" in str(plan)
    xs = torch.randn(256 * 837).as_strided((256, 1, 837), (1, 256, 256))
    out = fd.execute([xs], options={"enable": ["interpret"], "device": "h200"})[0]
    assert fd.last_run.schedulers == ("pointwise",)
    assert torch.equal(out, ((xs > 0.5) & False).sum(-2))


def _softmax_then_column_sums(fd):
    x = fd.ops.cast(fd.define_tensor([-1, -1], dtype=DataType.BFloat16), DataType.Float)
    e = fd.ops.exp(fd.ops.sub(x, fd.ops.max(x, [1], keepdim=True)))
    p = fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True))
    fd.add_output(p)
    fd.add_output(fd.ops.sum(fd.ops.sigmoid(p), [0], keepdim=True))


def test_empty_dims_are_explained_as_execute_plans_them():
    """Fuzz case 8:821 at a GPU's element budget: with 0 rows, execute() specializes the fusion
    (the empty softmax allocated, the column sums over no rows a fill of 0) and runs one
    pointwise kernel; explain planned the unspecialized fusion and raised a LaunchLimitError for
    a block of 0 threads. Every output empty: no kernels, as execute() launches none."""
    fd = _define(_softmax_then_column_sums)
    x = torch.empty(0, 9658, dtype=torch.bfloat16, device="meta")
    plan = fd.explain([x], device="h200")
    (seg,) = plan.segments
    assert (seg.kind, seg.name) == ("kernel", "pointwise")
    assert "output 0 has no elements" in plan.rewritten and "a fill of 0" in plan.rewritten
    outs = fd.execute([torch.randn(0, 9658).bfloat16()], options=ON_H100)
    assert fd.last_run.schedulers == ("pointwise",)
    assert outs[0].shape == (0, 9658) and torch.equal(outs[1], torch.zeros(1, 9658))
    with FusionDefinition() as empty:
        t = empty.define_tensor([-1, -1])
        empty.add_output(empty.ops.exp(t))
    plan = empty.explain([torch.empty(0, 5, device="meta")])
    assert plan.segments == () and plan.kernels == []
    assert "no kernels: every output is empty: nothing to launch" in str(plan)


def test_dump_segments_prints_the_explanations_segmentation(capsys):
    fd = _define(adamw_two_params)
    inputs = adamw_inputs()
    fd.execute(inputs, options={**ON_H100, "dump": ["segments"]})
    assert fd.explain(_meta(inputs)).segmentation in capsys.readouterr().err


def test_wrong_inputs_and_unfinished_definitions_are_user_errors():
    fd = _define(adamw_two_params)
    with pytest.raises(InputError, match="dtype"):
        fd.explain([torch.empty(33, 20, dtype=torch.float16, device="meta")] * 6)
    unfinished = FusionDefinition()
    with pytest.raises(pyfuser.FusionDefinitionError, match="explain: finish"):
        unfinished.explain([])
