"""The guarded call of a cached plan (runtime/call_guard.py, executor._guarded_call), on the CPU.

The guard may refuse a call whose key equals the plan's, never pass one whose key differs: for
every variation of the inputs below, a call the guarded path takes must have the plan's key
(executor.FusionExecutorCache._key), and the call it refuses must still run through the
look-up. The executor's CUDA path runs up to the launch as in test_plan_cache.py: NVRTC
compiles, a fake loaded kernel records each launch."""
import pytest
import torch

from pyfuser import FusionDefinition, catalogue
from pyfuser import options as opts
from pyfuser.runtime import call_guard
from pyfuser.runtime import device as device_mod
from pyfuser.runtime import index_check
from pyfuser.runtime.executor import FusionExecutorCache, _KernelPlan, _Target
from pyfuser.runtime.inputs import check_inputs
from pyfuser.schedule.schedulers import registry
from fake_loaded import install_fake_gpu  # noqa: E402  (tests/runtime)

pytest.importorskip("cuda.bindings.nvrtc")
pytestmark = pytest.mark.usefixtures("isolated_cache")

H100 = device_mod.DEVICE_TABLE["h100"]


@pytest.fixture
def fake_gpu(monkeypatch):
    return install_fake_gpu(monkeypatch)


def cached(fd, inputs):
    """An executor whose plan for `inputs` is built as on an H100 and cached under their key,
    as a first GPU call leaves it; then one call through run(), which finds it."""
    ex = fd._executor = FusionExecutorCache(fd.fusion, name=fd.name)
    options = opts.current()
    plan = ex._guarded_kernel_plan(inputs, check_inputs(fd.fusion, inputs),
                                   registry.choose(fd.fusion),
                                   _Target(H100, torch.device("cpu")), options)
    assert isinstance(plan, _KernelPlan) and plan.lean
    ex._plans[ex._key(inputs, options)] = plan
    ex.run(inputs)
    assert ex.guarded_call is not None
    return ex, plan


def rmsnorm_inputs():
    return catalogue.make_inputs("rmsnorm_fwd", 64, 1024, "bf16", seed=0)


def variations(x, w):
    """Inputs that differ from (x, w) in one part of the key, or in none."""
    xb = torch.empty(64 * 1024 + 8, dtype=x.dtype)
    return {
        "same tensors": [x, w],
        "equal copies": [x.clone(), w.clone()],
        "float32 x": [x.float(), w],
        "float16 w": [x, w.half()],
        "more rows": [torch.cat([x, x]), w],
        "fewer rows": [x[:32], w],
        "column-major x": [x.t().contiguous().t(), w],
        "x with a row stride of 2048": [torch.empty(64, 2048, dtype=x.dtype)[:, :1024], w],
        "x misaligned by 2 bytes": [xb[1:1 + 64 * 1024].view(64, 1024), w],
        "x misaligned by 8 bytes": [xb[4:4 + 64 * 1024].view(64, 1024), w],
        "x aligned at an offset of 16 bytes": [xb[8:8 + 64 * 1024].view(64, 1024), w],
        "w expanded from one value": [x, w[:1].expand(1024)],
        "x of rank 3": [x.view(1, 64, 1024), w],
        "w on the meta device": [x, torch.empty_like(w, device="meta")],
        "x requires grad": [x.clone().requires_grad_(True), w],
        "x an nn.Parameter": [torch.nn.Parameter(x.clone(), requires_grad=False), w],
        "one input": [x],
        "three inputs": [x, w, w],
        "a float for w": [x, 1.0],
        "None for x": [None, w],
        "a tuple": (x, w),
    }


def test_the_guarded_call_runs_only_calls_of_the_plans_key(fake_gpu):
    fd = catalogue.define("rmsnorm_fwd", "bf16")
    x, w = rmsnorm_inputs()
    ex, plan = cached(fd, [x, w])
    key = ex._key([x, w], opts.current())
    loaded = plan.loaded
    taken = []
    for what, inputs in variations(x, w).items():
        before = len(loaded.launches)
        outputs = ex.guarded_call(inputs)
        if outputs is None:
            assert len(loaded.launches) == before, f"{what}: refused after launching"
            continue
        taken.append(what)
        assert ex._key(inputs, opts.current()) == key, f"{what}: taken with another key"
        assert len(loaded.launches) == before + 1 and loaded.launches[-1][3].get("how") == "launcher"
        (out,) = outputs
        assert out.shape == x.shape and out.dtype == x.dtype
    assert set(taken) == {"same tensors", "equal copies", "x aligned at an offset of 16 bytes",
                          "a tuple"}, taken


def test_a_guarded_call_launches_the_pointers_of_its_own_inputs(fake_gpu):
    fd = catalogue.define("rmsnorm_fwd", "bf16")
    x, w = rmsnorm_inputs()
    ex, plan = cached(fd, [x, w])
    x2, w2 = x.clone(), w.clone()
    (out,) = ex.guarded_call([x2, w2])
    packed = plan.loaded.launches[-1][2]
    offsets = plan.layout.offsets
    pointers = {int.from_bytes(packed[o:o + 8], "little") for o in offsets}
    assert {x2.data_ptr(), w2.data_ptr(), out.data_ptr()} <= pointers
    assert x.data_ptr() not in pointers and w.data_ptr() not in pointers


def test_execute_takes_the_guarded_call_without_the_key(fake_gpu, monkeypatch):
    fd = catalogue.define("rmsnorm_fwd", "bf16")
    x, w = rmsnorm_inputs()
    ex, plan = cached(fd, [x, w])

    def no_key(*a, **kw):
        raise AssertionError("the key was computed on a guarded call")
    monkeypatch.setattr(ex, "_key", no_key)
    before = len(plan.loaded.launches)
    fd.execute([x.clone(), w.clone()])
    assert len(plan.loaded.launches) == before + 1
    assert fd.last_run is plan.run_info


def test_calls_the_guard_refuses_still_find_their_plan(fake_gpu):
    """A call with the plan's key that the guard refuses (an input requiring grad) takes the
    look-up, which finds the same plan: the guard only ever shortens the way there."""
    fd = catalogue.define("rmsnorm_fwd", "bf16")
    x, w = rmsnorm_inputs()
    ex, plan = cached(fd, [x, w])
    grad_x = x.clone().requires_grad_(True)
    assert ex.guarded_call([grad_x, w]) is None
    before = len(plan.loaded.launches)
    with torch.no_grad():
        ex.run([grad_x, w])
    assert len(plan.loaded.launches) == before + 1 and fd.last_run is plan.run_info


def test_an_options_override_takes_the_look_up_then_the_guard_follows_the_options(fake_gpu):
    fd = catalogue.define("rmsnorm_fwd", "bf16")
    x, w = rmsnorm_inputs()
    ex, plan = cached(fd, [x, w])
    with opts.override({"disable": ["reference_fallback"]}):
        assert ex.guarded_call([x, w]) is None     # other options: the look-up decides
    # A call with options (here CPU tensors, so the reference plan) guards nothing; the next
    # call without them finds the kernel plan by its key and guards it again.
    ex.run([x, w], options={"enable": ["poison_outputs"]})
    assert ex.guarded_call is None and fd.last_run.kind == "reference"
    ex.run([x, w])
    assert ex.guarded_call is not None and fd.last_run is plan.run_info
    key_calls = []
    real_key = ex._key
    ex._key = lambda *a: key_calls.append(1) or real_key(*a)
    before = len(plan.loaded.launches)
    ex.run([x, w])
    assert not key_calls and len(plan.loaded.launches) == before + 1


def test_a_plan_that_is_not_lean_is_guarded_and_runs_its_whole_launch(fake_gpu):
    """Poisoned outputs (a plan with work at launch beyond pointers): the guarded call checks
    every tensor's alignment and runs the plan's general run, whose launch it is."""
    fd = catalogue.define("rmsnorm_fwd", "bf16")
    x, w = rmsnorm_inputs()
    with opts.override({"enable": ["poison_outputs"]}):
        ex = fd._executor = FusionExecutorCache(fd.fusion, name=fd.name)
        options = opts.current()
        plan = ex._guarded_kernel_plan([x, w], check_inputs(fd.fusion, [x, w]),
                                       registry.choose(fd.fusion),
                                       _Target(H100, torch.device("cpu")), options)
        assert not plan.lean and plan._launch_values is None
        ex._plans[ex._key([x, w], options)] = plan
        ex.run([x, w])
        call = ex.guarded_call
        assert call is not None
        (out,) = call([x.clone(), w.clone()])
        assert plan.loaded.launches[-1][3].get("how") is None and out.isnan().all()
        xb = torch.empty(64 * 1024 + 8, dtype=x.dtype)
        assert call([xb[4:4 + 64 * 1024].view(64, 1024), w]) is None
        assert call([x.float(), w]) is None


def test_scalar_inputs_are_checked_by_type_and_passed_by_value(fake_gpu):
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1], dtype="float32")
        s = fd.define_scalar(dtype="float32")
        fd.add_output(fd.ops.mul(a, s))
    x = torch.randn(1000)
    ex = fd._executor = FusionExecutorCache(fd.fusion, name=fd.name)
    options = opts.current()
    plan = ex._guarded_kernel_plan([x, 2.0], check_inputs(fd.fusion, [x, 2.0]),
                                   registry.choose(fd.fusion),
                                   _Target(H100, torch.device("cpu")), options)
    ex._plans[ex._key([x, 2.0], options)] = plan
    ex.run([x, 2.0])
    call = ex.guarded_call
    assert call is not None
    key = ex._key([x, 2.0], options)
    launches = plan.loaded.launches
    taken = []
    for k, inputs in enumerate(([x, 3.5], [x.clone(), -1.0], [x, 2], [x, True], [x, x],
                                [2.0, x], [x], [x.double(), 2.0], [x[:999], 2.0], (x, 0.25))):
        before = len(launches)
        outputs = call(inputs)
        if outputs is None:
            assert len(launches) == before
            continue
        taken.append(k)
        assert ex._key(inputs, options) == key
        packed = launches[-1][2]
        scalar_at = next(plan.layout.offsets[pos] for pos, k in plan.scalar_slots)
        import struct
        assert struct.unpack_from("<f", packed, scalar_at)[0] == inputs[1]
    assert taken == [0, 1, 9], taken
    with FusionDefinition() as rng_fd:
        a = rng_fd.define_tensor([-1], dtype="float32")
        rng_fd.add_output(rng_fd.ops.add(a, rng_fd.ops.rand_like(a)))
    assert rng_fd._no_rng is False and fd._no_rng is True


def test_a_pending_index_error_is_raised_by_a_guarded_call(fake_gpu, monkeypatch):
    fd = catalogue.define("rmsnorm_fwd", "bf16")
    x, w = rmsnorm_inputs()
    ex, plan = cached(fd, [x, w])

    class Pending:
        def settle(self):
            raise index_check.IndexOutOfRange("an earlier call's gather")
    pending = Pending()
    monkeypatch.setitem(index_check.LIVE, id(pending), lambda: pending)
    with pytest.raises(index_check.IndexOutOfRange, match="earlier call"):
        ex.guarded_call([x, w])


def test_a_guard_keeps_no_tensor_alive():
    import gc
    import weakref
    x, w = torch.randn(8, 16), torch.randn(16)
    check = call_guard.tensor_guard([x, w])
    if check is None:
        pytest.skip("this torch has no TensorGuards")
    ref = weakref.ref(x)
    del x
    gc.collect()
    assert ref() is None
    assert check(torch.randn(8, 16), w) and not check(torch.randn(8, 17), w)


@pytest.mark.parametrize("path", ["guarded", "look-up"])
def test_threads_calling_one_plan_launch_their_own_pointers(fake_gpu, path):
    """Calls from several threads share one plan: each launch must carry its own call's
    pointers (a plan's parameter values were one list patched in place: a thread switch
    between patching and packing mixed two calls' pointers)."""
    import sys
    import threading
    fd = catalogue.define("rmsnorm_fwd", "bf16")
    x, w = rmsnorm_inputs()
    ex, plan = cached(fd, [x, w])
    ex.run([x, w])
    loaded = plan.loaded
    run = (ex.guarded_call if path == "guarded"
           else lambda inputs: plan.run(inputs))
    offsets = plan.layout.offsets
    per_thread = [[x.clone(), w.clone()] for _ in range(4)]
    mixed = []

    def work(inputs):
        own = {t.data_ptr() for t in inputs}
        others = {t.data_ptr() for other in per_thread if other is not inputs for t in other}
        for _ in range(300):
            (out,) = run(inputs)
            # The launch this call made is the last one with its output's pointer.
            packed = next(p for _, _, p, _ in reversed(loaded.launches)
                          if out.data_ptr() in {int.from_bytes(p[o:o + 8], "little")
                                                for o in offsets})
            pointers = {int.from_bytes(packed[o:o + 8], "little") for o in offsets}
            if not own <= pointers or pointers & others:
                mixed.append(pointers)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work, args=(inputs,)) for inputs in per_thread]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not mixed, f"{len(mixed)} launches carried another call's pointers"


def test_calls_with_equal_options_take_the_guarded_call(fake_gpu, monkeypatch):
    """Per-call options equal to the last call's are one Options object (options._merged), so
    the guarded call serves them too; other options take the look-up."""
    fd = catalogue.define("rmsnorm_fwd", "bf16")
    x, w = rmsnorm_inputs()
    ex, plan = cached(fd, [x, w])
    per_call = {"disable": ["reference_fallback"]}
    with opts.override(per_call):
        options = opts.current()
        ex._plans[ex._key([x, w], options)] = plan
    ex.run([x, w], options=dict(per_call))       # the look-up, which guards these options
    key_calls = []
    real_key = ex._key
    ex._key = lambda *a: key_calls.append(1) or real_key(*a)
    before = len(plan.loaded.launches)
    ex.run([x.clone(), w.clone()], options={"disable": ["reference_fallback"]})
    assert not key_calls and len(plan.loaded.launches) == before + 1
    ex.run([x, w], options={"enable": ["streaming_loads"]})
    assert key_calls


def test_equal_overrides_are_one_options_object():
    with opts.override({"enable": ["poison_outputs"], "disable": ["kernel_reuse"]}):
        first = opts.current()
    with opts.override({"disable": ["kernel_reuse"], "enable": ["poison_outputs"]}):
        assert opts.current() is first
    with opts.override({"enable": ["poison_outputs"]}):
        assert opts.current() is not first
        with opts.override({"disable": ["kernel_reuse"]}):
            inner = opts.current()
    assert inner == first and inner is not first      # another base: its own entry


def test_calls_alternating_between_signatures_build_each_guard_once(fake_gpu, monkeypatch):
    fd = catalogue.define("rmsnorm_fwd", "bf16")
    a = rmsnorm_inputs()
    b = catalogue.make_inputs("rmsnorm_fwd", 32, 1024, "bf16", seed=1)
    ex, plan_a = cached(fd, a)
    options = opts.current()
    plan_b = ex._guarded_kernel_plan(b, check_inputs(fd.fusion, b), registry.choose(fd.fusion),
                                     _Target(H100, torch.device("cpu")), options)
    ex._plans[ex._key(b, options)] = plan_b
    built = []
    real = call_guard.tensor_guard
    monkeypatch.setattr(call_guard, "tensor_guard", lambda ts: built.append(1) or real(ts))
    for _ in range(3):
        ex.run(b)
        assert fd.last_run is plan_b.run_info
        ex.run(a)
        assert fd.last_run is plan_a.run_info
    assert len(built) == 1      # plan_b's; plan_a's was made by cached()


# Plans with in-place outputs, plans of segments ---------------------------------------------------
@pytest.fixture
def cuda_path(monkeypatch, fake_gpu):
    """fd.execute takes CPU tensors for CUDA ones, down to the fake launch (as
    tools/host_path.py's no-op launch)."""
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    return fake_gpu


def _launches(fake):
    return sum(len(loaded.launches) for loaded in fake.values())


def _accumulate():
    """acc += x * 2, in place, one pointwise kernel."""
    x, acc = torch.randn(64, 96), torch.randn(64, 96)
    with FusionDefinition() as fd:
        tx, tacc = fd.from_pytorch(x), fd.from_pytorch(acc)
        fd.add_output(fd.ops.add(tacc, fd.ops.mul(tx, 2.0)), alias_input=tacc)
    return fd, [x, acc]


def _two_kernels():
    """exp(x), segment_set, times 2: a plan of two pointwise kernels."""
    x = torch.randn(256, 512)
    with FusionDefinition() as fd:
        y = fd.ops.segment_set(fd.ops.exp(fd.from_pytorch(x)))
        fd.add_output(fd.ops.mul(y, 2.0))
    return fd, [x]


@pytest.mark.parametrize("make, kernels", [(_accumulate, 1), (_two_kernels, 2)],
                         ids=["in-place output", "plan of segments"])
def test_plans_with_in_place_outputs_or_segments_take_a_guarded_call(cuda_path, monkeypatch,
                                                                     make, kernels):
    fd, inputs = make()
    fd.execute(inputs)
    ex = fd._executor
    assert ex.guarded_call is not None
    assert len(fd.last_run.segments or [None]) == (kernels if kernels > 1 else 1)
    from pyfuser.runtime import executor as executor_mod
    written = []
    real_write = executor_mod.write_aliased_outputs
    monkeypatch.setattr(executor_mod, "write_aliased_outputs",
                        lambda *a: written.append(1) or real_write(*a))

    def no_key(*a, **kw):
        raise AssertionError("the key was computed on a guarded call")
    monkeypatch.setattr(ex, "_key", no_key)
    before = _launches(cuda_path)
    outputs = fd.execute([t.clone() for t in inputs])
    assert _launches(cuda_path) == before + kernels
    # Each kernel through its plan's launcher (packed in place), as a one-kernel guarded call.
    last = [loaded.launches[-1][3] for loaded in cuda_path.values()]
    assert all(kw.get("how") == "launcher" for kw in last), last
    assert len(outputs) == len(fd.fusion.outputs) - len(fd.fusion.hidden_outputs)
    assert len(written) == (1 if fd.fusion.output_aliases else 0)
    assert fd.last_run.kind == "kernels"


@pytest.mark.parametrize("make", [_accumulate, _two_kernels],
                         ids=["in-place output", "plan of segments"])
def test_the_guard_of_a_plan_refuses_other_alignments_shapes_and_dtypes(cuda_path, make):
    """These plans do not check pointer alignment as they launch: their guarded call does."""
    fd, inputs = make()
    fd.execute(inputs)
    ex = fd._executor
    key = ex._key(inputs, opts.current())
    x = inputs[0]
    spare = torch.empty(x.numel() + 8, dtype=x.dtype)
    variations = {
        "equal copies": [t.clone() for t in inputs],
        "x misaligned by 4 bytes": [spare[1:1 + x.numel()].view(x.shape)] + inputs[1:],
        "x aligned at an offset of 16 bytes": [spare[4:4 + x.numel()].view(x.shape)] + inputs[1:],
        "x of other rows": [torch.randn(x.shape[0] + 1, x.shape[1])] + [
            torch.randn(x.shape[0] + 1, x.shape[1]) for _ in inputs[1:]],
        "x in float64": [x.double()] + inputs[1:],
        "one input too many": inputs + [x],
    }
    taken = []
    for what, ins in variations.items():
        before = _launches(cuda_path)
        if ex.guarded_call(ins) is None:
            assert _launches(cuda_path) == before, f"{what}: refused after launching"
            continue
        taken.append(what)
        assert ex._key(ins, opts.current()) == key, f"{what}: taken with another key"
    assert set(taken) == {"equal copies", "x aligned at an offset of 16 bytes"}, taken
