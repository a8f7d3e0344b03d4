"""Register-file rules of warp-specialized kernels (setmaxnreg), shared by the scheduler
that asks for a split and the lowering pass that emits it."""
from __future__ import annotations

# The register file of one SM holds 65536 32-bit registers; setmaxnreg hands them out per warp
# group of 128 threads.
REGISTER_FILE = 65536


def check_register_counts(producer: int, compute: int, compute_groups: int,
                          producer_groups: int = 1, pool: int = REGISTER_FILE) -> str | None:
    """Why a warp-specialized register split is impossible, or None.

    setmaxnreg.inc waits until the block's pool has the registers it asks for; the pool is what
    the block was launched with (`pool` = entry count x threads, at most the register file), so
    asking more makes the kernel hang, and the check runs before any code is generated.
    (Measured: 640 threads enter with 96 registers = 61440; 40 x 128 + 112 x 512 = 62464 hung.)
    """
    for what, n in (("producer", producer), ("compute", compute)):
        if not 24 <= n <= 256 or n % 8:
            return f"{what} register count {n} must be a multiple of 8 in 24..256"
    total = (producer * producer_groups + compute * compute_groups) * 128
    if total > pool:
        lhs = f"{producer}" if producer_groups == 1 else f"{producer_groups} x {producer}"
        where = (f"the {pool} of the register file" if pool == REGISTER_FILE else
                 f"the {pool} the block holds at entry")
        return (f"{lhs} + {compute_groups} x {compute} registers per thread need {total} "
                f"registers for the warp groups, more than {where}")
    return None
