"""The executor without a GPU: CPU inputs run the reference evaluator (and say so), plans are
cached per input signature, kernels are shared between shapes whose heuristics are equal, forced
heuristics are type-checked, the fallbacks report why, and `explain --compile` prints ptxas's
report. The kernel path runs up to the launch: NVRTC compiles, nothing is loaded."""
import os
import re
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch

from pyfuser import FusionDefinition, catalogue
from pyfuser.options import OptionError
from pyfuser.runtime import device as device_mod
from pyfuser.runtime import fusion_kernel
from pyfuser.runtime.executor import (FallbackWarning, FusionExecutorCache, RunInfo,
                                      index_type_for)
from pyfuser.runtime.inputs import check_inputs
from pyfuser.runtime.reference import evaluate
from pyfuser.runtime.rewritten_plan import RewrittenPlan
from pyfuser.schedule import split_normalizations
from pyfuser.schedule.schedulers import registry
from pyfuser.schedule.schedulers.pointwise import PointwiseParams
from pyfuser.schedule.schedulers.reduction import ReductionParams

ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("isolated_cache")   # tests/conftest.py


# CPU inputs --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", catalogue.names())
def test_cpu_inputs_run_the_reference_evaluator(name):
    fd = catalogue.define(name, "fp32")
    inputs = catalogue.make_inputs(name, 5, 24, "fp32", seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                 # no fallback warning for CPU inputs
        outs = fd.execute(inputs)
    info = fd.last_run
    assert isinstance(info, RunInfo)
    assert (info.kind, info.schedulers, info.num_kernels) == ("reference", (), 0)
    assert "not on a CUDA device" in info.reason
    ref = evaluate(fd.fusion, inputs, extent_bindings=check_inputs(fd.fusion, inputs))
    for o, r in zip(outs, ref):
        torch.testing.assert_close(o, r)
    for o, t in zip(outs, catalogue.get(name).torch_reference(inputs, 1e-6)):
        torch.testing.assert_close(o, t, rtol=1e-4, atol=1e-4)


def test_plans_are_cached_per_input_signature():
    fd = catalogue.define("silu_mul", "fp32")
    a, b = torch.randn(4, 16), torch.randn(4, 16)
    fd.execute([a, b])
    ex = fd._executor
    assert len(ex._plans) == 1
    fd.execute([torch.randn(4, 16), torch.randn(4, 16)])     # same signature: same plan
    assert len(ex._plans) == 1
    fd.execute([torch.randn(8, 16), torch.randn(8, 16)])     # new shape
    assert len(ex._plans) == 2
    base = torch.randn(4 * 16 + 1)
    fd.execute([base[1:].view(4, 16), b])                    # a pointer 4 bytes off 16
    assert len(ex._plans) == 3
    assert ex.kernels() == []                                # the reference needs no kernels


def test_index_type_for_large_spans():
    small = torch.empty(4, 8)
    big_numel = torch.empty(1, 1024).expand(1 << 21, 1024)   # 2^31 elements, no memory
    big_span = torch.empty_strided((2, 2), (2 ** 31, 1), device="meta")   # offset 2^31
    assert index_type_for([small]) == "int"
    assert index_type_for([small, big_numel]) == "int64"
    assert index_type_for([big_span]) == "int64"


# The kernel path, driven on the CPU ------------------------------------------------------------
class _Launchless:
    """Drive FusionExecutorCache._kernel_plan without a GPU: the device table stands in for the
    live query and the plan stops before loading the cubin."""

    def __init__(self, monkeypatch):
        monkeypatch.setattr(device_mod, "get_device_properties",
                            lambda *_: device_mod.DEVICE_TABLE["h100"])
        monkeypatch.setattr(FusionExecutorCache, "_plan_for",
                            lambda self, fk, inputs, bindings, out_sizes, dev, choice: fk)
        # Lower with the kernel-IR verifier after every pass.
        # (build_kernel imports `lower` from pyfuser.lower when it runs.)
        import pyfuser.lower
        lower = pyfuser.lower.lower
        monkeypatch.setattr(pyfuser.lower, "lower",
                            lambda *a, **kw: lower(*a, **dict(kw, verify_each=True)))

    @staticmethod
    def plan(fd, inputs, options=None):
        from pyfuser import options as opts
        if fd._executor is None:
            fd._executor = FusionExecutorCache(fd.fusion, name=fd.name)
        ex = fd._executor
        bindings = check_inputs(fd.fusion, inputs)
        choice = registry.choose(fd.fusion)
        from pyfuser.runtime.executor import _Target
        target = _Target(device_mod.DEVICE_TABLE["h100"], torch.device("cuda", 0))
        with opts.override(options):
            return ex._guarded_kernel_plan(inputs, bindings, choice, target, opts.current())


def test_equal_heuristics_share_one_kernel(monkeypatch):
    drive = _Launchless(monkeypatch)
    fd = catalogue.define("silu_mul", "bf16")
    ins = [catalogue.make_inputs("silu_mul", M, N, "bf16", seed=0)
           for M, N in [(256, 1024), (512, 1024), (256, 1023)]]
    k1, k2, k3 = (drive.plan(fd, x) for x in ins)
    assert k1 is k2                       # same heuristic, same kernel (compiled once)
    # Rows of 1023: vectors across rows (ragged), a heuristic of its own.
    assert k3 is not k1 and k3.params.vector == 8 and k3.params.ragged
    assert len(fd._executor.kernels()) == 2
    assert k1.params.vector == 8 and k1.module is not None
    assert k1.module.ptxas.spill_store_bytes == 0
    assert set(k1.stages) >= {"fusion_ir", "scheduled_ir", "heuristics", "kernel_ir", "cuda",
                              "ptxas"}
    assert k1.name == "silu_mul_pointwise_0" and k3.name == "silu_mul_pointwise_1"


def test_kernel_reuse_can_be_disabled(monkeypatch):
    drive = _Launchless(monkeypatch)
    fd = catalogue.define("silu_mul", "bf16")
    a = catalogue.make_inputs("silu_mul", 256, 1024, "bf16", seed=0)
    b = catalogue.make_inputs("silu_mul", 512, 1024, "bf16", seed=0)
    k1 = drive.plan(fd, a, {"disable": "kernel_reuse"})
    k2 = drive.plan(fd, b, {"disable": "kernel_reuse"})
    assert k1.params == k2.params and k1 is not k2


def test_forced_heuristic_is_used(monkeypatch):
    drive = _Launchless(monkeypatch)
    fd = catalogue.define("row_sum", "fp32")
    x = catalogue.make_inputs("row_sum", 64, 1024, "fp32", seed=0)
    forced = ReductionParams(True, 4, 64, 2, 2, (0,), 2)
    fk = drive.plan(fd, x, {"heuristic": forced})
    assert fk.params is forced and "grid reduction over blockIdx.y" in fk.source


def test_forced_heuristic_of_the_wrong_type(monkeypatch):
    drive = _Launchless(monkeypatch)
    fd = catalogue.define("row_sum", "fp32")
    x = catalogue.make_inputs("row_sum", 64, 1024, "fp32", seed=0)
    with pytest.raises(TypeError, match=r"row_sum: forced heuristic PointwiseParams does not fit "
                                        r"the reduction scheduler, which takes ReductionParams"):
        drive.plan(fd, x, {"heuristic": PointwiseParams(vector=4)})


def test_forced_heuristic_past_cuda_block_limits_is_an_option_error(monkeypatch):
    """Blocks of 512 x 4 threads: refused when lowering states the launch, naming the option,
    where NVRTC or the launch would have failed."""
    drive = _Launchless(monkeypatch)
    fd = catalogue.define("row_sum", "fp32")
    x = catalogue.make_inputs("row_sum", 64, 1024, "fp32", seed=0)
    with pytest.raises(OptionError, match=r"row_sum: the forced heuristic \(ReductionParams\) "
                                          r"launches blocks of \(512, 4, 1\), 2048 threads, "
                                          r"past CUDA's limits"):
        drive.plan(fd, x, {"heuristic": ReductionParams(True, 4, 512, 4, 2, (0,), 1)})


def test_launch_limits():
    from pyfuser.kir.launch import LaunchLimitError, check_launch_limits
    check_launch_limits((2 ** 31 - 1, 65535, 65535), (1024, 1, 1))
    check_launch_limits((1, 1, 1), (16, 1, 64))
    for grid, block in [((1, 1, 1), (1025, 1, 1)), ((1, 1, 1), (32, 32, 2)),
                        ((1, 1, 1), (1, 1, 65)), ((1, 65536, 1), (32, 1, 1)),
                        ((2 ** 31, 1, 1), (32, 1, 1))]:
        with pytest.raises(LaunchLimitError, match="past CUDA's limits"):
            check_launch_limits(grid, block)


def test_forced_vector_width_that_does_not_fit_the_inputs_is_refused(monkeypatch):
    drive = _Launchless(monkeypatch)
    fd = catalogue.define("silu_mul", "fp32")
    x = catalogue.make_inputs("silu_mul", 7, 1023, "fp32", seed=0)
    with pytest.raises((ValueError, TypeError), match="vector"):
        drive.plan(fd, x, {"heuristic": PointwiseParams(vector=4, vector_inputs=(0, 1))})


def test_forced_vectors_along_a_strided_inner_dim_are_refused():
    """Every 4th column of a [4, 32] tensor: rows of 32 elements (multiples of 4, the old check
    of the outer strides passed) but its innermost dim has stride 4; 4-wide reads along it would
    take the wrong elements. The check follows the input's stride-1 dim."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=[False, False])
        fd.add_output(fd.ops.exp(x))
    x = torch.randn(4, 32)[:, ::4]
    forced = PointwiseParams(vector=4, vector_inputs=(0,))
    with pytest.raises(ValueError, match=r"input 0 \(T0\) cannot be read with 4-wide vectors "
                                         r".*: its dim 1, innermost in memory, has stride 4, "
                                         r"not 1$"):
        fd.execute([x], options={"enable": ["interpret"], "heuristic": forced})


def test_forced_vectors_for_a_size_1_input_read_it_element_wise():
    """A heuristic that asks for vector loads of a [1] input gets element-wise reads of it (the
    schedule vectorizes only along a tensor's stride-1 dim): correct, no out-of-bounds read."""
    with FusionDefinition() as fd:
        a, b = fd.define_tensor([-1]), fd.define_tensor([1])
        fd.add_output(fd.ops.minimum(a, b))
    ins = [torch.randn(256), torch.randn(1)]
    forced = PointwiseParams(vector=4, vector_inputs=(0, 1))
    (out,) = fd.execute(ins, options={"enable": ["interpret"], "heuristic": forced})
    assert fd.last_run.kind == "kernels" and fd.last_run.backend == "interpreter"
    torch.testing.assert_close(out, torch.minimum(ins[0], ins[1]))
    (fk,) = fd._executor.kernels()
    assert fk.kernel.vector_widths == {"T0": 4, "T2": 4}


def test_a_heuristic_refusal_plans_the_fusion_without_that_scheduler(monkeypatch):
    """A softmax row too long for registers, its looped variant off: the persistent heuristic
    refuses it at run time, and the call is planned again without that scheduler (kernels: a
    logsumexp reduction and a pointwise pass; no warning), not run by the reference evaluator. (By default the looped variant takes it:
    one kernel.)"""
    import warnings
    drive = _Launchless(monkeypatch)
    fd = catalogue.define("softmax", "fp32")
    if registry.choose(fd.fusion).scheduler is None:
        pytest.skip("no scheduler takes softmax")
    x = [torch.empty(2, 1 << 20)]
    assert drive.plan(fd, x).params.looped
    fd = catalogue.define("softmax", "fp32")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        plan = drive.plan(fd, x, {"disable": "looped_inner_persistent"})
        # Segmented without it, softmax's exp(x - max) would be stored between kernels: the
        # plan is the split one (schedule/split_normalizations.py), whose executor meets the
        # same refusal and segments the rewritten fusion.
        assert isinstance(plan, RewrittenPlan)
        assert plan.what == split_normalizations.DESCRIPTION
        split = types.SimpleNamespace(fusion=plan.executor.fusion, _executor=plan.executor)
        plan = drive.plan(split, x, {"disable": "looped_inner_persistent"})
    seg = plan.segmented
    assert [s.name for s in seg.segments] == ["reduction", "pointwise"]
    assert "registers" in seg.why


def test_cooperative_cluster_grid_is_sized_by_the_clusters_that_fit(monkeypatch):
    """Norm backward with rows split over clusters of 2 along blockIdx.y: the grid sync needs
    all G x 2 blocks resident, and a GPC takes whole clusters, so the executor asks the driver
    how many clusters fit (not blocks per SM) and reschedules G to that many."""
    from pyfuser.runtime import launch as launch_mod
    drive = _Launchless(monkeypatch)
    asked = []
    monkeypatch.setattr(launch_mod, "cluster_occupancy",
                        lambda k, block, smem, cluster: asked.append((block, cluster)) or 61)
    monkeypatch.setattr(launch_mod, "occupancy",
                        lambda *a: pytest.fail("blocks per SM asked for a cluster kernel"))
    monkeypatch.setattr(fusion_kernel.FusionKernel, "loaded", lambda self, index: None)
    fd = catalogue.define("rmsnorm_bwd", "bf16")
    small = catalogue.make_inputs("rmsnorm_bwd", 3, 5, "bf16", seed=0)
    x = [torch.empty([{3: 256, 5: 65536}.get(d, d) for d in t.shape], dtype=t.dtype)
         for t in small]
    fk = drive.plan(fd, x)
    assert asked and asked[0] == ((512, 1, 1), (1, 2, 1))
    assert fk.params.cluster == 2 and fk.kernel.launch.cluster == (1, 2, 1)
    assert fk.params.grid == 61, "66 clusters planned, 61 fit"
    assert len(fd._executor.kernels()) == 2


class _CudaLooking(torch.Tensor):
    """A CPU tensor that says it is on cuda:0: the executor's device dispatch, without a GPU."""

    @property
    def is_cuda(self):
        return True

    @property
    def device(self):
        return torch.device("cuda", 0)


class _Reached(Exception):
    pass


@pytest.mark.parametrize("name, major, minor", [("NVIDIA A100-SXM4-80GB", 8, 0),
                                                ("NVIDIA B200", 10, 0),
                                                ("NVIDIA GeForce RTX 4090", 8, 9)])
def test_a_gpu_without_a_device_table_entry_falls_back_before_any_kernel(monkeypatch, name,
                                                                          major, minor):
    """CUDA tensors on a GPU whose architecture the device table lacks: the reference evaluator
    runs, with a FallbackWarning naming the GPU, before a scheduler is chosen or a cubin built
    or loaded (a sm_90a cubin does not load there)."""
    import dataclasses

    props = dataclasses.replace(device_mod.DEVICE_TABLE["h100"], name=name, major=major,
                                minor=minor)
    monkeypatch.setattr(device_mod, "get_device_properties", lambda *_: props)
    for mod, attr in [(registry, "choose"), (fusion_kernel, "build_kernel")]:
        monkeypatch.setattr(mod, attr, lambda *a, **k: pytest.fail(f"{attr} called"))
    monkeypatch.setattr(fusion_kernel.FusionKernel, "loaded",
                        lambda *a: pytest.fail("a cubin loaded"))
    fd = catalogue.define("silu_mul", "fp32")
    inputs = catalogue.make_inputs("silu_mul", 4, 16, "fp32", seed=0)
    cuda_looking = [t.as_subclass(_CudaLooking) for t in inputs]
    with pytest.warns(FallbackWarning, match=rf"silu_mul: no kernels for {name} "
                                             rf"\(sm_{major}{minor}\): pyfuser generates kernels "
                                             r"for sm_90 \(H100, H200\) only; running the "
                                             "reference evaluator"):
        outs = fd.execute(cuda_looking)
    assert fd.last_run.kind == "reference" and f"sm_{major}{minor}" in fd.last_run.reason
    assert not fd.last_run.internal_error
    for o, t in zip(outs, catalogue.get("silu_mul").torch_reference(inputs, 1e-6)):
        torch.testing.assert_close(o.as_subclass(torch.Tensor), t)
    with pytest.raises(RuntimeError, match="no kernels for .* the reference fallback is disabled"):
        fd.execute(cuda_looking, options={"disable": ["reference_fallback"]})


def test_a_gpu_with_a_device_table_entry_goes_on_to_schedule(monkeypatch):
    """The control of the test above: an H100 (sm_90) passes the architecture check."""
    monkeypatch.setattr(device_mod, "get_device_properties",
                        lambda *_: device_mod.DEVICE_TABLE["h100"])

    def reached(*a, **k):
        raise _Reached

    monkeypatch.setattr(registry, "choose", reached)
    fd = catalogue.define("silu_mul", "fp32")
    inputs = catalogue.make_inputs("silu_mul", 4, 16, "fp32", seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(_Reached):
            fd.execute([t.as_subclass(_CudaLooking) for t in inputs])


def test_0_dim_fusion_is_a_one_thread_pointwise_kernel():
    with FusionDefinition() as fd:
        x = fd.define_tensor([])
        fd.add_output(fd.ops.neg(x))
    choice = registry.choose(fd.fusion)
    assert choice.scheduler is not None and choice.scheduler.NAME == "pointwise"
    (o,) = fd.execute([torch.tensor(2.0)], options={"enable": ["interpret"]})
    assert o.item() == -2.0 and fd.last_run.kind == "kernels"
    assert fd.last_run.heuristics[0].threads == 1


# explain --compile ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name,shape", [("row_sum", "64x1024"), ("silu_mul", "7x4097")])
def test_explain_compile_prints_the_ptxas_report(name, shape, isolated_cache):
    env = dict(os.environ, PYFUSER_CACHE_DIR=str(isolated_cache), PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "pyfuser", "explain", name, "--shape", shape,
                        "--compile", "--no-run"], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    (report,) = [line for line in out.splitlines() if line.startswith("  ptxas: ")]
    assert re.fullmatch(rf"  ptxas: {name}_\w+: \d+ registers, \d+ barriers, \d+ B static smem, "
                        r"0 B stack, 0 B spill stores, 0 B spill loads", report), report
    assert "## Plan" in out and "## Heuristic of " in out and "## CUDA of " in out
    assert "  launch: grid (" in out
    assert list(isolated_cache.rglob("*")), "the compile went through the disk cache"


def test_interpret_schedules_for_the_device_asked_for():
    """`interpret` schedules for the 4-SM H100 entry by default and for PYFUSER_DEVICE's entry
    when asked (per call: options={"device": ...}); a different device is a different plan
    (the norm backward's persistent grid follows the SM count)."""
    fd = catalogue.define("rmsnorm_bwd", "fp32")
    inputs = catalogue.make_inputs("rmsnorm_bwd", 600, 256, "fp32", seed=0)
    fd.execute(inputs, options={"enable": ["interpret"]})
    small = fd.last_run
    fd.execute(inputs, options={"enable": ["interpret"], "device": "h100"})
    big = fd.last_run
    assert small.backend == big.backend == "interpreter"
    assert small.heuristics[0].grid < big.heuristics[0].grid, (small, big)
    assert len(fd._executor._plans) == 2


def test_forced_vectors_along_the_dim_the_kernel_reads_are_checked(monkeypatch):
    """An input defined with dim 0 innermost (stride_order [0, 1]) that a forced heuristic reads
    with vectors along dim 1 (the output's inner dim): the schedule moves dim 0 outward in its
    allocation (base.orient_vector_inputs, for the [1, N] view of an [N, 1] tensor). On an
    [8, 16] view of stride (1, 8), dim 0 holds whole vectors of stride 1 but the kernel reads
    along dim 1, stride 8: refused (dim 0 was checked, and the kernel read misaligned vectors
    of the wrong elements)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], stride_order=[0, 1])
        fd.add_output(fd.ops.exp(x))
    from pyfuser.schedule.schedulers import registry
    # The pointwise heuristic's checks: without the transpose scheduler, which takes this
    # fusion (x runs along dim 0 in its definition, the output along dim 1).
    monkeypatch.setattr(registry, "SCHEDULERS",
                        [s for s in registry.SCHEDULERS if s.NAME != "transpose"])
    x = torch.randn(16, 8).t()
    forced = PointwiseParams(vector=4, vector_inputs=(0,))
    with pytest.raises(ValueError, match=r"input 0 \(T0\) cannot be read with 4-wide vectors "
                                         r".*: its dim 1, innermost in memory, has stride 8"):
        fd.execute([x], options={"enable": ["interpret"], "heuristic": forced})
    row = torch.randn(16, 1).t()                 # [1, 16] of stride (1, 1): read along dim 1
    (o,) = fd.execute([row], options={"enable": ["interpret"], "heuristic": forced})
    assert fd.last_run.kind == "kernels" and torch.allclose(o, row.exp())


def test_a_schedule_that_merges_a_dim_with_its_own_twin_is_refused_not_run_wrong():
    """Fuzz 20261204:2816: out = broadcast_in_dim(t3 [M, 1], [1, M, 1, 1]) + reshape(v, [-1])
    with v = where(t0 < 0.5, t0, t3), so out's last dim (a reshape of [M, 1]) iterates exactly
    its dims 1-2. The pointwise schedule merged them into one flat loop; indices per ID group
    gave both the outer index, and the kernel wrote 251 elements 251 times each and left the
    rest unwritten. The schedule is now refused with that reason (the reference runs it)."""
    from pyfuser import DataType
    from pyfuser.runtime.executor import FallbackWarning
    from pyfuser.testing import run_and_check

    g = torch.Generator().manual_seed(0)
    t0_in = torch.randn(251, 1, generator=g).bfloat16()
    t3_in = torch.rand(251, 1, generator=g, dtype=torch.float64) + 0.5
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
        t3 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Double)
        v3 = fd.ops.where(fd.ops.lt(t0, 0.5), t0, t3)
        v6 = fd.ops.broadcast_in_dim(t3, [1, -1, -1, 1], [1, 2])
        fd.add_output(fd.ops.add(v6, fd.ops.reshape(v3, [-1])))
        fd.add_output(v6)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        run_and_check(fd, [t0_in, t3_in], kernels=0, options={"enable": ["interpret"]})
    run = fd.last_run
    assert run.kind == "reference" and not run.internal_error, run
    assert "iterate the same values" in run.reason, run.reason
    assert any(issubclass(w.category, FallbackWarning) for w in seen)


def test_a_merge_of_a_dim_with_a_merge_it_is_part_of_is_refused_not_run_wrong():
    """Fuzz 20261123:983: r = reshape(where(y != 0.5, x, y), [72]) for x [9, 8] and y [9, 1];
    the outputs r / (y * y + 0.5) and (y != 0.5) & (r != 0.5) are [9, 72], and their flat loop
    merges the 9 with the 72, itself merge(9, 8): the same values twice, one merge removed.
    The kernel wrote one row of 9 of the second output; the schedule is now refused."""
    from pyfuser import DataType
    from pyfuser.runtime.executor import FallbackWarning
    from pyfuser.testing import run_and_check

    g = torch.Generator().manual_seed(0)
    x_in = torch.randint(0, 8, (9, 8), generator=g, dtype=torch.int32)
    y_in = torch.randn(9, 1, generator=g).bfloat16()
    with FusionDefinition() as fd:
        y = fd.define_tensor(shape=[-1, 1], contiguity=[True, None], dtype=DataType.BFloat16)
        x = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Int32)
        r = fd.ops.reshape(fd.ops.where(fd.ops.ne(y, 0.5), x, y), [72])
        fd.add_output(fd.ops.div(r, fd.ops.add(fd.ops.mul(y, y), 0.5)))
        fd.add_output(fd.ops.logical_and(fd.ops.ne(y, 0.5), fd.ops.ne(r, 0.5)))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        run_and_check(fd, [y_in, x_in], kernels=0, options={"enable": ["interpret"]})
    run = fd.last_run
    assert run.kind == "reference" and not run.internal_error, run
    assert "iterate the same values" in run.reason, run.reason
    assert any(issubclass(w.category, FallbackWarning) for w in seen)


def test_the_device_of_a_call_comes_from_its_tensors_or_from_execute(monkeypatch):
    """A fusion without tensor inputs (a segment of a plan fed only by fills, factories) runs on
    execute's `device`, by default the current CUDA device: on the GPU machine such a segment ran
    the reference evaluator, its inputs "not on a CUDA device"."""
    import torch

    from pyfuser import options as opts
    from pyfuser.runtime.executor import _requested_device
    from pyfuser.runtime.inputs import InputError
    current = opts.current()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert _requested_device("f", None, [], current) == torch.device("cuda", 3)
    assert _requested_device("f", 1, [], current) == torch.device("cuda", 1)
    assert _requested_device("f", "cuda", [], current) == torch.device("cuda", 3)
    assert _requested_device("f", "cpu", [], current) is None
    cpu = [torch.zeros(2)]
    assert _requested_device("f", None, cpu, current) is None      # the reference evaluator
    with pytest.raises(InputError, match="not on a CUDA device"):
        _requested_device("f", 0, cpu, current)
    with pytest.raises(InputError, match="execute\\(device='nonsense'\\)"):
        _requested_device("f", "nonsense", [], current)
    with opts.override({"enable": ["interpret"]}):
        assert _requested_device("f", None, [], opts.current()) is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(InputError, match="CUDA is not available"):
        _requested_device("f", "cuda", [], current)
