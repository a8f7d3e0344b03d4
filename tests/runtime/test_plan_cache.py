"""Caches keyed before scheduling, and launches declared by lowering, on the CPU.

The executor's CUDA path runs here up to the launch: NVRTC compiles, and a fake loaded kernel
records each launch instead of calling the driver. A "new process" is a fresh
FusionExecutorCache over a fresh definition with the in-memory module cache emptied."""
import dataclasses
import json
import os

import pytest
import torch

from pyfuser import FusionDefinition, catalogue
from pyfuser import options as opts
from pyfuser.ir import scalar as S
from pyfuser.kir.launch import LaunchDescription
from pyfuser.runtime import device as device_mod
from pyfuser.runtime import fusion_kernel, kernel_cache
from pyfuser.runtime.executor import FusionExecutorCache, _Target
from pyfuser.runtime.inputs import check_inputs
from pyfuser.schedule.schedulers import registry
from pyfuser.schedule.schedulers.base import RuntimeInfo
from pyfuser.schedule.schedulers.reduction import ReductionParams
from fake_loaded import install_fake_gpu  # noqa: E402  (tests/runtime)

pytest.importorskip("cuda.bindings.nvrtc")

H100 = device_mod.DEVICE_TABLE["h100"]


# A disk cache of each test's own (conftest.py).
pytestmark = pytest.mark.usefixtures("isolated_cache")


@pytest.fixture
def fake_gpu(monkeypatch):
    return install_fake_gpu(monkeypatch)


def plan(fd, inputs, options=None):
    """The executor's plan for `inputs` as on an H100, built up to the launch."""
    if fd._executor is None:
        fd._executor = FusionExecutorCache(fd.fusion, name=fd.name)
    bindings = check_inputs(fd.fusion, inputs)
    target = _Target(H100, torch.device("cpu"))
    with opts.override(dict({"disable": ["reference_fallback"]}, **(options or {}))):
        return fd._executor._guarded_kernel_plan(inputs, bindings, registry.choose(fd.fusion),
                                                 target, opts.current())


def new_process():
    """What a new process has: no compiled modules in memory (and fresh executors)."""
    kernel_cache.clear_memory_cache()


class Builds:
    """Counts kernels built (scheduled, lowered, printed, compiled)."""

    def __init__(self, monkeypatch):
        self.count = 0
        real = fusion_kernel.build_kernel

        def counting(*a, **kw):
            self.count += 1
            return real(*a, **kw)
        monkeypatch.setattr(fusion_kernel, "build_kernel", counting)


def _forbid_building(monkeypatch):
    def forbidden(*a, **kw):
        raise AssertionError("scheduled, lowered or printed on a disk hit")
    import pyfuser.codegen.cuda
    import pyfuser.lower
    monkeypatch.setattr(fusion_kernel, "build_kernel", forbidden)
    monkeypatch.setattr(pyfuser.lower, "lower", forbidden)
    monkeypatch.setattr(pyfuser.codegen.cuda, "generate_cuda", forbidden)
    for sched in registry.SCHEDULERS:
        monkeypatch.setattr(sched, "schedule", forbidden)


def _static_values(p):
    """A plan's parameter values without the pointers (which differ per allocation)."""
    return [v for v, src in zip(p.values, p.fk.launch.param_sources)
            if src[0] not in ("input", "output", "workspace")]


# The disk cache, keyed before scheduling --------------------------------------------------------
@pytest.mark.parametrize("name, dtype", [("rmsnorm_fwd", "bf16"), ("silu_mul", "fp32")])
def test_a_new_process_launches_from_disk_without_scheduling(monkeypatch, fake_gpu, name, dtype):
    first = catalogue.define(name, dtype)
    inputs = catalogue.make_inputs(name, 64, 1024, dtype, seed=0)
    built = plan(first, inputs)
    assert built.fk.compile_source == "compiled" and built.fk.cache_key is not None
    new_process()
    _forbid_building(monkeypatch)
    again = catalogue.define(name, dtype)               # an equal definition, defined again
    loaded = plan(again, inputs)
    fk = loaded.fk
    assert fk.compile_source == "disk" and fk.kernel is None and fk.fusion is None
    assert fk.module.cubin == built.fk.module.cubin and fk.params == built.fk.params
    assert (loaded.grid, loaded.block) == (built.grid, built.block)
    assert _static_values(loaded) == _static_values(built)
    assert loaded.run_info.heuristics == built.run_info.heuristics
    outs = loaded.run(inputs)
    (grid, block, packed, kw) = fake_gpu[id(fk)].launches[-1]
    assert (grid, block) == (built.grid, built.block) and len(packed) == loaded.layout.size
    assert [tuple(o.shape) for o in outs] == [tuple(o.shape) for o in built.run(inputs)]
    # Another shape of the same signature class: launched from the same stored kernel.
    other = catalogue.make_inputs(name, 96, 1024, dtype, seed=0)
    assert plan(catalogue.define(name, dtype), other).fk.module.cubin == fk.module.cubin


def _misses(monkeypatch, fd_a, ins_a, fd_b, ins_b, options_b=None) -> bool:
    builds = Builds(monkeypatch)
    plan(fd_a, ins_a)
    new_process()
    before = builds.count
    plan(fd_b, ins_b, options_b)
    return builds.count > before


def test_an_equal_signature_and_fusion_hits(monkeypatch, fake_gpu):
    ins = catalogue.make_inputs("silu_mul", 32, 512, "bf16", seed=0)
    same = [x.clone() for x in ins]
    assert not _misses(monkeypatch, catalogue.define("silu_mul", "bf16"), ins,
                       catalogue.define("silu_mul", "bf16"), same)


def test_a_changed_option_misses(monkeypatch, fake_gpu):
    ins = catalogue.make_inputs("silu_mul", 32, 512, "bf16", seed=0)
    assert _misses(monkeypatch, catalogue.define("silu_mul", "bf16"), ins,
                   catalogue.define("silu_mul", "bf16"), ins, {"enable": ["streaming_loads"]})


def test_a_changed_dtype_misses(monkeypatch, fake_gpu):
    assert _misses(monkeypatch, catalogue.define("silu_mul", "bf16"),
                   catalogue.make_inputs("silu_mul", 32, 512, "bf16", seed=0),
                   catalogue.define("silu_mul", "fp16"),
                   catalogue.make_inputs("silu_mul", 32, 512, "fp16", seed=0))


def test_a_changed_alignment_misses(monkeypatch, fake_gpu):
    ins = catalogue.make_inputs("silu_mul", 32, 512, "bf16", seed=0)
    shifted = []
    for x in ins:
        base = torch.empty(x.numel() + 1, dtype=x.dtype)
        shifted.append(base[1:].view(x.shape))           # 2 bytes off 16
    assert _misses(monkeypatch, catalogue.define("silu_mul", "bf16"), ins,
                   catalogue.define("silu_mul", "bf16"), shifted)


def test_a_changed_fusion_misses(monkeypatch, fake_gpu):
    def define(op):
        with FusionDefinition() as fd:
            x = fd.define_tensor([-1, -1])
            fd.add_output(getattr(fd.ops, op)(x))
        return fd
    x = [torch.randn(8, 256)]
    assert not _misses(monkeypatch, define("exp"), x, define("exp"), x)
    assert _misses(monkeypatch, define("exp"), x, define("neg"), x)

    def define_constant(c):
        with FusionDefinition() as fd:
            x = fd.define_tensor([-1, -1])
            fd.add_output(fd.ops.mul(x, fd.define_scalar(c)))
        return fd
    assert _misses(monkeypatch, define_constant(2.0), x, define_constant(3.0), x)


def test_a_changed_pyfuser_source_misses(monkeypatch, fake_gpu):
    ins = catalogue.make_inputs("silu_mul", 32, 512, "bf16", seed=0)
    builds = Builds(monkeypatch)
    plan(catalogue.define("silu_mul", "bf16"), ins)
    new_process()
    monkeypatch.setattr(kernel_cache, "_source_hash", "a different checkout")
    plan(catalogue.define("silu_mul", "bf16"), ins)
    assert builds.count == 2


def test_a_dump_of_a_build_stage_builds_instead_of_loading(monkeypatch, fake_gpu, capsys):
    ins = catalogue.make_inputs("silu_mul", 32, 512, "bf16", seed=0)
    builds = Builds(monkeypatch)
    plan(catalogue.define("silu_mul", "bf16"), ins)
    new_process()
    plan(catalogue.define("silu_mul", "bf16"), ins, {"dump": ["cuda"]})
    assert builds.count == 2 and "===== cuda: silu_mul_pointwise_0" in capsys.readouterr().err


def test_the_source_hash_covers_pyfuser_files(monkeypatch, tmp_path):
    monkeypatch.setattr(kernel_cache, "_source_hash", None)
    h = kernel_cache.source_hash()
    assert len(h) == 64 and kernel_cache.source_hash() is h
    # The memoized digest of the checkout is the digest of its files read afresh.
    assert h == kernel_cache.tree_digest(kernel_cache.Path(kernel_cache.__file__).parents[1])


def _tree(root):
    (root / "sub").mkdir(parents=True)
    (root / "a.py").write_text("x = 1\n")
    (root / "sub" / "b.cuh").write_text("int f();\n")
    (root / "notes.txt").write_text("not source\n")
    return root


def test_a_changed_source_file_changes_the_tree_digest_through_the_memo(tmp_path):
    root, memo = _tree(tmp_path / "src"), tmp_path / "cache" / "memo.json"
    first = kernel_cache.tree_digest(root, memo)
    assert memo.exists() and first == kernel_cache.tree_digest(root)
    assert kernel_cache.tree_digest(root, memo) == first
    (root / "notes.txt").write_text("changed, but not source\n")
    assert kernel_cache.tree_digest(root, memo) == first
    # Same size, modification time put back: the change time still tells the file was written.
    st = os.stat(root / "a.py")
    (root / "a.py").write_text("x = 2\n")
    os.utime(root / "a.py", ns=(st.st_atime_ns, st.st_mtime_ns))
    second = kernel_cache.tree_digest(root, memo)
    assert second != first and second == kernel_cache.tree_digest(root)
    (root / "sub" / "c.h").write_text("")
    assert kernel_cache.tree_digest(root, memo) not in (first, second)
    (root / "sub" / "c.h").unlink()
    assert kernel_cache.tree_digest(root, memo) == second


def test_an_unchanged_file_is_not_read_again(tmp_path, monkeypatch):
    root, memo = _tree(tmp_path / "src"), tmp_path / "memo.json"
    first = kernel_cache.tree_digest(root, memo)
    reads = []
    real = kernel_cache.Path.read_bytes
    monkeypatch.setattr(kernel_cache.Path, "read_bytes",
                        lambda self: reads.append(self.name) or real(self))
    assert kernel_cache.tree_digest(root, memo) == first and reads == []
    (root / "a.py").write_text("x = 3\n")
    kernel_cache.tree_digest(root, memo)
    assert reads == ["a.py"]


def test_a_damaged_source_memo_is_ignored(tmp_path):
    root, memo = _tree(tmp_path / "src"), tmp_path / "memo.json"
    first = kernel_cache.tree_digest(root)
    for text in ("{not json", "[1, 2]", json.dumps({str(root): {"a.py": "x"}})):
        memo.write_text(text)
        assert kernel_cache.tree_digest(root, memo) == first


def test_the_nvrtc_library_is_identified_without_loading_it():
    """The file the key names is the one cuda.bindings loads (checked after loading it)."""
    from cuda.bindings import nvrtc as bindings_nvrtc
    from cuda.pathfinder import load_nvidia_dynamic_lib

    from pyfuser.runtime import nvrtc
    identity = nvrtc.nvrtc_library_identity()
    assert identity is not None, "NVRTC from a wheel here: found without loading it"
    bindings_nvrtc.nvrtcVersion()
    loaded = os.path.realpath(load_nvidia_dynamic_lib("nvrtc").abs_path)
    assert identity[0] == loaded and identity[1] == os.stat(loaded).st_size
    assert kernel_cache.nvrtc_fingerprint() == ["file", *identity]


def test_a_different_nvrtc_misses(monkeypatch):
    from pyfuser.runtime import nvrtc
    fields = {"fusion": "T0", "signature": ()}
    here = kernel_cache.plan_key(fields)
    path, size, ino, mtime = nvrtc.nvrtc_library_identity()
    for other in [("/elsewhere/libnvrtc.so.13", size, ino, mtime), (path, size + 1, ino, mtime),
                  (path, size, ino, mtime + 1)]:
        monkeypatch.setattr(kernel_cache, "remembered_nvrtc_identity", lambda: other)
        assert kernel_cache.plan_key(fields) != here
    # Where the file cannot be told without loading NVRTC, its version keys the cache.
    monkeypatch.setattr(kernel_cache, "remembered_nvrtc_identity", lambda: None)
    by_version = kernel_cache.plan_key(fields)
    assert by_version != here
    monkeypatch.setattr(kernel_cache, "nvrtc_version", lambda: (99, 0))
    assert kernel_cache.plan_key(fields) != by_version


def _fresh_nvrtc_lookup(monkeypatch, calls):
    """Forget this process's answer and count the searches nvrtc_library_identity makes."""
    from pyfuser.runtime import nvrtc
    monkeypatch.setattr(kernel_cache, "_nvrtc_identities", {})
    real = nvrtc.nvrtc_library_identity

    def counted():
        calls.append(1)
        return real()
    monkeypatch.setattr(kernel_cache, "nvrtc_library_identity", counted)


def test_the_nvrtc_file_is_remembered_beside_the_disk_cache(monkeypatch, isolated_cache):
    """A new process (here: a forgotten in-process answer) with the same search context takes
    the file from the memo without searching (importing cuda.pathfinder costs 25-65 ms)."""
    from pyfuser.runtime import nvrtc
    calls = []
    _fresh_nvrtc_lookup(monkeypatch, calls)
    first = kernel_cache.nvrtc_fingerprint()
    assert calls == [1] and first[0] == "file"
    assert (isolated_cache / "nvrtc-library.json").is_file()
    assert kernel_cache.nvrtc_fingerprint() == first and calls == [1]   # in-process answer
    _fresh_nvrtc_lookup(monkeypatch, calls := [])
    assert kernel_cache.nvrtc_fingerprint() == first and calls == []    # from the memo
    # Another search context (a package installed, another interpreter): search again.
    context = nvrtc.nvrtc_search_context()
    other = [context[0] + "-other", *context[1:]]
    monkeypatch.setattr(kernel_cache, "nvrtc_search_context", lambda: other)
    _fresh_nvrtc_lookup(monkeypatch, calls := [])
    assert kernel_cache.nvrtc_fingerprint() == first and calls == [1]
    entries = json.loads((isolated_cache / "nvrtc-library.json").read_text())
    assert [e["context"] for e in entries] == [other, context]


def test_a_rewritten_nvrtc_file_or_a_damaged_memo_searches_again(monkeypatch, isolated_cache):
    calls = []
    _fresh_nvrtc_lookup(monkeypatch, calls)
    first = kernel_cache.nvrtc_fingerprint()
    memo = isolated_cache / "nvrtc-library.json"
    entries = json.loads(memo.read_text())
    entries[0]["identity"][3] += 1               # the file's modification time changed
    memo.write_text(json.dumps(entries))
    _fresh_nvrtc_lookup(monkeypatch, calls := [])
    assert kernel_cache.nvrtc_fingerprint() == first and calls == [1]
    for text in ("{not json", "[1, 2]", json.dumps([{"context": "x"}])):
        memo.write_text(text)
        _fresh_nvrtc_lookup(monkeypatch, calls := [])
        assert kernel_cache.nvrtc_fingerprint() == first and calls == [1]


_DISK_HIT = """
import sys, torch
with_torch = set(sys.modules)      # torch 2.13's torch.cuda imports cuda.bindings itself
from pyfuser import catalogue
from pyfuser.runtime import device, launch
class NoLaunch:
    def check_layout(self, layout): pass
    def launch(self, *a, **kw): pass
    def launcher(self, *a, **kw): return lambda values: None
device.get_device_properties = lambda *_: device.DEVICE_TABLE["h100"]
launch.load = lambda module, device_index=None: NoLaunch()
torch.Tensor.is_cuda = property(lambda self: True)
fd = catalogue.define("rmsnorm_fwd", "bf16")
fd.execute(catalogue.make_inputs("rmsnorm_fwd", 64, 1024, "bf16", seed=0))
print([k.compile_source for k in fd.kernels()])
print(sorted(m for m in set(sys.modules) - with_torch
             if m.startswith(("pyfuser.lower", "pyfuser.codegen", "pyfuser.kir.nodes",
                              "cuda.bindings", "cuda.pathfinder"))))
"""


def test_a_disk_hit_in_a_new_process_imports_no_lowering_and_loads_no_nvrtc(isolated_cache):
    """A process whose kernels all come from the disk cache neither imports lowering, code
    generation and the kernel IR nor loads NVRTC, nor imports cuda.bindings or cuda.pathfinder
    (the NVRTC file is remembered beside the cache; the first process fills the cache, the
    second hits it)."""
    import subprocess
    import sys
    env = dict(os.environ, PYFUSER_CACHE_DIR=str(isolated_cache),
               PYTHONPATH=os.pathsep.join(sys.path))
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", _DISK_HIT], env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        runs.append(done.stdout.splitlines()[-2:])
    assert runs[0][0] == "['compiled']" and "pyfuser.lower" in runs[0][1]
    assert runs[1] == ["['disk']", "[]"]


def test_a_damaged_or_foreign_plan_entry_is_a_miss(monkeypatch, fake_gpu):
    ins = catalogue.make_inputs("silu_mul", 32, 512, "bf16", seed=0)
    fk = plan(catalogue.define("silu_mul", "bf16"), ins).fk
    path = kernel_cache.entry_path(fk.cache_key)
    assert kernel_cache.load_plan(fk.cache_key) is not None
    assert kernel_cache.load_plan("0" * 64) is None
    path.write_bytes(path.read_bytes()[:-5])
    assert kernel_cache.load_plan(fk.cache_key) is None


def test_disk_cache_off_stores_nothing(monkeypatch, fake_gpu, isolated_cache):
    monkeypatch.setenv("PYFUSER_DISABLE_DISK_CACHE", "1")
    opts.reload_environment()
    fk = plan(catalogue.define("silu_mul", "bf16"),
              catalogue.make_inputs("silu_mul", 32, 512, "bf16", seed=0)).fk
    assert fk.cache_key is None and not list(isolated_cache.rglob("*.pfk"))


def test_a_fitted_cooperative_kernel_is_stored_under_the_first_key(monkeypatch, fake_gpu):
    """Norm backward: the grid sync needs every block resident; the executor fits the grid to
    the compiled kernel's occupancy and stores the fitted kernel under the key the heuristic's
    grid gave, so a new process loads it and launches without rescheduling."""
    from pyfuser.runtime import launch as launch_mod
    monkeypatch.setattr(launch_mod, "occupancy", lambda kernel, threads, smem: 1)
    fd = catalogue.define("rmsnorm_bwd", "fp32")
    ins = catalogue.make_inputs("rmsnorm_bwd", 4096, 1024, "fp32", seed=0)
    builds = Builds(monkeypatch)
    first = plan(fd, ins)
    assert builds.count == 2 and first.fk.params.grid == H100.sm_count
    new_process()
    _forbid_building(monkeypatch)
    again = plan(catalogue.define("rmsnorm_bwd", "fp32"), ins)
    assert again.fk.compile_source == "disk" and again.fk.params == first.fk.params
    assert again.grid == first.grid and _static_values(again) == _static_values(first)
    assert [b.numel() for b in again.workspaces] == [b.numel() for b in first.workspaces]


# Launch description --------------------------------------------------------------------------
def _old_launch(fk, inputs):
    """Grid, block and extent parameters as the executor computed them from the kernel IR and
    the fusion before launches were declared by lowering."""
    cb = fk.bind(check_inputs(fk.fusion_of_definition, inputs))
    grid, block = fk.launch_dims(cb)
    extents = [int(S.evaluate(p.source[1], dict(cb)))
               for p in fk.kernel.params if p.source[0] == "extent"]
    return grid, block, extents


@pytest.mark.parametrize("name, dtype, options, shapes", [
    ("rmsnorm_fwd", "bf16", {}, [(64, 1024), (100, 1024), (1, 1024)]),
    ("silu_mul", "fp32", {}, [(64, 1024), (7, 1024), (3, 2048)]),
    ("row_sum", "fp32", {"heuristic": ReductionParams(True, 4, 64, 2, 2, (0,), 2)},
     [(64, 1024), (33, 4000), (5, 100)]),
])
def test_the_launch_description_reproduces_the_launch(fake_gpu, name, dtype, options, shapes):
    fd = catalogue.define(name, dtype)
    kernels = set()
    for M, N in shapes:
        ins = catalogue.make_inputs(name, M, N, dtype, seed=0)
        p = plan(fd, ins, options)
        fk = p.fk
        kernels.add(id(fk))
        desc = LaunchDescription.from_json(json.loads(json.dumps(fk.launch.to_json())))
        assert desc == fk.launch
        fk.fusion_of_definition = fd.fusion
        grid, block, extents = _old_launch(fk, ins)
        assert desc.launch_dims(ins) == (grid, block) == (p.grid, p.block)
        values = [p.values[pos] for pos, s in enumerate(desc.param_sources) if s[0] == "value"]
        assert values == extents
        for pos, src in enumerate(desc.param_sources):
            if src[0] == "stride" and src[1] == "input":
                assert p.values[pos] == ins[src[2]].stride(src[3])
        for (kind, _, _), buf in zip(desc.workspaces, p.workspaces):
            blocks = grid[0] * grid[1] * grid[2]
            if kind == "semaphore":
                assert buf.numel() == blocks and not buf.any()
            elif kind == "grid_reduce_data":
                assert buf.numel() % (blocks * block[0] * block[1] * block[2]) == 0
    assert len(kernels) < len(shapes), "some shapes share a kernel"
    if name == "row_sum":
        assert {s[0] for s in desc.workspaces} == {"grid_reduce_data", "semaphore"}


# Heuristics read options through their inputs -------------------------------------------------
def test_heuristics_read_options_from_runtime_info():
    from pyfuser.runtime.inputs import heuristic_info
    from pyfuser.schedule.schedulers import inner_persistent as ip
    fd = catalogue.define("rmsnorm_fwd", "bf16")
    ins = catalogue.make_inputs("rmsnorm_fwd", 64, 1024, "bf16", seed=0)
    clone, info = heuristic_info(fd.fusion, ins, H100)
    plain = ip.compute_heuristics(clone, dataclasses.replace(info, options=None))
    forced = ip.compute_heuristics(clone, dataclasses.replace(
        info, options=opts.Options(enable=frozenset({"ws_inner_persistent"}))))
    assert not plain.warp_specialized and forced.warp_specialized
    # The options in force around the call do not reach a heuristic given its own.
    with opts.override(enable=["ws_inner_persistent"]):
        assert not ip.compute_heuristics(clone, dataclasses.replace(info, options=None)) \
            .warp_specialized
    assert isinstance(info, RuntimeInfo)


# Bounds ---------------------------------------------------------------------------------------
def test_plans_are_bounded_least_recently_used_first(monkeypatch):
    monkeypatch.setattr(FusionExecutorCache, "MAX_PLANS", 2)
    fd = catalogue.define("silu_mul", "fp32")
    shapes = [catalogue.make_inputs("silu_mul", m, 16, "fp32", seed=0) for m in (1, 2, 3)]
    fd.execute(shapes[0])
    fd.execute(shapes[1])
    first = next(iter(fd._executor._plans.values()))
    fd.execute(shapes[0])                       # used again: now the most recent
    fd.execute(shapes[2])                       # evicts shapes[1]'s plan
    plans = fd._executor._plans
    assert len(plans) == 2 and first in plans.values()
    # A key: options (4 parts), execute's device, then per input (dtype, shape, ...).
    assert [k[5][1] for k in plans] == [torch.Size([1, 16]), torch.Size([3, 16])]


def test_kernels_are_bounded(monkeypatch):
    monkeypatch.setattr(FusionExecutorCache, "MAX_KERNELS", 1)
    fd = catalogue.define("silu_mul", "fp32")
    for N in (1024, 1023):                       # whole vectors and ragged: two heuristics
        ins = catalogue.make_inputs("silu_mul", 4, N, "fp32", seed=0)
        outs = fd.execute(ins, options={"enable": ["interpret"]})
        assert fd.last_run.backend == "interpreter"
        torch.testing.assert_close(
            outs[0], catalogue.get("silu_mul").torch_reference(ins, 1e-6)[0])
    (fk,) = fd._executor.kernels()
    assert fk.params.ragged


def test_the_disk_cache_is_bounded_oldest_first(monkeypatch, isolated_cache):
    from pyfuser.runtime.nvrtc import CompiledModule
    module = kernel_cache.get_or_compile(
        'extern "C" __global__ void k(float* x) { x[threadIdx.x] = 1.f; }', "k")[0]
    assert isinstance(module, CompiledModule)
    desc = LaunchDescription(("ptr",), (("input", 0),), (1, 1, 1), (32, 1, 1), 0, False, None)
    keys = [f"{i:02d}" + "a" * 62 for i in range(3)]
    kernel_cache.store_plan(keys[0], module, desc, "pointwise", "int")
    size = kernel_cache.entry_path(keys[0]).stat().st_size     # every plan entry: this size
    # Room for what is there (the compiled module's own entry, keys[0]) and 2.5 entries more.
    limit = sum(p.stat().st_size for p in isolated_cache.rglob("*.pfk")) + 2.5 * size
    monkeypatch.setenv("PYFUSER_CACHE_MAX_MB", str(limit / (1 << 20)))
    for t, key in enumerate(keys):
        kernel_cache.store_plan(key, module, desc, "pointwise", "int")
        os.utime(kernel_cache.entry_path(key), ns=(t * 10**9, t * 10**9))
    assert kernel_cache.load_plan(keys[0]) is not None      # used: now the most recent
    kernel_cache.store_plan("99" + "b" * 62, module, desc, "pointwise", "int")
    alive = {k for k in keys + ["99" + "b" * 62] if kernel_cache.entry_path(k).exists()}
    assert keys[1] not in alive and keys[0] in alive and "99" + "b" * 62 in alive
    total = sum(p.stat().st_size for p in isolated_cache.rglob("*.pfk"))
    assert total <= limit


def test_the_installed_torchs_float8_rule_keys_a_float8_kernel(monkeypatch):
    """A kernel converting into e4m3fn follows the installed torch's overflow rule (NaN before
    torch 2.13, saturation since): its disk key holds that rule, so a cache shared by two torch
    versions does not hand one's kernel to the other. A fusion without float8 is keyed as
    before."""
    from pyfuser.ir import dtype
    from pyfuser.ir.dtype import DataType
    from pyfuser.runtime.executor import plan_key_fields
    from pyfuser.schedule.schedulers.pointwise import PointwiseParams
    with FusionDefinition() as fd8:
        fd8.add_output(fd8.ops.cast(fd8.define_tensor([-1]), DataType.Float8_e4m3fn))
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.exp(fd.define_tensor([-1])))
    args = ("pointwise", PointwiseParams(), "int", opts.current(), (), "h100")
    keys = {}
    for rule in (False, True):
        monkeypatch.setattr(dtype, "e4m3fn_overflow_is_nan", lambda rule=rule: rule)
        keys[rule] = [kernel_cache.plan_key(plan_key_fields(f.fusion, *args)) for f in (fd8, fd)]
    assert keys[False][0] != keys[True][0]
    assert keys[False][1] == keys[True][1]
    assert "e4m3fn_overflow_is_nan" not in plan_key_fields(fd.fusion, *args)


def test_the_segmentation_lookups_text_keys_the_kernel_as_the_clones_own_would(monkeypatch,
                                                                              fake_gpu):
    """A one-kernel fusion's first plan makes its canonical text for the segmentation's disk
    look-up; the kernel's key reuses it where separating roles copied nothing (the clone's text
    is then the same), so a new process makes it once: the same key as from the clone."""
    from pyfuser.ir import fingerprint
    from pyfuser.runtime import executor as executor_mod
    from pyfuser.schedule.segmenter import segment
    ins = catalogue.make_inputs("rmsnorm_fwd", 32, 512, "bf16", seed=0)
    fd = catalogue.define("rmsnorm_fwd", "bf16")
    decisions = executor_mod._DiskDecisions(fd.fusion, None)
    segment(fd.fusion, None, decisions)
    keys, texts = [], []
    real_key, real_text = kernel_cache.plan_key, fingerprint.fusion_text
    monkeypatch.setattr(kernel_cache, "plan_key", lambda fields: keys.append(fields) or
                        real_key(fields))
    monkeypatch.setattr(fingerprint, "fusion_text", lambda f: texts.append(f) or real_text(f))
    fd._executor = FusionExecutorCache(fd.fusion, name=fd.name)
    fd._executor._fusion_text = decisions.text
    plan(fd, ins)
    assert texts == [] and keys[0]["fusion"] == real_text(fd.fusion.clone()[0])
    fd._executor = FusionExecutorCache(fd.fusion, name=fd.name)      # no look-up made: its own
    new_process()
    plan(fd, ins)
    assert len(texts) == 1 and keys[1]["fusion"] == keys[0]["fusion"]


def test_launches_on_two_streams_get_scratch_of_their_own(fake_gpu, monkeypatch):
    """A grid reduction's data and semaphores are held by a launch while it runs: calls on the
    stream the plan was made on use the plan's set, a call on another stream a set of its own
    (made at its first call there, semaphores zeroed), the same one at its next call; the
    index-free parameters are the same everywhere."""
    from pyfuser.runtime import launch
    fd = catalogue.define("row_sum", "fp32")
    ins = catalogue.make_inputs("row_sum", 33, 4000, "fp32", seed=0)
    p = plan(fd, ins, {"heuristic": ReductionParams(True, 4, 64, 2, 2, (0,), 2)})
    loaded = fake_gpu[id(p.fk)]
    scratch = [pos for pos, _ in p.launch_scratch]
    assert len(scratch) == 2 and not p.lean

    def launched_scratch(stream):
        monkeypatch.setattr(launch, "_stream_getter", lambda index: stream)
        p.run(ins)
        packed = loaded.launches[-1][2]
        return [int.from_bytes(packed[p.layout.offsets[pos]:p.layout.offsets[pos] + 8],
                               "little") for pos in scratch]

    home = [b.data_ptr() for b in p.workspaces]
    assert launched_scratch(0) == home
    other = launched_scratch(0x5000)
    assert not set(other) & set(home)
    assert launched_scratch(0x5000) == other and launched_scratch(0) == home
    third = launched_scratch(0x6000)
    assert not set(third) & set(other + home)
    (_, buffers), = [v for k, v in p._scratch_by_stream.items() if k == 0x6000]
    sems = [b for b, (_, spec) in zip(buffers, p.launch_scratch) if spec[0] == "semaphore"]
    assert sems and not any(b.any() for b in sems)


def test_features_that_change_kernels_key_them_and_runtime_ones_do_not():
    """An executor kept one kernel per heuristic whatever features a call forced: a call
    turning shared_divisor_quotients off (or streaming_loads on) got the kernel built for the
    other setting, whose CUDA differs. Those features key the kernel now, in memory and on
    disk; poison_outputs, which only fills outputs before a launch, keys neither."""
    from pyfuser.ir.dtype import DataType
    from pyfuser.runtime.executor import plan_key_fields
    from pyfuser.schedule.schedulers.pointwise import PointwiseParams
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        s = fd.ops.sum(x, [1])
        fd.add_output(fd.ops.div(x, fd.ops.broadcast(s, [False, True])))
    xs = torch.rand(8, 64) + 0.5
    sources = []
    for extra in ({}, {"disable": ["shared_divisor_quotients"]}, {"enable": ["streaming_loads"]},
                  {"enable": ["poison_outputs"]}):
        o = {"enable": ["interpret"] + extra.get("enable", []), "disable": extra.get("disable", [])}
        out = fd.execute([xs], options=o)[0]
        assert torch.allclose(out, xs / xs.sum(1, keepdim=True))
        sources.append(fd._executor.kernels()[-1].source)
    assert len(fd._executor.kernels()) == 3, "poison_outputs must not build another kernel"
    assert sources[0] != sources[1] and sources[0] != sources[2] and sources[3] == sources[0]
    args = ("pointwise", PointwiseParams(), "int")
    plain, poisoned, streamed = (
        kernel_cache.plan_key(plan_key_fields(fd.fusion, *args, o, (), "h100"))
        for o in (opts.Options(), opts.Options(enable=frozenset({"poison_outputs"})),
                  opts.Options(enable=frozenset({"streaming_loads"}))))
    assert plain == poisoned != streamed
