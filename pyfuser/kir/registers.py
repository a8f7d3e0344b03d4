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


# setmaxnreg's defaults: the producer keeps 40 registers (24 when it spans several warp groups),
# the compute warp groups take what is left of the block's pool, at most 240.
PRODUCER_REGISTERS = 40
PRODUCER_REGISTERS_WIDE = 24
MAX_COMPUTE_REGISTERS = 240


def default_register_split(compute_threads: int, producer_threads: int,
                           producer: int | None = None) -> tuple[int, int, int]:
    """(registers per thread at entry, producer's, compute's) of a warp-specialized block:
    `__launch_bounds__(all threads, 1)` gives each thread REGISTER_FILE / threads at entry
    (rounded down to 8); the block's pool is entry x threads; the producer takes `producer`
    (default above) and the compute threads the rest, rounded down to 8, at most 240."""
    total = compute_threads + producer_threads
    entry = min(255, REGISTER_FILE // total) // 8 * 8
    if producer is None:
        producer = PRODUCER_REGISTERS if producer_threads == 128 else PRODUCER_REGISTERS_WIDE
    compute = min(MAX_COMPUTE_REGISTERS,
                  (entry * total - producer * producer_threads) // compute_threads // 8 * 8)
    return entry, producer, compute
