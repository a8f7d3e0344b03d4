"""TMA rules in plain Python (tiled tensor maps and 1D bulk copies), and encoding's guard rails."""

import pytest

from pyfuser.runtime.device import cuda_available
from pyfuser.runtime.tensor_map import (
    TensorMapError,
    check_bulk_copy,
    check_tma_tiled,
    encode_tiled,
)

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
