"""Register-file rules of warp-specialized kernels (setmaxnreg), shared by the scheduler
that asks for a split and the lowering pass that emits it."""
from __future__ import annotations

# The register file of one SM holds 65536 32-bit registers; setmaxnreg hands them out per warp
# group of 128 threads.
REGISTER_FILE = 65536


def check_register_counts(producer: int, compute: int, compute_groups: int,
                          producer_groups: int = 1) -> str | None:
    """Why a warp-specialized register split is impossible, or None.

    setmaxnreg.inc waits until the SM has the registers it asks for; asking more than the file
    holds makes the kernel hang, so the check runs before any code is generated.
    """
    for what, n in (("producer", producer), ("compute", compute)):
        if not 24 <= n <= 256 or n % 8:
            return f"{what} register count {n} must be a multiple of 8 in 24..256"
    total = (producer * producer_groups + compute * compute_groups) * 128
    if total > REGISTER_FILE:
        lhs = f"{producer}" if producer_groups == 1 else f"{producer_groups} x {producer}"
        return (f"{lhs} + {compute_groups} x {compute} registers per thread need {total} "
                f"registers for the warp groups, more than the {REGISTER_FILE} of the register file")
    return None
