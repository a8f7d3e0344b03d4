"""Rules of TMA copies that a scheduler checks on a CPU before choosing them: row-wise ones (1D
bulk, and tensor-map boxes of whole rows) and 2D tiles of a matrix (`check_tile_box`).

The tensor-map rules (boxes, swizzle, 2^40 strides) live in runtime/tensor_map.py beside the
encoder; these are the ones a row-wise `cp.async.bulk` load needs, read from the runtime facts
of an input (sizes, strides, pointer alignment), so a heuristic can fall back to plain vector
loads when one fails, and the executor can check a reused kernel's inputs before launch.
"""
from __future__ import annotations


SECTOR_BYTES = 32       # DRAM and L2 move 32-byte sectors (tile maps' L2 promotion, schedulers)

# Shared with the tensor-map rules of runtime/tensor_map.py.
GLOBAL_ALIGN = 16               # bytes: global addresses and strides of TMA copies
MAX_GLOBAL_STRIDE = 2**40       # bytes
# Tensor-map coordinates are signed 32-bit (cp.async.bulk.tensor): a tile map's extents stay
# below 2^31 so that every box start is addressable (the driver alone allows 2^32).
MAX_TILE_EXTENT = 2**31
MAX_BOX = 256
# The one swizzle a TileBoxMap uses (kir.nodes.swizzled_byte models it).
TILE_SWIZZLE_BYTES = 128
# The transaction count of one mbarrier phase is a 20-bit number: the bytes of one stage.
MAX_TX_BYTES = 2**20 - 1


def rows_start_mid_sector(sizes, strides, dtype_bytes: int) -> bool:
    """Whether some rows of a tensor start 16 bytes into a 32-byte sector: a stride (bytes) of a
    dim of more than one element, other than the stride-1 dim, that is not a multiple of
    SECTOR_BYTES (a bf16 matrix of K = 8 mod 16 columns). A 128-byte box row of such a tensor
    then spans two 128-byte lines: two L2 requests where an aligned row takes one (ncu, a
    matmul at 3000x2056x1032 on the H200: 3.3 M L2 read requests against 1.5 M at K = 1040,
    the L2 77% busy against 49%; bench/results/2026-12-01/h200-matmul-mid-sector-session33.txt).
    The data pointer is not looked at (a RuntimeInfo's alignment stops at 16 bytes): the
    strides decide it for every row after the first."""
    return not on_sectors(s * dtype_bytes for n, s in zip(sizes, strides) if n > 1 and s != 1)


def on_sectors(offsets) -> bool:
    """Whether every byte offset (a pointer, row strides) falls on a 32-byte sector: the rule of
    rows_start_mid_sector (heuristics, from strides) and of a tile map's L2 promotion
    (runtime/tensor_map.tile_l2_promotion, from its pointer and strides)."""
    return all(b % SECTOR_BYTES == 0 for b in offsets)


def check_bulk_rows(sizes, strides, alignment: int, dtype_bytes: int) -> list[str]:
    """Rules for copying each row (the innermost dim) of a tensor with one 1D bulk copy: the
    row contiguous, its bytes a multiple of 16, every row start 16-byte aligned (data pointer
    and outer strides), strides below 2^40 bytes. `alignment` is the data pointer's largest
    power-of-two divisor (bytes)."""
    problems = []
    if not sizes:
        return ["a 0-dim tensor has no rows"]
    if sizes[-1] != 1 and strides[-1] != 1:
        problems.append(f"its rows are not contiguous (innermost stride {strides[-1]})")
    row = sizes[-1] * dtype_bytes
    if row % 16:
        problems.append(f"a row of {sizes[-1]} elements is {row} bytes, not a multiple of 16")
    if alignment % GLOBAL_ALIGN:
        problems.append(f"its data pointer is {alignment}-byte aligned, not {GLOBAL_ALIGN}")
    for d, (n, st) in enumerate(zip(sizes[:-1], strides[:-1])):
        if n == 1:
            continue
        if (st * dtype_bytes) % GLOBAL_ALIGN:
            problems.append(f"dim {d} stride {st} x {dtype_bytes} bytes is not a multiple of "
                            f"{GLOBAL_ALIGN}")
        if st * dtype_bytes >= MAX_GLOBAL_STRIDE:
            problems.append(f"dim {d} stride {st * dtype_bytes} bytes is not below 2^40")
    return problems



def merged_rows(sizes, strides) -> tuple[int, int] | None:
    """(rows, row stride in elements) when the outer dims of a tensor (all but the innermost)
    merge into one dim of a single stride, else None. Dims of size 1 merge with anything."""
    rows, stride, span = 1, None, None
    for n, st in reversed(list(zip(sizes[:-1], strides[:-1]))):
        if n == 1:
            continue
        if stride is None:
            stride = st
        elif st != span:
            return None
        span = st * n
        rows *= n
    return rows, (stride if stride is not None else (sizes[-1] if sizes else 1))


def check_row_box(sizes, strides, alignment: int, dtype_bytes: int) -> list[str]:
    """Rules for copying whole rows with tensor-map boxes (a RowBoxMap):
    contiguous rows whose outer dims merge into one 16-byte-multiple stride, a 16-byte-aligned
    pointer, a row that splits into box pieces. (The lowering pads stage slots to 128 bytes and
    splits a stage of over 256 rows into several boxes.)"""
    if not sizes:
        return ["a 0-dim tensor has no rows"]
    problems = []
    n = sizes[-1]
    if n != 1 and strides[-1] != 1:
        problems.append(f"its rows are not contiguous (innermost stride {strides[-1]})")
    view = merged_rows(sizes, strides)
    if view is None:
        problems.append(f"its outer dims (sizes {tuple(sizes[:-1])}, strides "
                        f"{tuple(strides[:-1])}) do not merge into one row stride")
    else:
        rows, row_stride = view
        if (row_stride * dtype_bytes) % GLOBAL_ALIGN:
            problems.append(f"its row stride {row_stride} x {dtype_bytes} bytes is not a "
                            f"multiple of {GLOBAL_ALIGN}")
        if row_stride * dtype_bytes >= MAX_GLOBAL_STRIDE:
            problems.append(f"its row stride of {row_stride * dtype_bytes} bytes is not below 2^40")
        if rows >= 2**31:
            problems.append(f"{rows} rows exceed a tensor-map coordinate (int32)")
    if alignment % GLOBAL_ALIGN:
        problems.append(f"its data pointer is {alignment}-byte aligned, not {GLOBAL_ALIGN}")
    # Imported here: the kernel-IR nodes are not needed to choose a schedule, only to check one
    # that copies by tensor maps (an `import pyfuser` need not define them).
    from ..kir.nodes import RowBoxMap
    if RowBoxMap.inner_for(n, dtype_bytes) is None:
        problems.append(f"a row of {n} x {dtype_bytes} bytes does not split into at most 256 box "
                        "pieces of at most 256 elements and a multiple of 16 bytes")
    return problems


# Batch dims a tile map takes beside its rows and columns (a tensor map has up to 5 dims).
MAX_BATCH_DIMS = 3


def check_tile_box(sizes, strides, alignment: int, dtype_bytes: int, inner: int, outer: int,
                   box_cols: int, box_rows: int, swizzle: int = TILE_SWIZZLE_BYTES,
                   batch=()) -> list[str]:
    """Rules for copying 2D tiles of a matrix with a tensor map (a kir.TileBoxMap): the matrix
    seen as rows, logical dim `inner` (stride 1) along a row and logical dim `outer` counting
    rows; a box is `box_rows` rows of `box_cols` elements under the `swizzle`-byte pattern.
    `sizes` and `strides` (in elements) are the tensor's, `alignment` its data pointer's largest
    power-of-two divisor (bytes). Readable reasons, empty when a map can be encoded.

    Rank 2, or more with `batch` the other dims (a batch of matrices, up to MAX_BATCH_DIMS dims
    of any strides: the map's dims 2.., a box one matrix deep; an int stands for one dim, None
    for none). A dim of size 1 has no stride to keep (any is fine: the encoder stands in a
    legal one). Extents must be in 1..2^31-1: the copies' coordinates are int32."""
    problems = []
    rank = len(sizes)
    batch = () if batch is None else (batch,) if isinstance(batch, int) else tuple(batch)
    dims = (inner, outer, *batch)
    if rank != len(dims):
        return [f"a tile map covers {len(dims)}-dim tensors here ({len(batch)} batch dims), "
                f"this one has {rank} dims"]
    if len(batch) > MAX_BATCH_DIMS:
        return [f"{len(batch)} batch dims: a tensor map has at most {2 + MAX_BATCH_DIMS} dims"]
    if len(strides) != rank:
        return [f"{len(strides)} strides for {rank} dims"]
    if sorted(dims) != list(range(rank)):
        return [f"dims {dims} are not the tensor's {rank} dims"]
    for d in batch:
        if sizes[d] == 1:
            continue
        b_bytes = strides[d] * dtype_bytes
        if b_bytes <= 0 or b_bytes % GLOBAL_ALIGN or b_bytes >= MAX_GLOBAL_STRIDE:
            problems.append(f"its batch dim {d} stride {strides[d]} x {dtype_bytes} bytes "
                            f"is not a positive multiple of {GLOBAL_ALIGN} below 2^40")
        if not 1 <= sizes[d] < MAX_TILE_EXTENT:
            problems.append(f"its batch dim {d} has {sizes[d]} elements")
    if sizes[inner] != 1 and strides[inner] != 1:
        problems.append(f"its inner dim {inner} (along a row) has stride {strides[inner]}, not 1: "
                        "a tensor map reads rows of contiguous elements")
    if sizes[outer] != 1:
        row_bytes = strides[outer] * dtype_bytes
        if row_bytes <= 0:
            problems.append(f"its outer dim {outer} has stride {strides[outer]}: the rows of a "
                            "tensor map are apart (a positive stride)")
        elif row_bytes % GLOBAL_ALIGN:
            problems.append(f"its outer dim {outer} stride {strides[outer]} x {dtype_bytes} bytes "
                            f"is not a multiple of {GLOBAL_ALIGN}")
        if row_bytes >= MAX_GLOBAL_STRIDE:
            problems.append(f"its outer dim {outer} stride of {row_bytes} bytes is not below 2^40")
    if alignment % GLOBAL_ALIGN:
        problems.append(f"its data pointer is {alignment}-byte aligned, not {GLOBAL_ALIGN}")
    for what, d in (("inner", inner), ("outer", outer)):
        if not 1 <= sizes[d] < MAX_TILE_EXTENT:
            problems.append(f"its {what} dim {d} has {sizes[d]} elements; a tensor map needs "
                            "1..2^31-1 (int32 coordinates)")
    for what, b in (("box_cols", box_cols), ("box_rows", box_rows)):
        if not 1 <= b <= MAX_BOX:
            problems.append(f"{what} {b} is outside 1..{MAX_BOX}")
    if swizzle != TILE_SWIZZLE_BYTES:
        problems.append(f"swizzle {swizzle} bytes: a tile map uses the {TILE_SWIZZLE_BYTES}-byte "
                        "swizzle only")
    elif box_cols * dtype_bytes != swizzle:
        problems.append(f"a box row of {box_cols} x {dtype_bytes} bytes is not the {swizzle}-byte "
                        "swizzle span (box_cols x element bytes must equal it)")
    return problems
