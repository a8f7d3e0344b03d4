"""Rules of 1D bulk (TMA) copies that a scheduler checks on a CPU before choosing them.

The tensor-map rules (boxes, swizzle, 2^40 strides) live in runtime/tensor_map.py beside the
encoder; these are the ones a row-wise `cp.async.bulk` load needs, read from the runtime facts
of an input (sizes, strides, pointer alignment), so a heuristic can fall back to plain vector
loads when one fails, and the executor can check a reused kernel's inputs before launch.
"""
from __future__ import annotations

# Shared with the tensor-map rules of runtime/tensor_map.py.
GLOBAL_ALIGN = 16               # bytes: global addresses and strides of TMA copies
MAX_GLOBAL_STRIDE = 2**40       # bytes
# The transaction count of one mbarrier phase is a 20-bit number: the bytes of one stage.
MAX_TX_BYTES = 2**20 - 1


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
