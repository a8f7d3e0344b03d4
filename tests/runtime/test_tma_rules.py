"""TMA rules in plain Python (tiled tensor maps, 1D bulk copies, and the 2D tile maps of
matmul operands), and encoding's guard rails."""

import pytest
import torch

from pyfuser.kir.nodes import TileBoxMap
from pyfuser.runtime.device import cuda_available
from pyfuser.runtime.tensor_map import (
    TensorMapError,
    check_bulk_copy,
    check_tma_tiled,
    encode_tile_box,
    encode_tiled,
    tile_box_problems,
)
from pyfuser.schedule.tma_rules import check_tile_box

# A row-major float32 matrix of 128 rows x 256 columns, as TMA sees it (innermost first).
F32 = 4
DIMS = (256, 128)
STRIDES = (F32, 256 * F32)
BOX = (32, 8)


def _one(problems, words):
    assert len(problems) == 1, problems
    assert words in problems[0], problems[0]


def test_valid_requests():
    assert check_tma_tiled(F32, DIMS, STRIDES, BOX) == []
    assert check_tma_tiled(F32, DIMS, STRIDES[1:], BOX) == [], "driver-style outer strides"
    assert check_tma_tiled(2, (64,), (2,), (64,), global_address=0x7F00_0000_0010) == []
    five_d = check_tma_tiled(2, (8, 4, 4, 4, 4), (2, 16, 64, 256, 1024), (8, 1, 1, 1, 1))
    assert five_d == []
    swizzled = check_tma_tiled(2, (64, 64), (2, 128), (64, 64), swizzle_bytes=128,
                               smem_alignment=1024)
    assert swizzled == []


def test_global_address_alignment():
    _one(check_tma_tiled(F32, DIMS, STRIDES, BOX, global_address=0x1008), "16-byte aligned")


@pytest.mark.parametrize("rank", [0, 6])
def test_rank(rank):
    problems = check_tma_tiled(F32, (16,) * rank, (F32,) + (64,) * (rank - 1) if rank else (),
                               (4,) * rank)
    assert any("rank" in p for p in problems), problems


@pytest.mark.parametrize("dim", [0, 2**32 + 1])
def test_global_dims(dim):
    _one(check_tma_tiled(F32, (256, dim), STRIDES, BOX), "global dim 1")


def test_largest_global_dim_is_allowed():
    assert check_tma_tiled(1, (16, 2**32), (1, 16), (16, 1)) == []


def test_outer_stride_multiple_of_16():
    # 3 float32 columns: rows are 12 bytes apart, which TMA cannot address.
    _one(check_tma_tiled(F32, (3, 10), (F32, 12), (4, 2)), "not a multiple of 16")


def test_outer_stride_below_2_pow_40():
    _one(check_tma_tiled(F32, DIMS, (F32, 2**40), BOX), "2^40")


def test_innermost_dim_must_be_contiguous():
    _one(check_tma_tiled(F32, DIMS, (8, 1024), BOX), "contiguous")


def test_stride_count():
    _one(check_tma_tiled(F32, DIMS, (F32, 1024, 4096), BOX), "expected 1 or 2")


@pytest.mark.parametrize("box", [(32, 0), (32, 257)])
def test_box_dims_in_range(box):
    _one(check_tma_tiled(F32, DIMS, STRIDES, box), "box dim 1")


def test_inner_box_bytes_multiple_of_16():
    _one(check_tma_tiled(2, (64, 64), (2, 128), (4, 8)), "inner box dim is 8 bytes")


def test_box_and_element_strides_need_one_entry_per_dim():
    problems = check_tma_tiled(F32, DIMS, STRIDES, (32,), element_strides=(1, 1, 1))
    assert len(problems) == 2 and all("entries" in p for p in problems), problems


@pytest.mark.parametrize("stride", [0, 9])
def test_element_strides_in_range(stride):
    _one(check_tma_tiled(F32, DIMS, STRIDES, BOX, element_strides=(1, stride)),
         "element stride 1")


def test_swizzle_span_bounds_the_inner_box():
    _one(check_tma_tiled(2, (128, 64), (2, 256), (64, 8), swizzle_bytes=64), "wider than")
    _one(check_tma_tiled(2, (128, 64), (2, 256), (64, 8), swizzle_bytes=48), "not one of")


def test_shared_memory_alignment():
    _one(check_tma_tiled(F32, DIMS, STRIDES, BOX, smem_alignment=64), "TMA needs 128")
    _one(check_tma_tiled(2, (64, 64), (2, 128), (64, 8), swizzle_bytes=128, smem_alignment=128),
         "repeats every 1024 bytes")


def test_several_problems_are_all_reported():
    problems = check_tma_tiled(F32, (0, 10), (F32, 12), (0, 300), global_address=3)
    assert len(problems) >= 5, problems


def test_bulk_copy_rules():
    assert check_bulk_copy(0x1000, 0x400, 8192) == []
    _one(check_bulk_copy(0x1000, 0x400, 100), "not a positive multiple of 16")
    _one(check_bulk_copy(0x1000, 0x400, 0), "not a positive multiple of 16")
    _one(check_bulk_copy(0x1004, 0x400, 64), "source address")
    _one(check_bulk_copy(0x1000, 0x408, 64), "shared-memory destination")


def test_encode_rejects_bad_requests_before_touching_the_driver():
    with pytest.raises(TensorMapError, match="not 16-byte aligned"):
        encode_tiled(0x1004, "float32", DIMS, STRIDES, BOX)
    with pytest.raises(TensorMapError, match="no TMA data type"):
        encode_tiled(0x1000, "complex64", DIMS, STRIDES, BOX)


@pytest.mark.skipif(cuda_available(), reason="checks the error raised without a GPU driver")
def test_encode_without_driver_says_so():
    from pyfuser.runtime import cuda_driver
    try:
        cuda_driver.call("cuInit", 0)
    except cuda_driver.DriverError:
        pass
    else:
        pytest.skip("a CUDA driver library is present")
    with pytest.raises(TensorMapError, match="needs the CUDA driver"):
        encode_tiled(0x1000, "float32", DIMS, STRIDES, BOX)


# 2D tile maps (kir.TileBoxMap): a matmul's operands and outputs ---------------------------------
BF16 = 2
# A row-major bf16 [300, 192] operand: dim 1 along a row (stride 1), dim 0 counts rows; boxes of
# 128 rows of 64 elements (128 bytes: the swizzle span).
TILE = dict(inner=1, outer=0, box_cols=64, box_rows=128, swizzle=128)


def _tile(sizes=(300, 192), strides=(192, 1), alignment=16, dtype_bytes=BF16, **changes):
    return check_tile_box(list(sizes), list(strides), alignment, dtype_bytes,
                          **dict(TILE, **changes))


def test_tile_box_accepts_operands_either_way_round():
    assert _tile() == []
    # The transposed view (a K-major operand read along dim 0): inner 0, outer 1.
    assert _tile((192, 300), (1, 192), inner=0, outer=1) == []
    # Padded rows, fp32 with 32-element box rows, one row or one column.
    assert _tile((300, 192), (200, 1)) == []
    assert _tile(dtype_bytes=4, box_cols=32) == []
    assert _tile((1, 192), (7, 1)) == [], "a single row has no stride to keep"
    assert _tile((300, 1), (8, 3)) == [], "a single column has no inner stride to keep"
    assert _tile((2**31 - 1, 64), (64, 1)) == []


@pytest.mark.parametrize("case,words", [
    (dict(sizes=(4, 300, 192), strides=(57600, 192, 1)), "2-dim tensors here (0 batch dims), this one has 3"),
    (dict(sizes=(192,), strides=(1,)), "this one has 1 dims"),
    (dict(inner=1, outer=1), "are not the tensor's 2 dims"),
    (dict(inner=2, outer=0), "are not the tensor's 2 dims"),
    (dict(strides=(192, 2)), "inner dim 1 (along a row) has stride 2, not 1"),
    (dict(sizes=(192, 300), strides=(2, 384), inner=0, outer=1), "inner dim 0 (along a row) "
                                                                  "has stride 2"),
    (dict(sizes=(300, 1), strides=(1, 1)), "outer dim 0 stride 1 x 2 bytes"),
    (dict(strides=(196, 1)), "outer dim 0 stride 196 x 2 bytes is not a multiple of 16"),
    (dict(strides=(0, 1)), "outer dim 0 has stride 0"),
    (dict(strides=(2**39, 1)), "not below 2^40"),
    (dict(alignment=8), "8-byte aligned, not 16"),
    (dict(sizes=(0, 192)), "outer dim 0 has 0 elements"),
    (dict(sizes=(300, 2**31), strides=(2**31, 1)), "inner dim 1 has 2147483648 elements"),
    (dict(sizes=(2**32, 64), strides=(64, 1)), "int32 coordinates"),
    (dict(box_rows=0), "box_rows 0 is outside 1..256"),
    (dict(box_rows=257), "box_rows 257 is outside 1..256"),
    (dict(box_cols=32), "a box row of 32 x 2 bytes is not the 128-byte swizzle span"),
    (dict(dtype_bytes=4), "a box row of 64 x 4 bytes"),
    (dict(swizzle=64), "swizzle 64 bytes: a tile map uses the 128-byte swizzle only"),
])
def test_each_tile_box_rule_says_what_breaks_it(case, words):
    problems = _tile(**case)
    assert len(problems) == 1, problems
    assert words in problems[0], problems[0]


def test_box_cols_past_256_break_the_swizzle_span_too():
    assert _tile(box_cols=300) == [
        "box_cols 300 is outside 1..256",
        "a box row of 300 x 2 bytes is not the 128-byte swizzle span (box_cols x element bytes "
        "must equal it)"]


def test_tile_box_reports_every_problem():
    problems = _tile((300, 192), (196, 2), alignment=4, box_rows=300, box_cols=16)
    assert len(problems) == 5, problems


def test_tile_box_problems_read_a_torch_tensor():
    m = TileBoxMap("input", 0, **TILE)
    x = torch.empty(300, 192, dtype=torch.bfloat16)
    assert tile_box_problems(x, m) == []
    assert tile_box_problems(x.t(), TileBoxMap("input", 0, 0, 1, 64, 128)) == []
    odd = torch.empty(300 * 192 + 1, dtype=torch.bfloat16)[1:].view(300, 192)
    assert any("2-byte aligned" in p for p in tile_box_problems(odd, m))
    assert any("stride 192, not 1" in p for p in tile_box_problems(x.t(), m))


def test_encode_tile_box_refuses_before_touching_the_driver():
    x = torch.empty(300, 196, dtype=torch.bfloat16)[:, :192]
    with pytest.raises(TensorMapError, match="cannot copy tiles with a tensor map: .*196 x 2 "
                                             "bytes is not a multiple of 16"):
        encode_tile_box(x, TileBoxMap("input", 0, **TILE))


def _hopper_or_newer() -> bool:
    return cuda_available() and torch.cuda.get_device_capability(0)[0] >= 9


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper_or_newer(), reason="needs a Hopper (sm_90+) GPU")
def test_encode_tile_box_on_the_gpu():
    """The driver accepts the maps the rules accept: a bf16 [300, 192] operand row-major and
    transposed (box rows past the 300 rows are zero-filled), a single row, and a padded one."""
    x = torch.randn(300, 192, dtype=torch.bfloat16, device="cuda")
    maps = [(x, TileBoxMap("input", 0, **TILE)),
            (x.t(), TileBoxMap("input", 1, 0, 1, 64, 256)),
            (x[:1], TileBoxMap("output", 0, 1, 0, 64, 64)),
            (torch.empty(300, 200, dtype=torch.bfloat16, device="cuda")[:, :192],
             TileBoxMap("input", 0, **TILE))]
    for t, m in maps:
        data = encode_tile_box(t, m)
        assert len(data) == 128 and any(data), m
    assert encode_tile_box(x, maps[0][1]) == encode_tile_box(x, maps[0][1])
    assert encode_tile_box(x, maps[0][1]) != encode_tile_box(x[1:], maps[0][1])


def test_tile_box_rules_of_several_batch_dims():
    """Batch dims of any strides (each a multiple of 16 bytes; one of size 1 keeps none), up to
    3 of them (a tensor map has 5 dims)."""
    from pyfuser.schedule.tma_rules import check_tile_box
    box = dict(alignment=16, dtype_bytes=2, inner=3, outer=2, box_cols=64, box_rows=64)
    heads = [2, 3, 100, 64]         # [B, S, H, D] seen as [B, H, S, D]: strides not nested
    assert check_tile_box(heads, [19200, 64, 192, 1], batch=(0, 1), **box) == []
    assert check_tile_box([2, 1, 100, 64], [6400, 7, 64, 1], batch=(0, 1), **box) == []
    bad = check_tile_box(heads, [19200, 68, 192, 1], batch=(0, 1), **box)
    assert len(bad) == 1 and "batch dim 1 stride 68" in bad[0], bad
    five = check_tile_box([2, 2, 2, 100, 64], [25600, 12800, 6400, 64, 1], batch=(0, 1, 2),
                          **dict(box, inner=4, outer=3))
    assert five == []
    six = check_tile_box([2] * 4 + [100, 64], [1] * 6, batch=(0, 1, 2, 3),
                         **dict(box, inner=5, outer=4))
    assert six == ["4 batch dims: a tensor map has at most 5 dims"], six
