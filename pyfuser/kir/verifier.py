"""Structural checks of a Kernel between lowering passes (lower(..., verify_each=True)).

A pass that leaves the kernel IR malformed is a bug in that pass; `verify_kernel(kernel, rules,
after)` raises KernelIRError naming the pass and the first broken rule.

Rules that hold at every stage are checked here, for every node kind through its declared field
roles (kir/nodes.py):
- buffers: every buffer a statement names or indexes is a kernel parameter or is allocated
  (once) in an enclosing scope before it is used; register buffers have a constant size.
- variables: a loop variable appears only inside its loop; every other variable is a kernel
  parameter or was defined (ScalarDef) before, in an enclosing scope.
- loops: each lowering Loop is emitted at most once (loops labelled as repeats of others, a
  circular buffer's epilogue and a scan's fixup, may repeat loops and allocations).
- vectors: widths 2, 4, 8 or 16 and at most 16 bytes per access.
- reductions: a BlockReduce/GridReduce/ClusterReduce, a block scan or top-k is not under a
  predicated IfThenElse nor inside a loop bound to a thread or block dimension it reduces (every
  participant must reach it); nor is a GridSync, whose buffer is a kernel parameter.
- asynchronous copies: mbarriers are allocated before use; bulk, tensor-map and cp.async copies
  move global to shared memory; cp.async copies move 4, 8 or 16 bytes and are waited for.
- warp roles: each role of a RoleSplit starts with setmaxnreg and holds no block-, cluster- or
  grid-wide barrier (its own named barrier stands for them).

The rules that hold from some pass on are `Rule`s defined next to the pass that establishes
them (`@establishes(RULE, retires=(...))` on the pass function); the lowering pipeline collects
the rules of the passes it has run (lower/__init__.py `rules_after`), so the verifier keeps no
copy of the pass order.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from ..ir.dtype import DataType
from ..ir.exprs import ReductionOpType
from . import nodes as K
from .rewrite import buffers_of, exprs_of, subexprs

_THREAD_PT = {"TIDx": "x", "TIDy": "y", "TIDz": "z"}
_BLOCK_PT = {"BIDx": "x", "BIDy": "y", "BIDz": "z"}
_VECTOR_WIDTHS = (2, 4, 8, 16)
_REDUCTION_OPS = frozenset(t.value for t in ReductionOpType)
# Variables codegen defines in the kernel's preamble.
_PREAMBLE_VARS = {"pf_grid_last"}
# Loops that repeat other loops' statements (the verifier lets them emit those loops again).
REPEATING_LABELS = (K.CB_EPILOGUE, K.SCAN_FIXUP, K.UNSWITCH_ELSE, K.QUOTIENTS_EXACT)


class KernelIRError(AssertionError):
    """The kernel IR broke a structural rule; the message names the pass that left it so."""


@dataclasses.dataclass(frozen=True)
class Rule:
    """A property of the kernel IR that holds after the pass that establishes it (until a pass
    that retires it). `stmt(verifier, statement, scope)` checks each statement in the scope
    walk, `kernel(verifier)` the whole kernel after it; both call verifier.fail."""

    name: str
    stmt: Callable | None = None
    kernel: Callable | None = None

    def __repr__(self):
        return f"Rule({self.name})"


def establishes(*rules: Rule, retires: tuple = ()):
    """Mark a lowering pass with the rules it establishes and those it ends."""
    def mark(fn):
        fn.establishes = tuple(rules)
        fn.retires = tuple(retires)
        return fn
    return mark


def _describe(s) -> str:
    from .printer import _op
    if isinstance(s, K.TensorOp):
        try:
            return _op(s)
        except Exception:   # noqa: BLE001 - a malformed op may not print
            return f"TensorOp({type(s.expr).__name__})"
    if isinstance(s, K.ForLoop):
        return f"for {s.var!r} in {s.parallel}[{s.start!r}, {s.stop!r})"
    if isinstance(s, K.Allocate):
        return f"alloc {s.buffer.memory} {s.buffer.name}[{s.buffer.size!r}]"
    return type(s).__name__


class _Scope:
    def __init__(self, parent=None, loop=None, cond=None):
        self.parent = parent
        self.loop = loop          # the ForLoop this scope is the body of
        self.cond = cond          # the IfThenElse this scope is a branch of
        self.buffers: set = set()
        self.vars: set = set()

    def chain(self):
        s = self
        while s is not None:
            yield s
            s = s.parent

    def has_buffer(self, b) -> bool:
        return any(id(b) in s.buffers for s in self.chain())

    def has_var(self, name: str) -> bool:
        return any(name in s.vars for s in self.chain())

    def loops(self) -> list:
        return [s.loop for s in reversed(list(self.chain())) if s.loop is not None]

    def ifs(self) -> list:
        return [s.cond for s in self.chain() if s.cond is not None]


class _Verifier:
    def __init__(self, kernel: K.Kernel, rules, after: str):
        self.k = kernel
        self.after = after
        self.rules = tuple(rules)
        self.stmt_rules = [r.stmt for r in self.rules if r.stmt is not None]
        self.cp_async_copies = self.cp_async_waits = 0
        self.param_buffers = {id(p.buffer) for p in kernel.params if p.buffer is not None}
        self.param_names = {p.name for p in kernel.params}
        self.loop_var_names = {f.var.name for f in K.walk(kernel.body) if isinstance(f, K.ForLoop)}
        self.allocs_seen: set = set()
        self.mbarriers: set = set()
        self.loops_seen: dict = {}
        self.grid_syncs = 0
        self.preamble = set(_PREAMBLE_VARS) if any(
            isinstance(s, K.GridReduce) for s in K.walk(kernel.body)) else set()

    def holds(self, rule: Rule) -> bool:
        return rule in self.rules

    def fail(self, msg: str, stmt=None):
        where = f" (at `{_describe(stmt)}`)" if stmt is not None else ""
        raise KernelIRError(f"kernel {self.k.name} after pass {self.after!r}: {msg}{where}")

    # Operands ----------------------------------------------------------------------------------
    def check_expr(self, e, scope: _Scope, stmt, what: str) -> None:
        """Variables in scope, indexed buffers allocated, mbarriers allocated: for every
        expression inside `e`."""
        for x in subexprs(e):
            if isinstance(x, K.Var):
                name = x.name
                if name in self.loop_var_names:
                    if not any(f.var.name == name for f in scope.loops()):
                        self.fail(f"loop variable {name} is used in {what} outside its loop", stmt)
                elif not (name in self.param_names or scope.has_var(name)
                          or name in self.preamble):
                    self.fail(f"variable {name} in {what} is neither a loop variable in scope, a "
                              "kernel parameter nor defined before", stmt)
            elif isinstance(x, K.TensorIndex):
                self.check_buffer(x.buffer, scope, stmt, what)
            elif isinstance(x, K.MBarrierRef) and id(x.bars) not in self.mbarriers:
                self.fail(f"mbarriers {x.bars.name} are used before their allocation", stmt)

    def check_buffer(self, b, scope: _Scope, stmt, what: str) -> None:
        if id(b) in self.param_buffers or scope.has_buffer(b):
            return
        self.fail(f"buffer {b.name} ({b.memory}) in {what} is neither a kernel parameter nor "
                  "allocated in an enclosing scope before this use", stmt)

    def check_operands(self, s, scope: _Scope) -> None:
        """Every expression and buffer statement `s` uses, through its field roles."""
        for f, e in exprs_of(s):
            self.check_expr(e, scope, s, f"{type(s).__name__}.{f}")
        if isinstance(s, K.Allocate):
            return
        for f, b in buffers_of(s):
            self.check_buffer(b, scope, s, f"{type(s).__name__}.{f}")

    # Statements --------------------------------------------------------------------------------
    def body(self, stmts, scope: _Scope) -> None:
        for s in stmts:
            self.stmt(s, scope)

    def stmt(self, s, scope: _Scope) -> None:
        if type(s) not in K.STMT_KINDS:
            self.fail(f"{type(s).__name__} is not a kernel-IR statement kind", s)
        for check in self.stmt_rules:
            check(self, s, scope)
        if not isinstance(s, (K.ForLoop, K.IfThenElse, K.ScalarDef, K.RoleSplit, K.RoleBody)):
            # (a loop's, a branch's and a definition's operands are checked by their handlers,
            # in the scope they are evaluated in)
            self.check_operands(s, scope)
        fn = getattr(self, "_" + type(s).__name__, None)
        if fn is not None:
            fn(s, scope)

    def repeating(self, scope) -> bool:
        """Inside a loop that repeats other loops' statements (a circular buffer's epilogue, a
        scan's prefix fixup)."""
        return any(f.label in REPEATING_LABELS for f in scope.loops())

    def _RoleSplit(self, s: K.RoleSplit, scope):
        """Warp roles run at the same time: a block-wide barrier in one waits for threads that
        never come; each role starts with its setmaxnreg. Each role is checked as a scope of its
        own (the compute roles of a ping-pong kernel emit the same loops and buffers)."""
        loops, allocs = dict(self.loops_seen), set(self.allocs_seen)
        all_loops, all_allocs = dict(loops), set(allocs)
        for rb in s.roles:
            if not isinstance(rb, K.RoleBody):
                self.fail(f"a {type(rb).__name__} among the roles of a role split", s)
            name = rb.role.name
            if not rb.body or not isinstance(rb.body[0], K.SetMaxNReg):
                self.fail(f"the {name} role does not start with setmaxnreg", s)
            for x in K.walk(rb.body):
                if isinstance(x, K.BlockSync) and x.barrier_id is None:
                    self.fail(f"__syncthreads inside the {name} role of a warp-specialized "
                              "kernel", x)
                if isinstance(x, K.BlockReduce) and x.barrier is None:
                    self.fail(f"a block reduction over the whole block inside the {name} role "
                              "of a warp-specialized kernel", x)
                if isinstance(x, K.GridSync) and x.barrier is not None:
                    continue        # the role's own named barrier (insert_syncs)
                if isinstance(x, (K.GridReduce, K.ClusterReduce, K.GridSync, K.ClusterSync)):
                    self.fail(f"a {type(x).__name__} inside the {name} role of a "
                              "warp-specialized kernel (the other roles never join it)", x)
            self.check_expr(rb.cond, scope, s, f"the {name} role's condition")
            self.loops_seen, self.allocs_seen = dict(loops), set(allocs)
            self.body(rb.body, _Scope(scope))
            all_loops.update(self.loops_seen)
            all_allocs |= self.allocs_seen
        self.loops_seen, self.allocs_seen = all_loops, all_allocs

    def _RoleBody(self, s: K.RoleBody, scope):
        self.fail("a warp role's statements outside a role split", s)

    def _ForLoop(self, s: K.ForLoop, scope):
        if not isinstance(s.var, K.Var):
            self.fail(f"loop variable {s.var!r} is not a Var", s)
        for what, e in (("start", s.start), ("stop", s.stop), ("step", s.step)):
            self.check_expr(e, scope, s, f"the loop {what}")
        repeat = s.label in REPEATING_LABELS or self.repeating(scope)
        if s.loop is not None and not repeat:
            if id(s.loop) in self.loops_seen:
                self.fail(f"lowering loop {s.loop!r} is emitted twice", s)
            self.loops_seen[id(s.loop)] = s
        if any(f.var.name == s.var.name for f in scope.loops()):
            self.fail(f"loop variable {s.var.name} shadows an enclosing loop's", s)
        self.body(s.body, _Scope(scope, loop=s))

    def _IfThenElse(self, s: K.IfThenElse, scope):
        self.check_expr(s.cond, scope, s, "the condition")
        self.body(s.then_body, _Scope(scope, cond=s))
        self.body(s.else_body, _Scope(scope, cond=s))

    def _LseFoldLanes(self, s: K.LseFoldLanes, scope):
        # A fold that replaced its lanes' loop whole stands for that lowering loop.
        if s.loop is not None and not self.repeating(scope):
            if id(s.loop) in self.loops_seen:
                self.fail(f"lowering loop {s.loop!r} is emitted twice", s)
            self.loops_seen[id(s.loop)] = s

    def _CheckedQuotients(self, s: K.CheckedQuotients, scope):
        self.body(s.fast, _Scope(scope))
        self.body(s.exact, _Scope(scope))

    def _Allocate(self, s: K.Allocate, scope):
        b = s.buffer
        if id(b) in self.allocs_seen and not self.repeating(scope):
            self.fail(f"buffer {b.name} is allocated twice", s)
        if id(b) in self.param_buffers:
            self.fail(f"buffer {b.name} is a kernel parameter and also allocated", s)
        self.allocs_seen.add(id(b))
        if b.memory == "local":
            if not (isinstance(b.size, K.Const) and isinstance(b.size.value, int)
                    and not isinstance(b.size.value, bool)):
                self.fail(f"register buffer {b.name} has a non-constant size {b.size!r}", s)
        elif b.memory != "shared":
            self.fail(f"buffer {b.name} is allocated in {b.memory!r} memory (local or shared only)", s)
        if isinstance(b.size, K.Const) and not b.size.value > 0:
            self.fail(f"buffer {b.name} has size {b.size.value}", s)
        if b.size is not None and not isinstance(b.size, K.Const):
            self.check_expr(b.size, scope, s, "the buffer size")
        scope.buffers.add(id(b))

    def _ScalarDef(self, s: K.ScalarDef, scope):
        self.check_expr(s.value, scope, s, "the scalar definition")
        scope.vars.add(s.var.name)

    def _SplitKReduce(self, s: K.SplitKReduce, scope):
        scope.vars.add(s.last.name)     # the warp group is the tile's last: it runs the epilogue

    def _TensorOp(self, s: K.TensorOp, scope):
        if s.vector == 1:
            for v in [s.out] + list(s.ins):
                if isinstance(v, K.TensorIndex) and v.vector != 1:
                    self.fail(f"{v!r} is a vector access in a scalar op", s)
            return
        if s.vector not in _VECTOR_WIDTHS:
            self.fail(f"vector width {s.vector} is not one of {_VECTOR_WIDTHS}", s)
        vectors = K.vector_operands(s)
        for k, v in enumerate([s.out] + list(s.ins)):
            if k > vectors:         # one element for all lanes (K.vector_operands)
                if isinstance(v, K.TensorIndex) and v.vector != 1:
                    self.fail(f"{v!r} is a vector access where the lanes share one element", s)
                continue
            if not isinstance(v, K.TensorIndex):
                if isinstance(v, K.ScalarValue):
                    self.fail("a vectorized op reads a scalar", s)
                continue
            if v.vector != s.vector:
                self.fail(f"{v!r} has vector {v.vector} in an op of vector {s.vector}", s)
            nbytes = s.vector * v.buffer.dtype.size
            if nbytes > 16:
                self.fail(f"vector access of {s.vector} x {v.buffer.dtype.size} bytes to "
                          f"{v.buffer.name} exceeds 16 bytes", s)

    def everyone_reaches(self, s, scope, thread_dims, block_dims) -> None:
        """`s` synchronizes the threads along `thread_dims` and the blocks along `block_dims`:
        no predicated branch and no loop bound to one of those dims around it. (A warp role is
        not a predicate: every thread of the role reaches a step on the role's own named
        barrier, and _RoleSplit refuses one on the whole block.)"""
        name = type(s).__name__
        for c in scope.ifs():
            if not K.is_true(c.cond):
                self.fail(f"{name} is inside the predicated branch `if {c.cond!r}`: threads "
                          "that skip it would hang the others", s)
        for f in scope.loops():
            d = _THREAD_PT.get(f.parallel)
            if d is not None and d in thread_dims:
                self.fail(f"{name} over threadIdx.{d} is inside a loop bound to "
                          f"threadIdx.{d}", s)
            d = _BLOCK_PT.get(f.parallel)
            if d is not None and d in block_dims:
                self.fail(f"{name} over blockIdx.{d} is inside a loop bound to "
                          f"blockIdx.{d}", s)

    def _reduce_common(self, s, scope, thread_dims, block_dims) -> None:
        self.everyone_reaches(s, scope, thread_dims, block_dims)
        for v in s.values:
            if isinstance(v, K.TensorIndex) and v.buffer.memory != "local":
                self.fail(f"reduced value {v!r} is not in registers", s)
        if s.op not in _REDUCTION_OPS:
            self.fail(f"unknown reduction op {s.op!r}", s)

    def _BlockReduce(self, s: K.BlockReduce, scope):
        if not s.dims or any(d not in "xyz" for d in s.dims):
            self.fail(f"block reduction dims {s.dims!r}", s)
        self._reduce_common(s, scope, set(s.dims), set())

    def _BlockTopK(self, s: K.BlockTopK, scope):
        self.everyone_reaches(s, scope, {"x"}, set())
        for what, b in (("row", s.chunk), ("values", s.values), ("indices", s.indices)):
            if b.memory != "local":
                self.fail(f"the top-k's {what} {b.name} is not a register buffer", s)
        if s.workspace.memory != "shared":
            self.fail(f"the top-k's workspace {s.workspace.name} is not shared memory", s)
        if not 1 <= s.k <= (s.stride or 1) * s.values.size.value:
            self.fail(f"k {s.k} does not fit {s.values.size!r} results of {s.stride} threads", s)

    def _BlockScan(self, s: K.BlockScan, scope):
        if s.op not in ("sum", "prod"):
            self.fail(f"unknown scan op {s.op!r}", s)
        self.everyone_reaches(s, scope, {"x"}, set())
        v = s.carry
        if not isinstance(v, K.TensorIndex) or v.buffer.memory != "local":
            self.fail(f"scanned value {v!r} is not a register TensorIndex", s)
        if s.chain is not None:
            if s.cluster is not None:
                self.fail("a block scan both over a cluster and chained across blocks", s)
            for b in s.chain:
                if b.memory != "global":
                    self.fail(f"the scan chain's {b.name} is not global memory", s)

    def _ClusterReduce(self, s: K.ClusterReduce, scope):
        self._reduce_common(s, scope, set(), {s.dim})
        if s.size < 2:
            self.fail(f"a cluster reduction over {s.size} CTA(s)", s)

    def _GridReduce(self, s: K.GridReduce, scope):
        if not s.dims or any(d not in "xyz" for d in s.dims):
            self.fail(f"grid reduction dims {s.dims!r}", s)
        self._reduce_common(s, scope, set(s.thread_dims), set(s.dims))
        for b in (s.workspace, s.sync_buffer):
            if b is None or id(b) not in self.param_buffers:
                self.fail(f"grid reduction buffer {getattr(b, 'name', b)} is not a kernel "
                          "parameter", s)

    def _GridSync(self, s: K.GridSync, scope):
        for c in scope.ifs():
            if not K.is_true(c.cond):
                self.fail(f"GridSync is inside the predicated branch `if {c.cond!r}`: blocks "
                          "that skip it would hang the others", s)
        if s.sync_buffer is None or id(s.sync_buffer) not in self.param_buffers:
            self.fail("the grid barrier's buffer is not a kernel parameter", s)
        self.grid_syncs += 1

    def _ClusterSync(self, s: K.ClusterSync, scope):
        for c in scope.ifs():
            if not K.is_true(c.cond):
                self.fail(f"ClusterSync is inside the predicated branch `if {c.cond!r}`: CTAs "
                          "or threads that skip it would hang the others", s)
        self._cluster_of(s, "a cluster barrier")

    def _cluster_of(self, s, what: str) -> tuple:
        """The cluster dims the schedule launches the kernel with (it must have some)."""
        dims = self.k.fusion.launch_hints.get("cluster") if self.k.fusion is not None else None
        if not dims:
            self.fail(f"{what} in a kernel launched without a thread-block cluster", s)
        return dims

    def _MBarrierArrive(self, s: K.MBarrierArrive, scope):
        if s.cta is not None:
            self._cluster_of(s, "an arrival on a peer CTA's mbarrier")

    def _MBarrierAlloc(self, s, scope):
        self.mbarriers.add(id(s.bars))

    def _copy_spaces(self, s, name: str) -> None:
        for what, a, memory in (("destination", s.dst, "shared"),
                                ("source", getattr(s, "src", None), "global")):
            if a is None:
                continue
            if not isinstance(a, K.TensorIndex) or a.buffer.memory != memory:
                self.fail(f"the {name}'s {what} {a!r} is not in {memory} memory", s)

    def _BulkLoad(self, s, scope):
        self._copy_spaces(s, "bulk copy")

    def _TensorMapLoad(self, s, scope):
        self._copy_spaces(s, "tensor-map copy")
        self._tensor_map_param(s, "tensor-map copy")
        if s.multicast != 1:
            dims = self._cluster_of(s, "a multicast tensor-map copy")
            if tuple(dims) != (s.multicast, 1, 1):
                self.fail(f"a tensor-map copy multicast to {s.multicast} CTAs in clusters of "
                          f"{dims} (it lands in every CTA of a cluster along x)", s)

    def _tensor_map_param(self, s, what: str) -> None:
        params = {p.name: p for p in self.k.params}
        p = params.get(s.tmap.name)
        if p is None or p.kind != "tmap" or p.source != ("tmap", s.map):
            self.fail(f"the {what}'s map {s.tmap!r} is not a tensor-map parameter "
                      f"describing {s.map}", s)
        if len(s.coords) != len(s.map.box):
            self.fail(f"the {what} has {len(s.coords)} coordinates for a "
                      f"{len(s.map.box)}-D box", s)

    def _TensorMapStore(self, s: K.TensorMapStore, scope):
        if not isinstance(s.src, K.TensorIndex) or s.src.buffer.memory != "shared":
            self.fail(f"the tensor-map store's source {s.src!r} is not in shared memory", s)
        if s.target.memory != "global":
            self.fail(f"the tensor-map store's target {s.target.name} is not global memory", s)
        if not isinstance(s.map, K.TileBoxMap):
            self.fail(f"a tensor-map store through {s.map} (tile maps only)", s)
        self._tensor_map_param(s, "tensor-map store")

    def _Wgmma(self, s: K.Wgmma, scope):
        if s.dtype not in (DataType.BFloat16, DataType.Half):
            self.fail(f"a wgmma of {s.dtype} operands (bf16 or fp16)", s)
        if s.n % 8 or not 8 <= s.n <= 256:
            self.fail(f"wgmma m64n{s.n}k16: n is a multiple of 8 in 8..256", s)
        acc = s.acc
        if acc.memory != "local" or acc.dtype != DataType.Float or not (
                isinstance(acc.size, K.Const) and acc.size.value == s.n // 2):
            self.fail(f"the wgmma accumulator {acc.name} is not {s.n // 2} float registers", s)
        for what, a in (("A", s.a), ("B", s.b)):
            if not isinstance(a, K.TensorIndex) or a.buffer.memory != "shared" \
                    or a.buffer.dtype != s.dtype:
                self.fail(f"the wgmma operand {what} {a!r} is not shared memory of {s.dtype}", s)

    def _StMatrix(self, s: K.StMatrix, scope):
        if s.dst.buffer.memory != "shared" or s.dst.buffer.dtype != s.dtype \
                or s.dtype.size != 2:
            self.fail(f"stmatrix into {s.dst!r}: 16-bit {s.dtype} shared memory", s)
        if len(s.values) != 8:
            self.fail(f"stmatrix.x4 stores 8 values per lane, not {len(s.values)}", s)

    def _CpAsyncCopy(self, s: K.CpAsyncCopy, scope):
        self._copy_spaces(s, "cp.async copy")
        for a in (s.dst, s.src):
            if s.bytes != a.vector * a.buffer.dtype.size:
                self.fail(f"a cp.async copy of {s.bytes} bytes moves {a!r} ({a.vector} x "
                          f"{a.buffer.dtype.size} bytes)", s)
        if s.bytes not in (4, 8, 16):
            self.fail(f"a cp.async copy moves 4, 8 or 16 bytes, not {s.bytes}", s)
        self.cp_async_copies += 1

    def _CpAsyncWait(self, s: K.CpAsyncWait, scope):
        if not (isinstance(s.pending, int) and not isinstance(s.pending, bool)
                and s.pending >= 0):
            self.fail(f"cp.async.wait_group {s.pending!r} is not a non-negative constant", s)
        self.cp_async_waits += 1

    # Whole kernel ------------------------------------------------------------------------------
    def run(self) -> None:
        k = self.k
        names = [p.name for p in k.params]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            self.fail(f"duplicate parameter names {dup}")
        root = _Scope()
        self.body(k.body, root)
        if self.cp_async_copies and not self.cp_async_waits:
            self.fail("the kernel issues cp.async copies but never waits for them")
        for r in self.rules:
            if r.kernel is not None:
                r.kernel(self)


def verify_kernel(kernel: K.Kernel, rules=(), after: str = "") -> None:
    """Raise KernelIRError if `kernel`, as left by pass `after`, breaks a rule that holds at
    every stage or one of `rules` (those of the passes run so far)."""
    _Verifier(kernel, rules, after).run()
