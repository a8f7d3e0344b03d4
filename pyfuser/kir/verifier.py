"""Structural checks of a Kernel between lowering passes (lower(..., verify_each=True)).

A pass that leaves the kernel IR malformed is a bug in that pass; `verify_kernel(kernel, after)`
raises KernelIRError naming the pass and the first broken rule:

- buffers: every indexed buffer is a kernel parameter or is allocated (once) in an enclosing
  scope before it is used; register buffers have a constant size.
- variables: a loop variable appears only inside its loop; every other variable is a kernel
  parameter or was defined (ScalarDef) before, in an enclosing scope.
- loops: each lowering Loop is emitted at most once (exactly once until vectorization folds
  vector loops); the ForLoops around a TensorOp are the loops of its nest, in order.
- operands: before `index_and_predicate` TensorOps hold fusion Vals; after it, indexed accesses
  (TensorIndex) and ScalarValues, and predicates are kernel expressions.
- vectors: widths 2, 4, 8 or 16 and at most 16 bytes per access.
- reductions: a BlockReduce/GridReduce is not under a predicated IfThenElse nor inside a loop
  bound to a thread or block dimension it reduces (every participant must reach it); nor is a
  GridSync, whose buffer is a kernel parameter.
- circular buffers: after `circular_buffer_loops` a buffered loop is gone (its index is a
  ScalarDef in the main loop and the epilogue, which repeat its body: loops inside an epilogue
  may repeat the main loop's); mbarrier and bulk-copy operands are in scope.
- cp.async: after `cp_async_buffer_loops` no cp.async load is left as a TensorOp; each copy
  moves 4, 8 or 16 bytes (its vector of elements) from global to shared memory, operands in
  scope; wait_group counts are non-negative constants, and a kernel that copies also waits.
- warp roles: the two branches of a warp-specialized split each start with setmaxnreg and hold
  no block-, cluster- or grid-wide barrier (__syncthreads, a block reduction without a named
  barrier, a cluster or grid reduction, a grid sync).
- launch: after `launch_config` the kernel has a launch configuration within the block limit,
  cooperative when it synchronizes the grid.

The checks that depend on the stage read `after`, a pass name of PASS_ORDER (kept equal to
pyfuser.lower.PIPELINE; kir may not import lower, and a test compares the two).
"""
from __future__ import annotations

from . import nodes as K

PASS_ORDER = (
    "kernel_params",
    "build_loops",
    "allocate",
    "lower_reductions",
    "lower_scans",
    "lower_topk",
    "index_and_predicate",
    "vectorize_and_unroll",
    "circular_buffer_loops",
    "cp_async_buffer_loops",
    "insert_syncs",
    "warp_specialize",
    "launch_config",
)

_THREAD_PT = {"TIDx": "x", "TIDy": "y", "TIDz": "z"}
_BLOCK_PT = {"BIDx": "x", "BIDy": "y", "BIDz": "z"}
_VECTOR_WIDTHS = (2, 4, 8, 16)
# Variables codegen defines in the kernel's preamble.
_PREAMBLE_VARS = {"pf_grid_last"}


def _nest_outside_vector(s: K.TensorOp, collapsed: set) -> list:
    """The loops of a TensorOp's nest that still enclose it: a vector op has lost its
    Vectorize loop and the one-iteration loops inside it that vectorize_and_unroll collapsed
    (their ids are in `collapsed`)."""
    kinds = [getattr(getattr(lp, "parallel", None), "name", "") for lp in s.nest]
    if s.vector == 1 or "Vectorize" not in kinds:
        return list(s.nest)
    v = kinds.index("Vectorize")
    return list(s.nest[:v]) + [lp for lp in s.nest[v + 1:] if id(lp) not in collapsed]


class KernelIRError(AssertionError):
    """The kernel IR broke a structural rule; the message names the pass that left it so."""


def _stage(after: str) -> int:
    try:
        return PASS_ORDER.index(after)
    except ValueError:
        raise ValueError(f"verify_kernel: unknown pass {after!r}; the verifier knows "
                         f"{list(PASS_ORDER)} (add a new pass to PASS_ORDER in "
                         "pyfuser/kir/verifier.py with the rules it establishes)") from None


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


def _vars(e, out: list) -> list:
    """Every K.Var inside expression `e` (TensorIndex indices included)."""
    if isinstance(e, K.Var):
        out.append(e)
    elif isinstance(e, K.Bin):
        _vars(e.a, out)
        _vars(e.b, out)
    elif isinstance(e, K.Not):
        _vars(e.a, out)
    elif isinstance(e, K.Select):
        _vars(e.cond, out)
        _vars(e.a, out)
        _vars(e.b, out)
    elif isinstance(e, K.TensorIndex):
        _vars(e.index, out)
    return out


def _tensor_indices(e, out: list) -> list:
    if isinstance(e, K.TensorIndex):
        out.append(e)
        _tensor_indices(e.index, out)
    elif isinstance(e, K.Bin):
        _tensor_indices(e.a, out)
        _tensor_indices(e.b, out)
    elif isinstance(e, K.Not):
        _tensor_indices(e.a, out)
    elif isinstance(e, K.Select):
        for x in (e.cond, e.a, e.b):
            _tensor_indices(x, out)
    return out


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
    def __init__(self, kernel: K.Kernel, after: str):
        self.k = kernel
        self.after = after
        stage = _stage(after)
        self.has_loops = stage >= PASS_ORDER.index("build_loops")
        self.allocated = stage >= PASS_ORDER.index("allocate")
        self.indexed = stage >= PASS_ORDER.index("index_and_predicate")
        self.vectorized = stage >= PASS_ORDER.index("vectorize_and_unroll")
        self.buffered = stage >= PASS_ORDER.index("circular_buffer_loops")
        self.cp_async_lowered = stage >= PASS_ORDER.index("cp_async_buffer_loops")
        self.cp_async_copies = self.cp_async_waits = 0
        self.launched = stage >= PASS_ORDER.index("launch_config")
        self.param_buffers = {id(p.buffer) for p in kernel.params if p.buffer is not None}
        self.param_names = {p.name for p in kernel.params}
        self.loop_var_names = {f.var.name for f in K.walk(kernel.body) if isinstance(f, K.ForLoop)}
        self.allocs_seen: set = set()
        self.mbarriers: set = set()
        self.loops_seen: dict = {}
        self.grid_syncs = 0
        self.preamble = set(_PREAMBLE_VARS) if any(
            isinstance(s, K.GridReduce) for s in K.walk(kernel.body)) else set()

    def fail(self, msg: str, stmt=None):
        where = f" (at `{_describe(stmt)}`)" if stmt is not None else ""
        raise KernelIRError(f"kernel {self.k.name} after pass {self.after!r}: {msg}{where}")

    # Expressions ---------------------------------------------------------------------------
    def check_expr(self, e, scope: _Scope, stmt, what: str) -> None:
        if e is None:
            return
        for v in _vars(e, []):
            name = v.name
            if name in self.loop_var_names:
                if not any(f.var.name == name for f in scope.loops()):
                    self.fail(f"loop variable {name} is used in {what} outside its loop", stmt)
            elif not (name in self.param_names or scope.has_var(name) or name in self.preamble):
                self.fail(f"variable {name} in {what} is neither a loop variable in scope, a kernel "
                          "parameter nor defined before", stmt)
        for ti in _tensor_indices(e, []):
            self.check_buffer(ti.buffer, scope, stmt, what)

    def check_buffer(self, b, scope: _Scope, stmt, what: str) -> None:
        if id(b) in self.param_buffers or scope.has_buffer(b):
            return
        self.fail(f"buffer {b.name} ({b.memory}) in {what} is neither a kernel parameter nor "
                  "allocated in an enclosing scope before this use", stmt)

    def check_fusion_operand(self, v, scope: _Scope, stmt, what: str) -> None:
        from ..ir.scalar import Scalar
        from ..ir.tensor import MemoryType, TensorView
        if isinstance(v, (K.TensorIndex, K.ScalarValue)):
            self.fail(f"{what} is already indexed ({v!r}) before index_and_predicate", stmt)
        if not isinstance(v, (TensorView, Scalar)):
            self.fail(f"{what} is {type(v).__name__}, not a fusion Val", stmt)
        if not (self.allocated and isinstance(v, TensorView)):
            return
        bufs = getattr(self.k.ctx, "buffers", {}) or {}
        buf = bufs.get(v)
        if buf is None:
            self.fail(f"{what} T{v.name} has no buffer", stmt)
        if v.memory_type == MemoryType.Global:
            if id(buf) not in self.param_buffers:
                self.fail(f"{what} T{v.name} is global but not a kernel parameter", stmt)
        else:
            self.check_buffer(buf, scope, stmt, f"{what} T{v.name}")

    def check_indexed_operand(self, v, scope: _Scope, stmt, what: str) -> None:
        if not isinstance(v, (K.TensorIndex, K.ScalarValue)):
            self.fail(f"{what} is {type(v).__name__} ({v!r}), not a TensorIndex or ScalarValue "
                      "after index_and_predicate", stmt)
        if isinstance(v, K.TensorIndex):
            self.check_buffer(v.buffer, scope, stmt, what)
            self.check_expr(v.index, scope, stmt, f"the index of {what}")

    # Statements ----------------------------------------------------------------------------
    def body(self, stmts, scope: _Scope) -> None:
        for s in stmts:
            self.stmt(s, scope)

    def stmt(self, s, scope: _Scope) -> None:
        fn = getattr(self, "_" + type(s).__name__, None)
        if fn is not None:
            fn(s, scope)

    def in_epilogue(self, scope) -> bool:
        """Inside a circular-buffer epilogue, which repeats the main loop's loops and buffers."""
        return self.buffered and any(f.label == K.CB_EPILOGUE for f in scope.loops())

    def check_roles(self, s: K.IfThenElse) -> None:
        """Warp roles run at the same time: a block-wide barrier in either one waits for
        threads that never come; each role starts with its setmaxnreg."""
        for role, body in (("producer", s.then_body), ("compute", s.else_body)):
            if not body or not isinstance(body[0], K.SetMaxNReg):
                self.fail(f"the {role} role does not start with setmaxnreg", s)
            for x in K.walk(body):
                if isinstance(x, K.BlockSync) and x.barrier_id is None:
                    self.fail(f"__syncthreads inside the {role} role of a warp-specialized "
                              "kernel", x)
                if isinstance(x, K.BlockReduce) and x.barrier is None:
                    self.fail(f"a block reduction over the whole block inside the {role} role "
                              "of a warp-specialized kernel", x)
                if isinstance(x, K.GridSync) and role == "compute" and x.barrier is not None:
                    continue        # the compute threads' named barrier: see lower/warp_specialize
                if isinstance(x, (K.GridReduce, K.ClusterReduce, K.GridSync)):
                    self.fail(f"a {type(x).__name__} inside the {role} role of a "
                              "warp-specialized kernel (the other role never joins it)", x)

    def _ForLoop(self, s: K.ForLoop, scope):
        if not isinstance(s.var, K.Var):
            self.fail(f"loop variable {s.var!r} is not a Var", s)
        for what, e in (("start", s.start), ("stop", s.stop), ("step", s.step)):
            self.check_expr(e, scope, s, f"the loop {what}")
        # A scan's fixup repeats the scan's loops (lower/scans.py).
        repeat = K.SCAN_FIXUP in (s.label, *(f.label for f in scope.loops()))
        if s.loop is not None and not self.in_epilogue(scope) and not repeat:
            if id(s.loop) in self.loops_seen:
                self.fail(f"lowering loop {s.loop!r} is emitted twice", s)
            self.loops_seen[id(s.loop)] = s
        if any(f.var.name == s.var.name for f in scope.loops()):
            self.fail(f"loop variable {s.var.name} shadows an enclosing loop's", s)
        self.body(s.body, _Scope(scope, loop=s))

    def _IfThenElse(self, s: K.IfThenElse, scope):
        self.check_expr(s.cond, scope, s, "the condition")
        if s.roles:
            self.check_roles(s)
        self.body(s.then_body, _Scope(scope, cond=s))
        self.body(s.else_body, _Scope(scope, cond=s))

    def _Allocate(self, s: K.Allocate, scope):
        b = s.buffer
        if id(b) in self.allocs_seen and not self.in_epilogue(scope):
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

    def _InitValue(self, s: K.InitValue, scope):
        self.check_buffer(s.out, scope, s, "the initialized accumulator")
        if self.indexed and not isinstance(s.value, K.ScalarValue):
            self.fail(f"init value {s.value!r} is not a ScalarValue after index_and_predicate", s)

    def _TensorOp(self, s: K.TensorOp, scope):
        self.check_nest(s, scope)
        if self.cp_async_lowered and _is_cp_async_load(s):
            self.fail("a cp.async load is still a TensorOp after cp_async_buffer_loops", s)
        if self.indexed:
            self.check_indexed_operand(s.out, scope, s, "the output")
            if not isinstance(s.out, K.TensorIndex):
                self.fail("the output is not a TensorIndex", s)
            for k, v in enumerate(s.ins):
                self.check_indexed_operand(v, scope, s, f"input {k}")
            if not isinstance(s.predicate, K.KExpr) or isinstance(s.predicate, (K.TensorIndex,
                                                                                K.ScalarValue)):
                self.fail(f"predicate {s.predicate!r} is not a kernel expression", s)
            self.check_expr(s.predicate, scope, s, "the predicate")
        else:
            self.check_fusion_operand(s.out, scope, s, "the output")
            for k, v in enumerate(s.ins):
                self.check_fusion_operand(v, scope, s, f"input {k}")
        self.check_vector(s)

    def check_nest(self, s: K.TensorOp, scope) -> None:
        if not self.has_loops or not s.nest:
            return
        enclosing = [f.loop for f in scope.loops() if f.loop is not None]
        expected = [lp for lp in _nest_outside_vector(s, self.k.replaced_loops)
                    if not (self.buffered and isinstance(getattr(lp, "var", None), K.Var)
                            and scope.has_var(lp.var.name))]
        if [id(x) for x in enclosing] != [id(x) for x in expected]:
            self.fail(f"the loops around the op {enclosing} are not its nest {expected}", s)

    def check_vector(self, s: K.TensorOp) -> None:
        if s.vector == 1:
            if self.indexed:
                for v in [s.out] + list(s.ins):
                    if isinstance(v, K.TensorIndex) and v.vector != 1:
                        self.fail(f"{v!r} is a vector access in a scalar op", s)
            return
        if s.vector not in _VECTOR_WIDTHS:
            self.fail(f"vector width {s.vector} is not one of {_VECTOR_WIDTHS}", s)
        for v in [s.out] + list(s.ins):
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

    def _reduce_common(self, s, scope, thread_dims, block_dims) -> None:
        named = getattr(s, "barrier", None) is not None
        for c in scope.ifs():
            # A warp-role split is not a predicate for a reduction on the role's own named
            # barrier: every thread of the role reaches it.
            if not K.is_true(c.cond) and not (c.roles and named):
                self.fail(f"{type(s).__name__} is inside the predicated branch `if {c.cond!r}`: "
                          "threads that skip it would hang the others", s)
        for f in scope.loops():
            d = _THREAD_PT.get(f.parallel)
            if d is not None and d in thread_dims:
                self.fail(f"{type(s).__name__} over threadIdx.{d} is inside a loop bound to "
                          f"threadIdx.{d}", s)
            d = _BLOCK_PT.get(f.parallel)
            if d is not None and d in block_dims:
                self.fail(f"{type(s).__name__} over blockIdx.{d} is inside a loop bound to "
                          f"blockIdx.{d}", s)
        if self.indexed:
            if not s.values:
                self.fail(f"{type(s).__name__} has no values after index_and_predicate", s)
            for v in s.values:
                if not isinstance(v, K.TensorIndex):
                    self.fail(f"reduced value {v!r} is not a TensorIndex", s)
                if v.buffer.memory != "local":
                    self.fail(f"reduced value {v!r} is not in registers", s)
                self.check_buffer(v.buffer, scope, s, "the reduced value")
                self.check_expr(v.index, scope, s, "the reduced value's index")
        if s.op not in ("sum", "max", "min"):
            self.fail(f"unknown reduction op {s.op!r}", s)

    def _BlockReduce(self, s: K.BlockReduce, scope):
        if not s.dims or any(d not in "xyz" for d in s.dims):
            self.fail(f"block reduction dims {s.dims!r}", s)
        self._reduce_common(s, scope, set(s.dims), set())

    def _row_wide(self, s, scope) -> None:
        """A step across threadIdx.x that synchronizes the block (a block scan, a block top-k):
        every thread reaches it, outside any predicated branch and any loop bound to
        threadIdx.x (a cluster's blockIdx.y loop is a scope every CTA enters)."""
        name = type(s).__name__
        for c in scope.ifs():
            if not K.is_true(c.cond):
                self.fail(f"{name} is inside the predicated branch `if {c.cond!r}`: threads "
                          "that skip it would hang the others", s)
        for f in scope.loops():
            if _THREAD_PT.get(f.parallel) == "x":
                self.fail(f"{name} over threadIdx.x is inside a loop bound to threadIdx.x", s)

    def _BlockTopK(self, s: K.BlockTopK, scope):
        self._row_wide(s, scope)
        for what, b in (("row", s.chunk), ("values", s.values), ("indices", s.indices)):
            if b.memory != "local":
                self.fail(f"the top-k's {what} {b.name} is not a register buffer", s)
            self.check_buffer(b, scope, s, f"the top-k's {what}")
        if s.workspace.memory != "shared":
            self.fail(f"the top-k's workspace {s.workspace.name} is not shared memory", s)
        if not 1 <= s.k <= (s.stride or 1) * s.values.size.value:
            self.fail(f"k {s.k} does not fit {s.values.size!r} results of {s.stride} threads", s)

    def _BlockScan(self, s: K.BlockScan, scope):
        if s.op not in ("sum", "prod"):
            self.fail(f"unknown scan op {s.op!r}", s)
        self._row_wide(s, scope)
        v = s.carry
        if not isinstance(v, K.TensorIndex) or v.buffer.memory != "local":
            self.fail(f"scanned value {v!r} is not a register TensorIndex", s)
        self.check_buffer(v.buffer, scope, s, "the scanned value")
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
            if c.roles and s.barrier is not None:
                continue    # the compute role of every block reaches it (check_roles)
            if not K.is_true(c.cond):
                self.fail(f"GridSync is inside the predicated branch `if {c.cond!r}`: blocks "
                          "that skip it would hang the others", s)
        if s.sync_buffer is None or id(s.sync_buffer) not in self.param_buffers:
            self.fail("the grid barrier's buffer is not a kernel parameter", s)
        self.grid_syncs += 1

    def _bar(self, ref, scope, s) -> None:
        if not isinstance(ref, K.MBarrierRef):
            self.fail(f"{ref!r} is not an mbarrier", s)
        if id(ref.bars) not in self.mbarriers:
            self.fail(f"mbarriers {ref.bars.name} are used before their allocation", s)
        self.check_expr(ref.index, scope, s, "the mbarrier index")

    def _MBarrierAlloc(self, s, scope):
        self.mbarriers.add(id(s.bars))

    def _MBarrierInit(self, s, scope):
        self._bar(s.bar, scope, s)

    _MBarrierArrive = _MBarrierInval = _MBarrierInit

    def _MBarrierWait(self, s, scope):
        self._bar(s.bar, scope, s)
        self.check_expr(s.parity, scope, s, "the parity")

    def _BulkLoad(self, s, scope):
        self._bar(s.bar, scope, s)
        for what, a, memory in (("destination", s.dst, "shared"), ("source", s.src, "global")):
            if not isinstance(a, K.TensorIndex) or a.buffer.memory != memory:
                self.fail(f"the bulk copy's {what} {a!r} is not in {memory} memory", s)
            self.check_buffer(a.buffer, scope, s, f"the bulk copy's {what}")
            self.check_expr(a.index, scope, s, f"the bulk copy's {what} index")
        self.check_expr(s.predicate, scope, s, "the bulk copy's predicate")

    def _TensorMapLoad(self, s, scope):
        self._bar(s.bar, scope, s)
        if not isinstance(s.dst, K.TensorIndex) or s.dst.buffer.memory != "shared":
            self.fail(f"the tensor-map copy's destination {s.dst!r} is not in shared memory", s)
        self.check_buffer(s.dst.buffer, scope, s, "the tensor-map copy's destination")
        self.check_expr(s.dst.index, scope, s, "the tensor-map copy's destination index")
        params = {p.name: p for p in self.k.params}
        p = params.get(s.tmap.name)
        if p is None or p.kind != "tmap" or p.source != ("tmap", s.map):
            self.fail(f"the tensor-map copy's map {s.tmap!r} is not a tensor-map parameter "
                      f"describing {s.map}", s)
        if len(s.coords) != len(s.map.box):
            self.fail(f"the tensor-map copy has {len(s.coords)} coordinates for a "
                      f"{len(s.map.box)}-D box", s)
        for c in s.coords:
            self.check_expr(c, scope, s, "the tensor-map copy's coordinate")
        self.check_expr(s.predicate, scope, s, "the tensor-map copy's predicate")

    def _CpAsyncCopy(self, s: K.CpAsyncCopy, scope):
        for what, a, memory in (("destination", s.dst, "shared"), ("source", s.src, "global")):
            if not isinstance(a, K.TensorIndex) or a.buffer.memory != memory:
                self.fail(f"the cp.async copy's {what} {a!r} is not in {memory} memory", s)
            self.check_buffer(a.buffer, scope, s, f"the cp.async copy's {what}")
            self.check_expr(a.index, scope, s, f"the cp.async copy's {what} index")
            if s.bytes != a.vector * a.buffer.dtype.size:
                self.fail(f"a cp.async copy of {s.bytes} bytes moves {a!r} ({a.vector} x "
                          f"{a.buffer.dtype.size} bytes)", s)
        if s.bytes not in (4, 8, 16):
            self.fail(f"a cp.async copy moves 4, 8 or 16 bytes, not {s.bytes}", s)
        self.check_expr(s.predicate, scope, s, "the cp.async copy's predicate")
        self.cp_async_copies += 1

    def _CpAsyncWait(self, s: K.CpAsyncWait, scope):
        if not (isinstance(s.pending, int) and not isinstance(s.pending, bool)
                and s.pending >= 0):
            self.fail(f"cp.async.wait_group {s.pending!r} is not a non-negative constant", s)
        self.cp_async_waits += 1

    def _BlockSync(self, s: K.BlockSync, scope):
        if s.count is not None:
            self.check_expr(s.count, scope, s, "the barrier's thread count")

    # Whole kernel --------------------------------------------------------------------------
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
        ctx = k.ctx
        if self.has_loops and ctx is not None and hasattr(ctx, "all_loops"):
            for lp in ctx.all_loops():
                if id(lp) in self.loops_seen or id(lp) in k.replaced_loops:
                    continue
                if self.vectorized and getattr(lp.parallel, "name", "") == "Vectorize":
                    continue   # folded into vector accesses
                self.fail(f"lowering loop {lp!r} is never emitted")
        if self.launched:
            lc = k.launch
            if lc is None:
                self.fail("no launch configuration after launch_config")
            if len(lc.grid) != 3 or len(lc.block) != 3:
                self.fail(f"grid {lc.grid} / block {lc.block} are not three dims each")
            if self.grid_syncs and not lc.cooperative:
                self.fail("the kernel synchronizes the grid but its launch is not cooperative")
            static = [b if isinstance(b, int) else getattr(b, "value", None) for b in lc.block]
            if all(isinstance(b, int) for b in static):
                n = static[0] * static[1] * static[2]
                if n > 1024 or n < 1:
                    self.fail(f"block {static} has {n} threads (1..1024)")


def _is_cp_async_load(s: K.TensorOp) -> bool:
    from ..ir.exprs import LoadKind, LoadStoreOp
    return isinstance(s.expr, LoadStoreOp) and s.expr.load_kind == LoadKind.CpAsync


def verify_kernel(kernel: K.Kernel, after: str) -> None:
    """Raise KernelIRError if `kernel`, as left by pass `after`, is malformed."""
    _Verifier(kernel, after).run()

