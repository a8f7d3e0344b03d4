"""TMA tensor maps: check the hardware's rules in plain Python, and encode descriptors.

Why check in Python first: ``cuTensorMapEncodeTiled`` answers every violated rule with the same
CUDA_ERROR_INVALID_VALUE, and it needs a GPU driver. Schedulers must decide on a CPU whether a
tensor may use TMA at all (alignment of the data pointer, strides, box sizes), so the rules live
here as a function returning readable reasons, and ``encode_tiled`` runs the same function
before calling the driver.

Dimensions are innermost first, as the driver wants them (a row-major [rows, cols] matrix is
``global_dims=(cols, rows)``).
"""

from __future__ import annotations

import ctypes

from ..kir.nodes import TENSOR_MAP_SMEM_ALIGN
from ..schedule.tma_rules import (
    GLOBAL_ALIGN,
    MAX_GLOBAL_STRIDE,
    check_row_box,
    check_tile_box,
    merged_rows,
    on_sectors,
)
from . import cuda_driver as cu
from .cuda_driver import DriverError, result_name
from .device import init_driver

__all__ = [
    "TensorMapError",
    "TENSOR_MAP_BYTES",
    "TENSOR_MAP_ALIGN",
    "check_tma_tiled",
    "check_bulk_copy",
    "encode_tiled",
    "encode_row_box",
    "row_box_problems",
    "encode_tile_box",
    "tile_box_problems",
]

TENSOR_MAP_BYTES = 128
TENSOR_MAP_ALIGN = 64
MAX_RANK = 5
MAX_BOX = 256
MAX_ELEMENT_STRIDE = 8
MAX_GLOBAL_DIM = 2**32
SMEM_ALIGN = TENSOR_MAP_SMEM_ALIGN
SWIZZLE_SPANS = (0, 32, 64, 128)


class TensorMapError(DriverError, ValueError):
    """A tensor map cannot be built; the message lists every rule the request breaks."""


def _rank_problems(rank: int, *lists: tuple[str, list | None]) -> list[str]:
    problems = []
    if not 1 <= rank <= MAX_RANK:
        problems.append(f"rank {rank} is outside 1..{MAX_RANK}")
    for name, values in lists:
        if values is not None and len(values) != rank:
            problems.append(f"{name} has {len(values)} entries, expected {rank} (one per dim)")
    return problems


def _outer_strides(dtype_bytes: int, rank: int, strides: list[int]) -> tuple[list[int], list[str]]:
    """Accept strides for all dims (innermost must then equal the element size) or for the
    rank-1 outer dims only, as the driver takes them."""
    if rank == 0:
        return [], []  # reported as a rank problem
    if len(strides) == rank:
        if strides[0] != dtype_bytes:
            return list(strides[1:]), [
                f"innermost stride is {strides[0]} bytes; TMA needs the innermost dim "
                f"contiguous (stride = element size {dtype_bytes})"
            ]
        return list(strides[1:]), []
    if len(strides) == rank - 1:
        return list(strides), []
    return [], [f"global_strides_bytes has {len(strides)} entries, expected {rank - 1} or {rank}"]


def _dim_problems(dims: list[int]) -> list[str]:
    return [
        f"global dim {i} is {d}; it must be in 1..2^32"
        for i, d in enumerate(dims)
        if not 1 <= d <= MAX_GLOBAL_DIM
    ]


def _stride_problems(outer: list[int]) -> list[str]:
    problems = []
    for i, stride in enumerate(outer, start=1):
        if stride % GLOBAL_ALIGN:
            problems.append(f"stride of dim {i} is {stride} bytes, not a multiple of 16")
        if not 0 < stride < MAX_GLOBAL_STRIDE:
            problems.append(f"stride of dim {i} is {stride} bytes; it must be in 1..2^40-1")
    return problems


def _box_problems(dtype_bytes: int, box: list[int], swizzle_bytes: int) -> list[str]:
    problems = [
        f"box dim {i} is {b}; it must be in 1..{MAX_BOX}"
        for i, b in enumerate(box)
        if not 1 <= b <= MAX_BOX
    ]
    inner_bytes = box[0] * dtype_bytes if box else 0
    if box and inner_bytes % 16:
        problems.append(
            f"inner box dim is {inner_bytes} bytes ({box[0]} x {dtype_bytes}), "
            "not a multiple of 16"
        )
    if swizzle_bytes not in SWIZZLE_SPANS:
        problems.append(f"swizzle {swizzle_bytes} is not one of {SWIZZLE_SPANS} bytes")
    elif swizzle_bytes and inner_bytes > swizzle_bytes:
        problems.append(
            f"inner box dim is {inner_bytes} bytes, wider than the {swizzle_bytes}-byte swizzle"
        )
    return problems


def _element_stride_problems(element_strides: list[int] | None) -> list[str]:
    return [
        f"element stride {i} is {s}; it must be in 1..{MAX_ELEMENT_STRIDE}"
        for i, s in enumerate(element_strides or ())
        if not 1 <= s <= MAX_ELEMENT_STRIDE
    ]


def _smem_problems(smem_alignment: int | None, swizzle_bytes: int) -> list[str]:
    if smem_alignment is None:
        return []
    problems = []
    if smem_alignment % SMEM_ALIGN:
        problems.append(
            f"shared-memory destination aligned to {smem_alignment} bytes; TMA needs {SMEM_ALIGN}"
        )
    # The swizzle pattern repeats every 8 rows of the swizzle span and is computed from address
    # bits, so our consumers' index math holds only if the buffer starts on that period.
    period = 8 * swizzle_bytes
    if swizzle_bytes in SWIZZLE_SPANS and period and smem_alignment % period:
        problems.append(
            f"shared-memory destination aligned to {smem_alignment} bytes; the "
            f"{swizzle_bytes}-byte swizzle pattern repeats every {period} bytes"
        )
    return problems


def check_tma_tiled(
    dtype_bytes: int,
    global_dims,
    global_strides_bytes,
    box_dims,
    element_strides=None,
    *,
    global_address: int = 0,
    smem_alignment: int | None = None,
    swizzle_bytes: int = 0,
) -> list[str]:
    """Every rule of a tiled TMA copy that the request breaks, in words; empty means allowed.

    ``global_strides_bytes`` may list all dims (the innermost must equal ``dtype_bytes``) or
    only the outer ``rank - 1``. ``smem_alignment``, when given, is the alignment the kernel
    guarantees for the shared-memory box (128 bytes at least; the swizzle period for swizzled
    boxes, because our consumers index relative to the buffer start).
    """
    dims, box = list(global_dims), list(box_dims)
    strides = list(global_strides_bytes)
    estrides = None if element_strides is None else list(element_strides)
    rank = len(dims)
    problems = _rank_problems(rank, ("box_dims", box), ("element_strides", estrides))
    if global_address % GLOBAL_ALIGN:
        problems.append(f"global address {global_address:#x} is not 16-byte aligned")
    outer, stride_shape = _outer_strides(dtype_bytes, rank, strides)
    problems += stride_shape + _dim_problems(dims) + _stride_problems(outer)
    problems += _box_problems(dtype_bytes, box, swizzle_bytes)
    problems += _element_stride_problems(estrides)
    problems += _smem_problems(smem_alignment, swizzle_bytes)
    return problems


def check_bulk_copy(src_addr: int, dst_smem_offset: int, nbytes: int) -> list[str]:
    """Rules of a 1D ``cp.async.bulk`` copy: size and both addresses multiples of 16 bytes."""
    problems = []
    if nbytes <= 0 or nbytes % 16:
        problems.append(f"copy size {nbytes} bytes is not a positive multiple of 16")
    if src_addr % 16:
        problems.append(f"source address {src_addr:#x} is not 16-byte aligned")
    if dst_smem_offset % 16:
        problems.append(f"shared-memory destination {dst_smem_offset:#x} is not 16-byte aligned")
    return problems


# ---------------------------------------------------------------------------------------------
# Encoding (needs the driver)
# ---------------------------------------------------------------------------------------------

_DTYPE_BY_NAME = {
    "float32": ("FLOAT32", 4),
    "float": ("FLOAT32", 4),
    "float16": ("FLOAT16", 2),
    "half": ("FLOAT16", 2),
    "bfloat16": ("BFLOAT16", 2),
    "float64": ("FLOAT64", 8),
    "double": ("FLOAT64", 8),
    "int32": ("INT32", 4),
    "int": ("INT32", 4),
    "uint32": ("UINT32", 4),
    "int64": ("INT64", 8),
    "long": ("INT64", 8),
    "uint64": ("UINT64", 8),
    "int16": ("UINT16", 2),
    "uint16": ("UINT16", 2),
    "int8": ("UINT8", 1),
    "uint8": ("UINT8", 1),
    "bool": ("UINT8", 1),
    "float8_e4m3fn": ("UINT8", 1),
    "float8_e5m2": ("UINT8", 1),
}
_FLOAT_KINDS = ("FLOAT32", "FLOAT16", "BFLOAT16", "FLOAT64")


def _dtype_info(dtype) -> tuple[str, int]:
    """(CUtensorMapDataType suffix, element bytes) for a torch dtype or a dtype name. Integer
    types without a signed TMA kind copy as unsigned bits, which is exact for a copy."""
    name = str(dtype).replace("torch.", "").lower()
    if name not in _DTYPE_BY_NAME:
        raise TensorMapError(f"no TMA data type for {dtype!r}")
    return _DTYPE_BY_NAME[name]


def _swizzle_enum(swizzle_bytes: int) -> int:
    return cu.TENSOR_MAP_SWIZZLE[{0: "NONE", 32: "32B", 64: "64B", 128: "128B"}[swizzle_bytes]]


def _l2_enum(l2_promotion: int) -> int:
    suffixes = {0: "NONE", 64: "L2_64B", 128: "L2_128B", 256: "L2_256B"}
    if l2_promotion not in suffixes:
        raise TensorMapError(f"l2_promotion must be one of {sorted(suffixes)} bytes")
    return cu.TENSOR_MAP_L2_PROMOTION[suffixes[l2_promotion]]


def _oob_enum(oob_fill: str, kind: str) -> int:
    if oob_fill == "zero":
        return cu.TENSOR_MAP_FLOAT_OOB_FILL["NONE"]
    if oob_fill == "nan" and kind in _FLOAT_KINDS:
        return cu.TENSOR_MAP_FLOAT_OOB_FILL["NAN_REQUEST_ZERO_FMA"]
    raise TensorMapError(f"oob_fill must be 'zero', or 'nan' for a float type; got {oob_fill!r}")


def _require_driver() -> None:
    try:
        init_driver()
    except Exception as error:  # no driver library, or cuInit failed (no device)
        raise TensorMapError(
            f"encoding a TMA tensor map needs the CUDA driver (a GPU machine): {error}"
        ) from error


# The driver's entry point through ctypes (cuda_driver.py). Why not cuda.bindings' wrapper: it
# encodes into a CUtensorMap embedded in a Python object, which CPython aligns to 16 bytes only,
# while the driver requires a 64-byte-aligned descriptor (see NVIDIA/cuda-python PR 1692).
def _encode_entry_point():
    try:
        return cu.function("cuTensorMapEncodeTiled")
    except DriverError as error:
        raise TensorMapError(str(error)) from error


def _aligned_map_buffer():
    """A ctypes buffer and the address inside it of 128 bytes aligned to 128 (the alignment
    CUDA 13 headers give CUtensorMap; 64 is the documented minimum)."""
    buffer = (ctypes.c_char * (2 * TENSOR_MAP_BYTES))()
    base = ctypes.addressof(buffer)
    return buffer, base + (-base % TENSOR_MAP_BYTES)


def _array(ctype, values):
    return (ctype * max(len(values), 1))(*values)


def encode_tiled(
    data_ptr: int,
    dtype,
    global_dims,
    global_strides_bytes,
    box_dims,
    *,
    element_strides=None,
    swizzle: int = 0,
    l2_promotion: int = 128,
    oob_fill: str = "zero",
    smem_alignment: int | None = None,
) -> bytes:
    """The 128-byte CUtensorMap for a tiled TMA copy, to pass as a 'tmap' kernel parameter.

    ``swizzle`` and ``l2_promotion`` are in bytes; ``oob_fill`` is 'zero' or 'nan'.
    Out-of-bounds elements of a box read as the fill value and are not written on stores.
    """
    kind, dtype_bytes = _dtype_info(dtype)
    dims = [int(d) for d in global_dims]
    estrides = [1] * len(dims) if element_strides is None else [int(s) for s in element_strides]
    problems = check_tma_tiled(
        dtype_bytes, dims, global_strides_bytes, box_dims, estrides,
        global_address=data_ptr, smem_alignment=smem_alignment, swizzle_bytes=swizzle,
    )
    if problems:
        raise TensorMapError("cannot build a TMA tensor map: " + "; ".join(problems))
    outer, _ = _outer_strides(dtype_bytes, len(dims), list(global_strides_bytes))
    _require_driver()
    enums = (
        cu.TENSOR_MAP_DATA_TYPE[kind],
        cu.TENSOR_MAP_INTERLEAVE_NONE,
        _swizzle_enum(swizzle),
        _l2_enum(l2_promotion),
        _oob_enum(oob_fill, kind),
    )
    return _encode(enums, int(data_ptr), dims, outer, [int(b) for b in box_dims], estrides)


def _encode(enums, data_ptr, dims, outer, box, estrides) -> bytes:
    dtype_enum, interleave, swizzle, l2, oob = enums
    buffer, address = _aligned_map_buffer()
    code = _encode_entry_point()(
        address, dtype_enum, len(dims), data_ptr,
        _array(ctypes.c_uint64, dims), _array(ctypes.c_uint64, outer),
        _array(ctypes.c_uint32, box), _array(ctypes.c_uint32, estrides),
        interleave, swizzle, l2, oob,
    )
    if code != 0:
        raise TensorMapError(
            f"cuTensorMapEncodeTiled failed with {result_name(code)} (dims {dims}, strides "
            f"{outer}, box {box}, address {data_ptr:#x})"
        )
    data = ctypes.string_at(address, TENSOR_MAP_BYTES)
    del buffer  # the descriptor lives in it until it has been copied out
    return data


def _pointer_alignment(ptr: int) -> int:
    """The largest power-of-two divisor of a data pointer (a null one: any alignment)."""
    return ptr & -ptr if ptr else 1 << 62


def row_box_problems(tensor, row_map) -> list[str]:
    """Why the rows of `tensor` (a torch tensor) cannot be copied with kir.RowBoxMap `row_map`:
    the rules of schedule/tma_rules.check_row_box, and the row length the kernel was built for."""
    sizes = list(tensor.shape)
    problems = check_row_box(sizes, list(tensor.stride()), _pointer_alignment(tensor.data_ptr()),
                             tensor.element_size())
    if sizes and sizes[-1] != row_map.row_elements:
        problems.append(f"its rows have {sizes[-1]} elements; the kernel was built for "
                        f"{row_map.row_elements}")
    return problems


def encode_row_box(tensor, row_map) -> bytes:
    """The tensor map of a kir.RowBoxMap over `tensor` (a torch tensor): its rows viewed as
    (inner, N / inner, rows), innermost first, so one box is `box_rows` whole rows. The rows'
    rules (`row_box_problems`) are checked first, with readable reasons."""
    problems = row_box_problems(tensor, row_map)
    if problems:
        raise TensorMapError("cannot copy whole rows with a tensor map: " + "; ".join(problems))
    item = tensor.element_size()
    rows, row_stride = merged_rows(list(tensor.shape), list(tensor.stride()))
    inner, n = row_map.inner, row_map.row_elements
    return encode_tiled(tensor.data_ptr(), tensor.dtype, (inner, n // inner, max(rows, 1)),
                        (inner * item, row_stride * item), row_map.box)


def tile_box_problems(tensor, tile_map) -> list[str]:
    """Why `tensor` (a torch tensor) cannot be copied in tiles with kir.TileBoxMap `tile_map`:
    the rules of schedule/tma_rules.check_tile_box, in words (empty: it can)."""
    return tile_layout_problems(list(tensor.shape), list(tensor.stride()),
                                _pointer_alignment(tensor.data_ptr()), tensor.element_size(),
                                tile_map)


# torch's allocations start on at least this many bytes: an output the executor allocates.
ALLOCATION_ALIGN = 256


def tile_layout_problems(sizes, strides, alignment: int, item_bytes: int, tile_map) -> list[str]:
    """check_tile_box of `tile_map` over a tensor of these sizes and strides (elements), its
    pointer `alignment`-byte aligned: for a torch tensor (`tile_box_problems`) or an output the
    executor will allocate (aligned to ALLOCATION_ALIGN), which the interpreter checks too."""
    return check_tile_box(list(sizes), list(strides), alignment, item_bytes, tile_map.inner,
                          tile_map.outer, tile_map.box_cols, tile_map.box_rows,
                          tile_map.swizzle, tile_map.batch)


# L2 promotion of tile maps: 256 bytes where every row starts on a 32-byte sector, 128 where
# rows start mid-sector (a row pitch of 16 mod 32 bytes: K = 8 mod 16 in 16-bit elements). A
# matmul at 3000x2056xK, tile 128x192 on the H200 (bench/results/2026-11-29/
# h200-matmul-k-alignment-session15.txt): K = 1032 and 1048 (rows 16 mod 32 bytes) 37.4 and
# 37.5 us with 256, 32.7 and 32.9 with 128, 33.8 and 33.0 with none; K = 1040 (rows on sectors)
# 26.3 with 256, 26.7 with 128 (cuBLAS 26-27 us for all three).
TILE_L2_PROMOTION = 256
TILE_L2_PROMOTION_MID_SECTOR = 128


def tile_l2_promotion(pointer: int, outer_strides) -> int:
    """The L2 promotion of a tile map whose rows start at `pointer` plus multiples of
    `outer_strides` (bytes): TILE_L2_PROMOTION where every row starts on a sector, else
    TILE_L2_PROMOTION_MID_SECTOR."""
    return (TILE_L2_PROMOTION if on_sectors((pointer, *outer_strides))
            else TILE_L2_PROMOTION_MID_SECTOR)


def encode_tile_box(tensor, tile_map) -> bytes:
    """The tensor map of a kir.TileBoxMap over `tensor` (a torch tensor): 2D, innermost first
    (size[inner], size[outer], then its batch dims innermost first), the rows `stride[outer]`
    elements apart, boxes of (box_cols,
    box_rows) under the 128-byte swizzle, element strides 1, no interleave, 256-byte L2
    promotion (128 where rows start mid-sector: tile_l2_promotion), elements outside the tensor
    read as zeros (and not written by stores). The rules (`tile_box_problems`) are checked
    first, with readable reasons."""
    problems = tile_box_problems(tensor, tile_map)
    if problems:
        raise TensorMapError("cannot copy tiles with a tensor map: " + "; ".join(problems))
    item = tensor.element_size()
    sizes, strides = tensor.shape, tensor.stride()
    cols, rows = int(sizes[tile_map.inner]), int(sizes[tile_map.outer])
    # A single row has no stride to keep: any legal one does (the row's bytes, rounded to 16).
    row_stride = (strides[tile_map.outer] * item if rows > 1
                  else -(-cols * item // GLOBAL_ALIGN) * GLOBAL_ALIGN)
    dims, outer_strides = (cols, rows), (row_stride,)
    # A batch of matrices: its dims (outermost first) are the map's dims 2.., innermost first.
    # A batch dim of one matrix has no stride to keep: the one past the dims inside it.
    for d in reversed(tile_map.batch):
        batches = int(sizes[d])
        span = outer_strides[-1] * dims[-1]
        dims += (batches,)
        outer_strides += (strides[d] * item if batches > 1 else span,)
    pointer = tensor.data_ptr()
    return encode_tiled(pointer, tensor.dtype, dims, outer_strides,
                        tile_map.box, element_strides=(1,) * len(dims), swizzle=tile_map.swizzle,
                        l2_promotion=tile_l2_promotion(pointer, outer_strides), oob_fill="zero")
