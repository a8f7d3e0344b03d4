"""Pass `warp_specialize`: a producer warp group fills the circular buffers, the rest compute.

Runs after `insert_syncs`, on TMA loads circular-buffered with the WarpSpecialized kind.

Before (the TMA load of T14 inlined into the grid-stride loop L, S stages):

    for j in L:                                   # top level of the kernel
      for r in 0..R: for b in Bulk[0, N):  T14[r * N] = T0[(j * R + r) * s0]     (one thread)
      ... = T14[ty * N + ...];  block_allreduce(...)     # consumers, all threads of the block

After (block dim y grows from By compute rows to By + Py, Py rows being the producer warp
group(s); n = trip count of L; slot(k) = k % S):

    __shared__ u64 full_T14[S], empty[S];
    if (thread 0) { full[s] = init(1); empty[s] = init(compute threads); fence }; __syncthreads();
    if (threadIdx.y >= By) {                      # producer warp group(s), `roles` split
      setmaxnreg.dec(Rp);
      if (threadIdx.y == By && threadIdx.x == 0)
        for k in [0, n):                          # producer loop
          if (k >= S) wait(empty[k % S], (k / S + 1) & 1);     # slot released by compute
          expect_tx + bulk copies of iteration k into slot k % S; arrive(full[k % S]);
    } else {                                      # compute warp groups
      setmaxnreg.inc(Rc);
      <statements before L>
      for k in [0, n):                            # compute loop
        j = start + k * step; wait(full[k % S], (k / S) & 1);
        body(k) with block barriers as bar.sync(1, compute threads);
        arrive(empty[k % S]);                     # every compute thread, after its last read
      <statements after L>
    }
    __syncthreads(); if (thread 0) invalidate every mbarrier;

The compute threads' arrivals on empty[s] (release) and the producer's wait (acquire) order
every read of slot s before the bulk copy that overwrites it. Block barriers and block
reductions inside the compute branch become named barrier 1 among the compute threads only:
the producer never reaches them.

Register split: `__launch_bounds__(all threads, 1)` gives each thread R0 = 65536 / threads
registers at entry (rounded down to 8); the producer decreases to Rp (default 40, 24 when it
spans several warp groups), compute increases to Rc (default: what is left, at most 240).
Rp <= R0 <= Rc and Rp * producer threads + Rc * compute threads <= R0 * threads (the block's
pool, below 65536 when the thread count does not divide it) are checked here, before any code
exists: setmaxnreg.inc waits forever for registers the pool does not have (seen: 640 threads).

Limitations: one buffered loop, at the top level of the kernel (serial or grid-stride); the
split is along threadIdx.y, so compute rows times threadIdx.x threads, and the producer rows,
must each be whole warp groups (bdimx dividing 128 or a multiple of it); no cluster or grid
reduction in the compute branch; block-shared accumulators are refused. A grid barrier in the
compute branch (norm backward: column partials exchanged through global memory) is done by the
compute threads alone: `grid_sync(counter, NamedBarrier{1, compute threads})`; thread 0, the
block's arrival at the grid counter, is a compute thread, and the producer touches no global
data the barrier orders.
"""
from __future__ import annotations

from ..ir.tensor import WarpSpecialized
from ..ir.iter_domain import ParallelType as PT
from ..kir import nodes as K
from ..kir.verifier import establishes
from ..kir.registers import check_register_counts, default_register_split
from .circular_buffer import (load_site, mark_replaced, offset_slots, replace_stmt, retarget,
                              take_loads, tma_loads, trip_count)
from .context import LoweringError
from .indexing import bound_extents

WARP_GROUP = 128
_TIDX, _TIDY, _TIDZ = (K.Special(f"threadIdx.{d}") for d in "xyz")
_THREAD0 = K.and_(K.and_(K.eq(_TIDX, 0), K.eq(_TIDY, 0)), K.eq(_TIDZ, 0))
# The elected producer thread issues the copies the schedule gave to "thread 0" of the load.
_AS_THREAD0 = {_TIDX: K.Const(0), _TIDY: K.Const(0), _TIDZ: K.Const(0)}


@establishes()
def warp_specialize(kernel: K.Kernel) -> K.Kernel:
    items, loop = [], None
    for op, path in tma_loads(kernel.body, []):
        tv = op.expr.outputs[0]
        opts = tv.circular_buffer_options
        if opts is None or not isinstance(opts.kind, WarpSpecialized):
            continue
        if opts.kind.on != PT.TIDy:
            raise LoweringError(f"T{tv.name}: warp specialization is lowered on threadIdx.y only, "
                                f"not {opts.kind.on.short}")
        this, idx, top = load_site(tv, op, path)
        if idx != 0:
            raise LoweringError(f"T{tv.name}: its buffered loop {this.var!r} must be at the top "
                                "level of the kernel (the producer runs it on its own)")
        if loop is not None and this is not loop:
            raise LoweringError("warp-specialized TMA tensors buffered over two different loops")
        loop = this
        items.append((tv, op, top))
    if not items:
        return kernel
    kinds = {tv.circular_buffer_options.kind for tv, _, _ in items}
    if len(kinds) != 1:
        raise LoweringError(f"warp-specialized tensors over one loop ask for different register "
                            f"splits {sorted(map(repr, kinds))}")
    roles = _roles(kernel, kinds.pop())
    kernel.warp_roles = roles
    _split(kernel, loop, items, roles)
    return kernel


def _thread_extent(kernel, pt: PT) -> int:
    """The block extent along `pt` (1 when nothing is bound to it); it must be a constant."""
    exts = bound_extents(kernel.ctx, {pt})
    if None in exts:
        raise LoweringError(f"warp specialization needs a constant {pt.short} extent "
                            "(specialize the kernel on it)")
    return max(exts, default=1)


def _roles(kernel: K.Kernel, kind: WarpSpecialized) -> K.WarpRoles:
    bdimx, bdimy = _thread_extent(kernel, PT.TIDx), _thread_extent(kernel, PT.TIDy)
    if _thread_extent(kernel, PT.TIDz) != 1:
        raise LoweringError("warp specialization on threadIdx.y needs blockDim.z == 1")
    compute = bdimx * bdimy
    if compute % WARP_GROUP:
        raise LoweringError(f"the compute threads ({bdimx} x {bdimy}) are not whole warp groups "
                            "of 128")
    if WARP_GROUP % bdimx == 0:
        producer_rows = WARP_GROUP // bdimx
    elif bdimx % WARP_GROUP == 0:
        producer_rows = 1
    else:
        raise LoweringError(f"threadIdx.x extent {bdimx} neither divides 128 nor is a multiple "
                            "of it: the producer rows would not be whole warp groups")
    producer = bdimx * producer_rows
    total = compute + producer
    if total > 1024:
        raise LoweringError(f"{compute} compute and {producer} producer threads exceed 1024 per "
                            "block")
    entry, p_regs, c_regs = default_register_split(compute, producer, kind.producer_registers)
    c_regs = kind.compute_registers or c_regs
    # The block's pool: what it holds at entry; setmaxnreg only moves registers within it.
    pool = entry * total
    why = check_register_counts(p_regs, c_regs, compute // WARP_GROUP,
                                producer_groups=producer // WARP_GROUP, pool=pool)
    if why is None and not p_regs <= entry <= c_regs:
        why = (f"the entry register count {entry} ({total} threads) must lie between the "
               f"producer's {p_regs} and the compute warp groups' {c_regs}")
    if why:
        raise LoweringError(f"warp specialization: {why}")
    return K.WarpRoles("y", bdimx, bdimy, producer_rows, c_regs, p_regs)


def _split(kernel: K.Kernel, loop: K.ForLoop, items, roles: K.WarpRoles) -> None:
    ctx = kernel.ctx
    n_stages = items[0][0].circular_buffer_options.stages
    buffered = take_loads(kernel, loop, items, n_stages, bars_name="pf_full_{}")
    empty = K.MBarriers(f"pf_empty_{loop.var.name}", n_stages)
    trips, index_at = trip_count(loop)
    n = K.Var(f"pf_ws_trips_{loop.var.name}")

    # Producer: one elected thread runs the load loop.
    k_p = ctx.new_loop_var()
    stage, use = K.mod(k_p, n_stages), K.div(k_p, n_stages)
    produce = [K.IfThenElse(K.lt(K.Const(n_stages - 1), k_p),
                            [K.MBarrierWait(K.MBarrierRef(empty, stage),
                                            K.mod(K.add(use, 1), 2))])]
    mapping = dict(_AS_THREAD0)
    mapping[loop.var] = index_at(k_p)
    for b in buffered:
        for s in b.issue:
            produce.append(retarget(s, mapping, b, stage))
        produce.append(K.MBarrierArrive(K.MBarrierRef(b.bars, stage)))
    elected = K.and_(K.eq(_TIDY, roles.compute_extent), K.eq(_TIDX, 0))
    producer = [K.SetMaxNReg(roles.producer_registers, increase=False),
                K.IfThenElse(elected, [K.ForLoop(k_p, K.Const(0), n, K.Const(1), produce,
                                                 label=K.WS_PRODUCER_LOOP)])]

    # Compute: the kernel's statements, the buffered loop replaced by the compute loop.
    k_c = ctx.new_loop_var()
    stage = K.mod(k_c, n_stages)
    body = [K.ScalarDef(loop.var, index_at(k_c))]
    body += [K.MBarrierWait(K.MBarrierRef(b.bars, stage), K.mod(K.div(k_c, n_stages), 2))
             for b in buffered]
    body += [offset_slots(s, buffered, stage) for s in loop.body]
    body.append(K.MBarrierArrive(K.MBarrierRef(empty, stage)))
    compute_loop = K.ForLoop(k_c, K.Const(0), n, K.Const(1), body, label=K.WS_COMPUTE_LOOP)
    mark_replaced(kernel, loop, buffered)
    if not replace_stmt(kernel.body, loop, [compute_loop]):
        raise LoweringError(f"loop {loop.var!r} vanished from the kernel")
    shared = [s for s in kernel.body if isinstance(s, K.Allocate) and s.buffer.memory == "shared"]
    rest = [s for s in kernel.body if s not in shared]
    compute = [K.SetMaxNReg(roles.compute_registers, increase=True)]
    compute += [_named_barriers(s, roles) for s in rest]

    names = "/".join(f"T{b.tv.name}" for b in buffered)
    bars = [b.bars for b in buffered] + [empty]
    init = [K.MBarrierInit(K.MBarrierRef(b.bars, K.Const(s)), K.Const(1))
            for b in buffered for s in range(n_stages)]
    init += [K.MBarrierInit(K.MBarrierRef(empty, K.Const(s)), K.Const(roles.compute_threads))
             for s in range(n_stages)]
    kernel.body = shared + [
        K.Comment(f"warp-specialized circular buffer of {names}: {n_stages} stages; producer "
                  f"threadIdx.y >= {roles.compute_extent} ({roles.producer_threads} threads, "
                  f"{roles.producer_registers} registers), compute {roles.compute_threads} "
                  f"threads, {roles.compute_registers} registers"),
        *[K.MBarrierAlloc(b) for b in bars],
        K.IfThenElse(_THREAD0, init + [K.FenceMBarrierInit()]),
        K.BlockSync(),
        K.ScalarDef(n, trips),
        K.IfThenElse(K.lt(K.Const(roles.compute_extent - 1), _TIDY), producer, compute,
                     roles=True),
        K.BlockSync(),
        K.IfThenElse(_THREAD0, [K.MBarrierInval(K.MBarrierRef(b, K.Const(s)))
                                for b in bars for s in range(n_stages)]),
    ]
    kernel.circular_buffers += [(b.buf.name, n_stages, n_stages, "warp_specialized")
                                for b in buffered]


def _named_barriers(s, roles: K.WarpRoles):
    """Compute-branch synchronization among the compute threads only."""
    for x in K.walk([s]):
        if isinstance(x, K.BlockSync) and x.barrier_id is None:
            x.barrier_id, x.count = roles.barrier_id, K.Const(roles.compute_threads)
        elif isinstance(x, K.BlockReduce):
            x.barrier = (roles.barrier_id, roles.compute_threads)
        elif isinstance(x, K.GridSync):
            # Only the compute threads exchange data through global memory (the producer
            # writes shared memory only): the block's part of the grid barrier is theirs.
            x.barrier = (roles.barrier_id, roles.compute_threads)
        elif isinstance(x, (K.GridReduce, K.ClusterReduce)):
            raise LoweringError(f"warp specialization: a {type(x).__name__} in the compute warp "
                                "groups is not supported")
        elif isinstance(x, K.InitValue) and getattr(x.out, "memory", None) == "shared":
            raise LoweringError("warp specialization: a block-shared accumulator would be "
                                "initialized with __syncthreads, which the producer never reaches")
    return s
