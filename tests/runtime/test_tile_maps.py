"""2D tile maps (kir.TileBoxMap: a matmul's operands and outputs) on the host, without a GPU:
the launch description's "tmap_tile" source (stated by lowering, through JSON and the disk
cache), the executor's plan (a map per input pointer, an output's after its allocation, each
cached by map and pointer) and its refusal, before launch, of an input the map cannot copy.

No scheduler makes a tile map yet: the tests give a lowered pointwise kernel a TileBoxMap
parameter, or give the executor a kernel whose launch description holds one."""
import dataclasses
import json

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser import options as opts
from pyfuser.kir import nodes as K
from pyfuser.kir.launch import LaunchDescription
from pyfuser.lower.launch import describe_launch
from pyfuser.runtime import device as device_mod
from pyfuser.runtime import tensor_map
from pyfuser.runtime.executor import FusionExecutorCache, _KernelPlan, _Target
from pyfuser.runtime.inputs import check_inputs
from pyfuser.schedule.roles import scheduling_clone
from pyfuser.schedule.schedulers import registry
from fake_loaded import FakeLoaded  # noqa: E402  (tests/runtime)

H100 = device_mod.DEVICE_TABLE["h100"]
A_MAP = K.TileBoxMap("input", 0, inner=1, outer=0, box_cols=64, box_rows=128)
OUT_MAP = K.TileBoxMap("output", 0, inner=1, outer=0, box_cols=64, box_rows=64)
A_SOURCE = ("tmap_tile", "input", 0, 1, 0, 64, 128, 128, ())
OUT_SOURCE = ("tmap_tile", "output", 0, 1, 0, 64, 64, 128, ())


def _definition(**layout):
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=DataType.BFloat16, **layout)
        fd.add_output(fd.ops.add(a, a))
    return fd


def _lowered(fd, inputs):
    """The pointwise kernel of `fd` for `inputs`, lowered (not compiled)."""
    from pyfuser.runtime.fusion_kernel import build_kernel
    from pyfuser.schedule.schedulers.base import InputFacts, RuntimeInfo, facts_per_input
    clone, mapping = scheduling_clone(fd.fusion)
    bindings = check_inputs(fd.fusion, inputs)
    facts = tuple(InputFacts(tuple(x.shape), tuple(x.stride()), 16) for x in inputs)
    info = RuntimeInfo({mapping[id(k)]: v for k, v in bindings.items() if id(k) in mapping},
                       facts_per_input(clone, facts), H100, opts.current())
    sched = registry.choose(fd.fusion).scheduler
    params = sched.compute_heuristics(clone, info)
    return build_kernel(clone, sched, params, "int", "k", compile_now=False).kernel


# The launch description ---------------------------------------------------------------------------
def test_a_tile_map_parameter_is_described_by_its_fields():
    fd = _definition()
    kernel = _lowered(fd, [torch.empty(300, 192, dtype=torch.bfloat16)])
    row_map = K.RowBoxMap(0, 192, 192, 4)
    kernel.params += [K.Param("T0_tile", "tmap", ("tmap", A_MAP), None),
                      K.Param("T1_tile", "tmap", ("tmap", OUT_MAP), None),
                      K.Param("T0_rows", "tmap", ("tmap", row_map), None)]
    desc = describe_launch(kernel)
    assert desc.param_kinds[-3:] == ("tmap", "tmap", "tmap")
    assert desc.param_sources[-3:] == (A_SOURCE, OUT_SOURCE, ("tmap", 0, 192, 192, 4))
    assert K.TileBoxMap(*desc.param_sources[-3][1:]) == A_MAP
    assert K.TileBoxMap(*desc.param_sources[-2][1:]) == OUT_MAP
    assert LaunchDescription.from_json(json.loads(json.dumps(desc.to_json()))) == desc


def test_a_tile_map_of_batch_dims_round_trips():
    """A map over [B, H, S, D] (batch dims (0, 1)) is described by its fields and read back
    from JSON (the disk cache) as the same map; a one-dim batch given as an int (an older
    entry's form) is the same as (d,)."""
    fd = _definition()
    kernel = _lowered(fd, [torch.empty(300, 192, dtype=torch.bfloat16)])
    heads = K.TileBoxMap("input", 0, inner=3, outer=2, box_cols=64, box_rows=64, batch=(0, 1))
    kernel.params.append(K.Param("T0_tile", "tmap", ("tmap", heads), None))
    desc = describe_launch(kernel)
    back = LaunchDescription.from_json(json.loads(json.dumps(desc.to_json())))
    assert back == desc and K.TileBoxMap(*back.param_sources[-1][1:]) == heads
    assert heads.box == (64, 64, 1, 1)
    assert K.TileBoxMap("input", 0, 2, 1, 64, 64, 128, 0) == K.TileBoxMap(
        "input", 0, 2, 1, 64, 64, 128, (0,))


def test_an_unknown_tensor_map_is_refused():
    fd = _definition()
    kernel = _lowered(fd, [torch.empty(8, 64, dtype=torch.bfloat16)])
    kernel.params.append(K.Param("odd", "tmap", ("tmap", object()), None))
    with pytest.raises(ValueError, match="unknown source"):
        describe_launch(kernel)


def _description(*extra_kinds_sources):
    kinds = ("ptr", "ptr") + tuple(k for k, _ in extra_kinds_sources)
    sources = (("input", 0), ("output", 0)) + tuple(s for _, s in extra_kinds_sources)
    return LaunchDescription(kinds, sources, (3, 1, 1), (128, 1, 1), 0, False, None)


def test_the_disk_cache_round_trips_a_tile_map_source(tmp_path, monkeypatch):
    pytest.importorskip("cuda.bindings.nvrtc")
    from pyfuser.runtime import kernel_cache
    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PYFUSER_DISABLE_DISK_CACHE", raising=False)
    opts.reload_environment()
    try:
        module = kernel_cache.get_or_compile(
            'extern "C" __global__ void k(float* x) { x[threadIdx.x] = 1.f; }', "k")[0]
        desc = _description(("tmap", A_SOURCE), ("tmap", OUT_SOURCE))
        key = "ab" * 32
        kernel_cache.store_plan(key, module, desc, "matmul", "int")
        kernel_cache.clear_memory_cache()
        entry = kernel_cache.load_plan(key)
        assert entry is not None and entry.launch == desc
        assert entry.launch.param_sources[2:] == (A_SOURCE, OUT_SOURCE)
    finally:
        kernel_cache.clear_memory_cache()
        monkeypatch.undo()
        opts.reload_environment()


# The executor -------------------------------------------------------------------------------------
@dataclasses.dataclass(eq=False)
class FakeKernel:
    """What the executor reads of a FusionKernel, for a kernel with tile maps."""

    launch: LaunchDescription
    name: str = "tiles"
    scheduler: str = "pointwise"
    params: object = "forced"
    loaded_kernel: FakeLoaded = dataclasses.field(default_factory=FakeLoaded)
    cache_key: str | None = None

    @property
    def param_kinds(self):
        return list(self.launch.param_kinds)

    def loaded(self, index):
        return self.loaded_kernel


@pytest.fixture
def encodings(monkeypatch):
    """encode_tile_box recorded (no driver here): each call's (map, pointer) and a descriptor
    that says which call made it."""
    calls = []

    def encode(x, m):
        assert not tensor_map.tile_box_problems(x, m)
        calls.append((m, x.data_ptr()))
        return len(calls).to_bytes(2, "little") * 64
    monkeypatch.setattr(tensor_map, "encode_tile_box", encode)
    return calls


def _plan(fd, fk, inputs, monkeypatch):
    """The executor's plan of `fk` for `inputs`, through _kernel_plan (the checks before
    launch, then _plan_for) with the kernel given instead of built."""
    monkeypatch.setattr(FusionExecutorCache, "_kernel_for", lambda self, *a, **kw: fk)
    ex = FusionExecutorCache(fd.fusion, name="tiles")
    bindings = check_inputs(fd.fusion, inputs)
    choice = registry.choose(fd.fusion)
    with opts.override({"disable": ["reference_fallback"]}):
        return ex._guarded_kernel_plan(inputs, bindings, choice, _Target(H100, torch.device("cpu")),
                                       opts.current())


def test_the_plan_encodes_input_and_output_tile_maps(monkeypatch, encodings):
    fd = _definition()
    fk = FakeKernel(_description(("tmap", A_SOURCE), ("tmap", OUT_SOURCE)))
    a = torch.randn(300, 192, dtype=torch.bfloat16)
    plan = _plan(fd, fk, [a], monkeypatch)
    assert isinstance(plan, _KernelPlan)
    assert plan._input_tiles == ((2, A_MAP),) and plan._output_tiles == ((3, OUT_MAP),)
    assert plan.tmap_slots == ()
    assert encodings == []                    # encoded per call, for the call's pointers
    kept = []
    for _ in range(3):
        (out,) = plan.run([a])
        kept.append(out)                      # new output pointers each call
        assert out.shape == (300, 192)
    # The input's map once (cached by map and pointer); the output's after each allocation.
    assert encodings[0] == (A_MAP, a.data_ptr())
    assert [c for c in encodings if c[0] == A_MAP] == [(A_MAP, a.data_ptr())]
    assert [c for c in encodings if c[0] == OUT_MAP] == [(OUT_MAP, o.data_ptr()) for o in kept]
    # The packed parameters hold the maps at their offsets (after two pointers: 64-aligned).
    params = fk.loaded_kernel.launches[-1][2]
    assert params[64:192] == (1).to_bytes(2, "little") * 64
    assert params[192:320] == (4).to_bytes(2, "little") * 64
    b = torch.randn(300, 192, dtype=torch.bfloat16)
    plan.run([b])
    assert (A_MAP, b.data_ptr()) in encodings


def test_a_misaligned_input_is_refused_before_launch(monkeypatch, encodings):
    fk = FakeKernel(_description(("tmap", A_SOURCE)))
    padded = torch.randn(300, 196, dtype=torch.bfloat16)[:, :192]     # rows 392 bytes apart
    with pytest.raises(ValueError) as error:
        _plan(_definition(contiguity=[False, True]), fk, [padded], monkeypatch)
    text = str(error.value)
    assert text.startswith("tiles: input 0 (T") and "sizes (300, 192), strides (196, 1)" in text
    assert "cannot be copied in tiles of 128 x 64 through a tensor map" in text
    assert "outer dim 0 stride 196 x 2 bytes is not a multiple of 16" in text
    shifted = torch.randn(300 * 192 + 1, dtype=torch.bfloat16)[1:].view(300, 192)
    with pytest.raises(ValueError, match="2-byte aligned, not 16"):
        _plan(_definition(), fk, [shifted], monkeypatch)
    # A column-major operand given to a kernel built to read it along dim 1.
    with pytest.raises(ValueError, match=r"inner dim 1 \(along a row\) has stride 300, not 1"):
        _plan(_definition(stride_order=[0, 1]), fk,
              [torch.randn(192, 300, dtype=torch.bfloat16).t()], monkeypatch)
    assert encodings == [] and fk.loaded_kernel.launches == []


def test_a_tile_map_over_an_output_dim_that_is_not_innermost_is_a_lowering_bug(monkeypatch,
                                                                                encodings):
    fd = _definition()
    across = ("tmap_tile", "output", 0, 0, 1, 64, 64, 128)     # dim 0 has stride 192, not 1
    fk = FakeKernel(_description(("tmap", across)))
    with pytest.raises(RuntimeError, match=r"stores output 0 through tensor map .* which its "
                                           r"allocation \(sizes \(300, 192\), strides \(192, 1\)\) "
                                           r"breaks: its inner dim 0 \(along a row\) has stride "
                                           "192"):
        _plan(fd, fk, [torch.randn(300, 192, dtype=torch.bfloat16)], monkeypatch)
