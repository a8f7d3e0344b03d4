"""Tensor-map (cp.async.bulk.tensor) loads in the TMA variants of the inner persistent scheduler.

With `tma_tensor_map`, a stage of bdimy whole rows is one box of a RowBoxMap, (inner, N / inner,
rows) innermost first, instead of bdimy 1D bulk copies. Checked here on a CPU: the rules
(which rows a box can copy), the lowered structure (one copy per stage, whole-box byte count, no
row predicate, 128-byte stage slots, the map parameter), the interpreter against the reference
for the pipelined and warp-specialized kinds (it zero-fills rows past the tensor as the hardware
does, so a wrong coordinate or byte count fails), and NVRTC compiles with a clean ptxas report.
"""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kir_testing import compile_clean  # noqa: E402
from kir_testing import (InterpreterError, empty_inputs, interpret,  # noqa: E402
                         lowered_inner_persistent, reference, schedule_and_lower)
from pyfuser import DataType, FusionDefinition, catalogue, options  # noqa: E402
from pyfuser.codegen.cuda import generate_cuda  # noqa: E402
from pyfuser.kir import nodes as K  # noqa: E402
from pyfuser.lower import verify  # noqa: E402
from pyfuser.schedule.tma_rules import check_row_box, merged_rows  # noqa: E402

FORWARD = ["rmsnorm_fwd", "layernorm_fwd", "softmax", "log_softmax", "add_rmsnorm_fwd"]
TOL = dict(rtol=1e-5, atol=1e-5)
VARIANTS = {"tma": "tma_inner_persistent", "ws": "ws_inner_persistent"}


def lowered(name, M, N, variant="tma", dtype="fp32", **changes):
    with options.override(enable=["tma_tensor_map"]):
        out = lowered_inner_persistent(name, M, N, dtype, VARIANTS[variant], **changes)
    assert out[3].tensor_map, out[3].reason
    return out


def _copies(k):
    return [s for s in K.walk(k.body) if isinstance(s, K.TensorMapLoad)]


@pytest.mark.parametrize("n,elem,inner", [(1024, 2, 256), (1000, 2, 200), (5120, 2, 256),
                                          (40, 4, 40), (8, 2, 8), (12288, 4, 256),
                                          (65536, 2, 256), (1001, 4, None), (4, 2, None),
                                          (65536 * 2, 2, None)])
def test_row_box_split(n, elem, inner):
    got = K.RowBoxMap.inner_for(n, elem)
    assert got == inner
    if got:
        assert n % got == 0 and got <= 256 and n // got <= 256 and got * elem % 16 == 0


@pytest.mark.parametrize("sizes,strides,view", [
    ([4, 6, 8], [48, 8, 1], (24, 8)),             # contiguous: outer dims merge
    ([4, 6, 8], [96, 16, 1], (24, 16)),           # padded rows, still one stride
    ([4, 6, 8], [100, 16, 1], None),              # a gap between the outer dims
    ([1, 6, 8], [999, 16, 1], (6, 16)),           # a dim of size 1 merges with anything
    ([8], [1], (1, 8)),
])
def test_merged_rows(sizes, strides, view):
    assert merged_rows(sizes, strides) == view


@pytest.mark.parametrize("sizes,strides,align,elem,problem", [
    ([64, 1024], [1024, 1], 16, 2, None),
    ([64, 1024], [1024, 2], 16, 2, "not contiguous"),
    ([4, 6, 1024], [8000, 1024, 1], 16, 2, "do not merge"),
    ([64, 1000], [1004, 1], 16, 2, "row stride 1004 x 2 bytes"),
    ([64, 1024], [1024, 1], 8, 2, "8-byte aligned"),
    ([64, 1001], [1008, 1], 16, 4, "does not split"),
])
def test_row_box_rules(sizes, strides, align, elem, problem):
    got = check_row_box(sizes, strides, align, elem)
    if problem is None:
        assert got == []
    else:
        assert any(problem in p for p in got), got


def test_pipelined_structure():
    fd, inputs, st, p, k = lowered("rmsnorm_fwd", 100, 1000, "tma", "bf16", stages=3, grid=5)
    verify(k, after="launch_config")
    copies = _copies(k)
    # Prologue (2) and main loop (1); no 1D bulk copies left.
    assert len(copies) == 3 and not any(isinstance(s, K.BulkLoad) for s in K.walk(k.body))
    box_rows = p.bdimy
    for c in copies:
        assert c.map == K.RowBoxMap(0, 1000, 200, box_rows) and c.map.box == (200, 5, box_rows)
        # The whole box is expected, rows past the tensor included; one elected thread issues
        # it, with no row-bounds predicate.
        assert c.bytes == K.Const(box_rows * 1000 * 2)
        assert repr(c.predicate) == repr(K.and_(K.and_(
            K.eq(K.Special("threadIdx.x"), 0), K.eq(K.Special("threadIdx.y"), 0)),
            K.eq(K.Special("threadIdx.z"), 0)))
        assert [repr(x) for x in c.coords[:2]] == ["0", "0"]
    (param,) = [q for q in k.params if q.kind == "tmap"]
    assert param.source == ("tmap", copies[0].map) and k.tensor_maps == {param.name: copies[0].map}
    # Stage slots start on 128 bytes: box_rows x 2000 bytes rounded up.
    slot = -(-box_rows * 2000 // 128) * 128 // 2
    assert copies[1].dst.index == K.Const(slot)
    src = generate_cuda(k)
    assert "const __grid_constant__ pf::CUtensorMap T0_tmap" in src
    assert src.count("pf::tma_load_3d(") == 3 and "pf::bulk_copy_g2s(" not in src


@pytest.mark.parametrize("variant", ["tma", "ws"])
@pytest.mark.parametrize("name", FORWARD)
@pytest.mark.parametrize("M,N", [(1, 64), (37, 64), (100, 128)])
def test_interpreted_tensor_map_kernels_match_the_reference(variant, name, M, N):
    changes = dict(stages=3, grid=2) if variant == "tma" else dict(stages=2, grid=3, bdimy=16)
    fd, inputs, st, p, k = lowered(name, M, N, variant, **changes)
    assert _copies(k)
    outs, it = interpret(k, st.bindings, inputs)
    for o, r in zip(outs, reference(fd, inputs)):
        torch.testing.assert_close(o.double(), r.double(), **TOL)
    for j, _ in enumerate(fd.fusion.outputs):
        buf = next(q.name for q in k.params if q.source == ("output", j))
        counts = [c for (b, _), c in it.writes.items() if b == buf]
        assert set(counts) == {1} and len(counts) == reference(fd, inputs)[j].numel()


def test_a_stage_of_over_256_rows_is_several_boxes():
    # Rows of 8 fp32 (one thread each): 16 x 32 = 512 rows per stage, two boxes of 256.
    fd, inputs, st, p, k = lowered("softmax", 1100, 8, "tma", bdimy=512, stages=2, grid=2)
    copies = _copies(k)
    # Prologue (one stage) and main loop (one stage): two boxes each.
    assert {c.map.box for c in copies} == {(8, 1, 256)} and len(copies) == 2 * 2
    first = copies[:2]
    assert [c.dst.index for c in first] == [K.Const(0), K.Const(256 * 8)]
    assert repr(first[1].coords[2]) == repr(K.add(first[0].coords[2], 256))
    outs, _ = interpret(k, st.bindings, inputs)
    torch.testing.assert_close(outs[0].double(), reference(fd, inputs)[0].double(), **TOL)


def test_padded_rows_are_copied_through_their_stride():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=[False, True], dtype=DataType.Float)
        e = fd.ops.exp(fd.ops.sub(x, fd.ops.max(x, [1], keepdim=True)))
        fd.add_output(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)))
    wide = torch.randn(19, 48, dtype=torch.float32)
    inputs = [wide[:, 4:44]]            # rows of 40 at a stride of 48 (192 bytes)
    with options.override(enable=["tma_inner_persistent", "tma_tensor_map"]):
        st, _, p, k = schedule_and_lower(fd, inputs)
    assert p.tensor_map and p.tma_inputs == (0,), p.reason
    outs, _ = interpret(k, st.bindings, inputs)
    torch.testing.assert_close(outs[0].double(), reference(fd, inputs)[0].double(), **TOL)


def test_a_wrong_row_coordinate_is_caught():
    fd, inputs, st, p, k = lowered("softmax", 37, 64, "tma", stages=2, grid=2)
    for c in _copies(k):
        c.coords[2] = K.add(c.coords[2], 1)        # every stage one row late
    outs, _ = interpret(k, st.bindings, inputs)
    assert not torch.allclose(outs[0].double(), reference(fd, inputs)[0].double(), **TOL)


def test_a_short_byte_count_is_caught():
    fd, inputs, st, p, k = lowered("softmax", 37, 64, "tma", stages=2, grid=2)
    for c in _copies(k):
        c.bytes = K.Const(c.bytes.value - 16)
    with pytest.raises(InterpreterError, match="expects"):
        interpret(k, st.bindings, inputs)


def test_rows_a_box_cannot_copy_fall_back_and_say_why():
    """fp32 rows of 1001 (4004 bytes) have no box split: the pipelined variant copies them with
    cp.async, the warp-specialized one keeps register rows; both name the rule."""
    fd = catalogue.define("rmsnorm_fwd", "fp32")
    inputs = catalogue.make_inputs("rmsnorm_fwd", 64, 1001, "fp32", seed=0)
    with options.override(enable=["tma_inner_persistent", "tma_tensor_map"]):
        st, _, p, k = schedule_and_lower(fd, inputs)
    assert p.cp_async_inputs and not p.tma_inputs and "does not split" in p.reason, p.reason
    assert not _copies(k)
    with options.override(enable=["ws_inner_persistent", "tma_tensor_map"]):
        st, _, p, k = schedule_and_lower(fd, inputs)
    assert p.stages == 0 and "does not split" in p.reason, p.reason
    assert not _copies(k)


@pytest.mark.parametrize("variant", ["tma", "ws"])
@pytest.mark.parametrize("name", FORWARD)
@pytest.mark.parametrize("M,N", [(16384, 1024), (16384, 4096), (7, 5120), (2000, 12288)])
def test_tensor_map_kernels_compile_clean(variant, name, M, N):
    fd = catalogue.define(name, "bf16")
    inputs = empty_inputs(name, M, N)
    with options.override(enable=[VARIANTS[variant], "tma_tensor_map"]):
        st, _, p, k = schedule_and_lower(fd, inputs, alignment=16)
    assert p.tensor_map and p.stages >= 2 and p.warp_specialized == (variant == "ws"), p.reason
    src = generate_cuda(k)
    assert "pf::tma_load_3d(" in src and "pf::bulk_copy_g2s(" not in src
    compile_clean(src)
