"""Shared-memory workspace sizes of the device library's block reductions.

Lowering sizes each kernel's reduction workspace with these; the device library
(pyfuser/codegen/runtime_src/reduce.cuh) has the same formulas as constexpr functions, and a test
checks the two agree. They live with the kernel IR because both lowering and codegen need them
and neither may import the other.
"""
from __future__ import annotations


def block_allreduce_x_smem_elems(n: int, dx: int, rows: int) -> int:
    """Shared-memory elements that ``pf::block_allreduce_x_group<n>`` needs (see reduce.cuh).

    ``dx`` is blockDim.x; ``rows`` the rows of the synchronization group (blockDim.y * blockDim.z
    for ``pf::CtaBarrier``, num_threads // dx for ``pf::NamedBarrier``). Same formula as
    ``pf::block_allreduce_x_smem_elems``.
    """
    if dx % 32 == 0:
        return 0 if dx == 32 else n * (dx // 32) * rows
    if 32 % dx == 0:
        return 0
    return n * dx + n if rows == 1 and dx > 32 else dx * rows


def block_allreduce_y_smem_elems(n: int, dx: int, rows: int) -> int:
    """Shared-memory elements that ``pf::block_allreduce_y_group<n>`` needs (see reduce.cuh)."""
    return n * dx * rows
