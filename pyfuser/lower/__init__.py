"""Lowering: a scheduled fusion becomes a Kernel of kernel-IR nodes.

Each pass is a function Kernel -> Kernel in a file of its own; its docstring shows the kernel
before and after it and what it cannot do, and `@establishes(...)` names the verifier rules
(kir/verifier.py `Rule`, defined beside the pass) that hold from it on. They run in this order:
"""
from __future__ import annotations

from .. import options
from ..kir import nodes as K
from ..kir.printer import kernel_str
from ..kir.verifier import verify_kernel
from .allocation import allocate
from .context import LoweringContext, LoweringError
from .grouped_reductions import group_sibling_reductions
from .index import index_and_predicate
from .launch import launch_config
from .loops import build_loops
from .lse_lanes import fold_lse_lanes
from .matmul import build_matmul
from .params import kernel_params
from .pipeline import pipeline_loads
from .reductions import lower_reductions
from .scans import lower_scans
from .shared_divisor import shared_divisor_quotients
from .topk import lower_topk
from .unswitch import unswitch_loops
from .sync import insert_syncs
from .vectorize import vectorize_and_unroll

PIPELINE = [
    kernel_params,          # pointers, strides, extents, scalars; names of runtime values
    build_loops,            # one ForLoop per loop, TensorOps inside the loops they share
    allocate,               # register and shared buffers at the scope of their compute-at
    lower_reductions,       # accumulator init, block/grid reduction after the reduction loops
    lower_scans,            # scans: running value, block scan of the chunk totals, prefix fixup
    lower_topk,             # top-k: one block top-k of the row the threads hold
    index_and_predicate,    # operands become indexed accesses; bounds and thread predicates
    group_sibling_reductions,  # sibling block and grid steps side by side reduce in one pass
    unswitch_loops,         # Unswitch loops: a version without the inner loops' bounds checks
                            # where their last iterations pass them, the checked one otherwise
    vectorize_and_unroll,   # vector loads/stores, unrolled register loops
    fold_lse_lanes,         # a one-pass logsumexp folds each vector's lanes into its running
                            # key at once (their max, then exps against it)
    pipeline_loads,         # TMA and cp.async loads into circular buffers: stages, mbarriers
                            # or cp.async groups; one role (prologue / main loop / epilogue) or
                            # warp roles (a producer, compute roles taking turns)
    insert_syncs,           # barriers between shared writes and reads (a warp role's: its own
                            # named barrier); grid barriers between nests
    shared_divisor_quotients,  # quotients by a divisor their loop shares: through its
                            # reciprocal, range checked; the outermost loop that can run again
                            # runs again with div.rn where a check failed
    launch_config,          # grid, block, shared memory, launch bounds
]

# A matmul the matmul scheduler took (fusion.mma): its tensor-core loop nest is built whole,
# then buffered and launched by the passes every kernel goes through.
MATMUL_PIPELINE = [
    kernel_params,
    build_matmul,           # tile loop, k loop with the operand boxes' copies and wgmmas,
                            # the stmatrix / TMA-store epilogue
    pipeline_loads,         # the copies' stages and mbarriers; producer and compute warp roles
    launch_config,
]


def pipeline_of(fusion) -> list:
    """The passes that lower `fusion`: MATMUL_PIPELINE for a scheduled matmul, else PIPELINE."""
    return MATMUL_PIPELINE if fusion.mma is not None else PIPELINE


def rules_after(pass_name: str, passes: list = PIPELINE) -> tuple:
    """The verifier rules that hold after pass `pass_name` of `passes` (PIPELINE or
    MATMUL_PIPELINE): those the passes up to it establish (`kir.verifier.establishes` on each
    pass), less those a later one retired."""
    names = [p.__name__ for p in passes]
    if pass_name not in names:
        raise ValueError(f"unknown lowering pass {pass_name!r}; the pipeline (PIPELINE or "
                         f"MATMUL_PIPELINE) has {names}")
    rules: list = []
    for p in passes[:names.index(pass_name) + 1]:
        rules = [r for r in rules if r not in p.retires] + list(p.establishes)
    return tuple(rules)


def verify(kernel: K.Kernel, after: str = "launch_config") -> None:
    """Check `kernel` as left by pass `after` (kir/verifier.py); raises KernelIRError."""
    verify_kernel(kernel, rules_after(after, pipeline_of(kernel.fusion)), after)


def lower(fusion, name: str = "pyfuser_kernel", index_type: str = "int",
          verify_each: bool = False, streaming_loads: bool = False,
          shared_divisor_quotients: bool = True, group_reductions: bool = True) -> K.Kernel:
    kernel = K.Kernel(name=name, fusion=fusion, index_type=index_type,
                      streaming_loads=streaming_loads,
                      shared_divisor_quotients=shared_divisor_quotients,
                      group_reductions=group_reductions)
    kernel.ctx = LoweringContext(fusion)
    rules: list = []
    for p in pipeline_of(fusion):
        kernel = p(kernel)
        rules = [r for r in rules if r not in p.retires] + list(p.establishes)
        if verify_each:
            verify_kernel(kernel, rules, p.__name__)
        options.dump("kernel_ir_passes", f"{name}.{p.__name__}", lambda: kernel_str(kernel))
    options.dump("kernel_ir", name, lambda: kernel_str(kernel))
    return kernel


__all__ = ["MATMUL_PIPELINE", "PIPELINE", "LoweringError", "lower", "pipeline_of", "rules_after",
           "verify"]
