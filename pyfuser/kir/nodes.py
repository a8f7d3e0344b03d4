"""Kernel IR: loops, conditionals, allocations, indexed tensor operations and barriers.

Lowering turns a scheduled fusion into a Kernel of these nodes; codegen prints them as CUDA C++
one node kind at a time, with no decisions of its own. Index arithmetic is a small expression
tree (Var, Const, Bin, ...) so passes can build, simplify and compare it.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from ..ir.dtype import DataType
from ..ir.exprs import GatherOp, RandOp, WindowOp

# Field roles ------------------------------------------------------------------------------------
# Every kernel-IR node is a slotted dataclass (a pass cannot attach an attribute it did not
# declare) whose every field has one role, declared with `@roles`. The rewriter base and the
# verifier (kir/rewrite.py, kir/verifier.py) visit a node through its roles, so a new node kind
# is rewritten and checked like the others, and a node kind without roles is an error there.
BODY = "body"          # a list of statements (a nested scope)
DEFINES = "defines"    # the Var the statement defines (a loop index, a hoisted scalar)
OUT = "out"            # the access it writes (a TensorIndex; a fusion Val before indexing)
EXPR = "expr"          # a kernel expression it uses (or None; a fusion Val before indexing)
EXPRS = "exprs"        # a list or tuple of such expressions
BUFFER = "buffer"      # a Buffer it reads, writes or allocates (or None)
BUFFERS = "buffers"    # a tuple of Buffers (or None)
DATA = "data"          # anything else: constants, fusion objects, labels; never rewritten
_ROLES = (BODY, DEFINES, OUT, EXPR, EXPRS, BUFFER, BUFFERS, DATA)

# node class -> {field name: role}, for every statement and expression kind
STMT_KINDS: dict = {}
EXPR_KINDS: dict = {}


def roles(**by_role):
    """Declare the role of each field of a kernel-IR node class: `@roles(expr=("a", "b"),
    data=("op",))`. Every dataclass field must be named exactly once."""
    unknown = set(by_role) - set(_ROLES)
    if unknown:
        raise TypeError(f"unknown field roles {sorted(unknown)}; roles are {_ROLES}")

    def declare(cls):
        table = {f: r for r, names in by_role.items() for f in names}
        named = [f for names in by_role.values() for f in names]
        fields = [f.name for f in dataclasses.fields(cls)]
        if len(named) != len(table) or set(table) != set(fields):
            raise TypeError(f"{cls.__name__}: field roles {sorted(named)} do not name each of its "
                            f"fields {sorted(fields)} exactly once")
        kinds = EXPR_KINDS if issubclass(cls, KExpr) else STMT_KINDS
        kinds[cls] = table
        return cls
    return declare


# Index and scalar expressions -------------------------------------------------------------------
class KExpr:
    """An integer or scalar expression inside a kernel."""

    __slots__ = ()

    def __add__(self, o):
        return add(self, o)

    def __radd__(self, o):
        return add(o, self)

    def __mul__(self, o):
        return mul(self, o)

    def __rmul__(self, o):
        return mul(o, self)

    def __sub__(self, o):
        return sub(self, o)


@roles(data=("name", "dtype"))
@dataclasses.dataclass(eq=False, slots=True)
class Var(KExpr):
    """A named value: loop indices, kernel parameters, hoisted scalars."""

    name: str
    dtype: str = "index"   # index | int | float | double | bool | int64

    def __repr__(self):
        return self.name


@roles(data=("value", "dtype"))
@dataclasses.dataclass(frozen=True, slots=True)
class Const(KExpr):
    value: Any
    dtype: str = "index"

    def __repr__(self):
        return repr(self.value)


@roles(data=("name",))
@dataclasses.dataclass(frozen=True, slots=True)
class Special(KExpr):
    """threadIdx.x, blockIdx.y, blockDim.x, gridDim.x, ..."""

    name: str

    def __repr__(self):
        return self.name


@roles(data=("op",), expr=("a", "b"))
@dataclasses.dataclass(frozen=True, eq=False, slots=True)
class Bin(KExpr):
    """a op b; op in + - * / % ceilDiv min max < <= > >= == != && || ^ (bitwise xor of
    non-negative integers: shared-memory swizzles)."""

    op: str
    a: KExpr
    b: KExpr

    def __repr__(self):
        if self.op in ("ceilDiv", "min", "max"):
            return f"{self.op}({self.a!r}, {self.b!r})"
        return f"({self.a!r} {self.op} {self.b!r})"


@roles(expr=("a",))
@dataclasses.dataclass(frozen=True, eq=False, slots=True)
class Not(KExpr):
    a: KExpr


@roles(expr=("cond", "a", "b"))
@dataclasses.dataclass(frozen=True, eq=False, slots=True)
class Select(KExpr):
    cond: KExpr
    a: KExpr
    b: KExpr


def const(v, dtype="index") -> Const:
    return Const(v, dtype)


def _wrap(x) -> KExpr:
    if isinstance(x, KExpr):
        return x
    if isinstance(x, bool):
        return Const(x, "bool")
    if isinstance(x, int):
        return Const(x)
    raise TypeError(f"not a kernel expression: {x!r}")


def _cv(x):
    return x.value if isinstance(x, Const) else None


def add(a, b) -> KExpr:
    a, b = _wrap(a), _wrap(b)
    va, vb = _cv(a), _cv(b)
    if va is not None and vb is not None:
        return Const(va + vb)
    if va == 0:
        return b
    if vb == 0:
        return a
    return Bin("+", a, b)


def sub(a, b) -> KExpr:
    a, b = _wrap(a), _wrap(b)
    va, vb = _cv(a), _cv(b)
    if va is not None and vb is not None:
        return Const(va - vb)
    if vb == 0:
        return a
    return Bin("-", a, b)


def mul(a, b) -> KExpr:
    a, b = _wrap(a), _wrap(b)
    va, vb = _cv(a), _cv(b)
    if va is not None and vb is not None:
        return Const(va * vb)
    if va == 0 or vb == 0:
        return Const(0)
    if va == 1:
        return b
    if vb == 1:
        return a
    return Bin("*", a, b)


def div(a, b) -> KExpr:
    a, b = _wrap(a), _wrap(b)
    va, vb = _cv(a), _cv(b)
    if va is not None and vb is not None:
        return Const(va // vb)
    if vb == 1 or va == 0:
        return a
    return Bin("/", a, b)


def mod(a, b) -> KExpr:
    a, b = _wrap(a), _wrap(b)
    va, vb = _cv(a), _cv(b)
    if va is not None and vb is not None:
        return Const(va % vb)
    if vb == 1 or va == 0:
        return Const(0)
    return Bin("%", a, b)


def ceil_div(a, b) -> KExpr:
    a, b = _wrap(a), _wrap(b)
    va, vb = _cv(a), _cv(b)
    if va is not None and vb is not None:
        return Const(-(-va // vb))
    if vb == 1:
        return a
    return Bin("ceilDiv", a, b)


def lt(a, b) -> KExpr:
    a, b = _wrap(a), _wrap(b)
    va, vb = _cv(a), _cv(b)
    if va is not None and vb is not None:
        return Const(va < vb, "bool")
    return Bin("<", a, b)


def eq(a, b) -> KExpr:
    a, b = _wrap(a), _wrap(b)
    va, vb = _cv(a), _cv(b)
    if va is not None and vb is not None:
        return Const(va == vb, "bool")
    return Bin("==", a, b)


def and_(a, b) -> KExpr:
    a, b = _wrap(a), _wrap(b)
    if _cv(a) is True:
        return b
    if _cv(b) is True:
        return a
    if _cv(a) is False or _cv(b) is False:
        return Const(False, "bool")
    return Bin("&&", a, b)


def all_of(conds) -> KExpr:
    out: KExpr = Const(True, "bool")
    for c in conds:
        out = and_(out, c)
    return out


def is_true(e: KExpr) -> bool:
    return isinstance(e, Const) and e.value is True


# Buffers and memory accesses ---------------------------------------------------------------------
@dataclasses.dataclass(eq=False, slots=True)
class Buffer:
    """Memory a kernel reads or writes: a kernel parameter (global) or an allocation."""

    name: str
    dtype: DataType
    memory: str                        # global | shared | local
    size: KExpr | None = None          # elements; None for parameters
    tv: Any = None                     # the fusion TensorView it holds, if any
    align: int = 16

    def __repr__(self):
        return self.name


@roles(buffer=("buffer",), expr=("index",), data=("vector",))
@dataclasses.dataclass(eq=False, slots=True)
class TensorIndex(KExpr):
    """buffer[index]; `vector` > 1 reads or writes that many consecutive elements at once."""

    buffer: Buffer
    index: KExpr
    vector: int = 1

    def __repr__(self):
        v = f"<{self.vector}>" if self.vector > 1 else ""
        return f"{self.buffer.name}[{self.index!r}]{v}"


# A gather's index value where codegen and the interpreter read its source (lower/index.py
# _gather_read): the variable each defines around the read.
GATHER_INDEX = "pf_gi"


def gathered_at(src: "TensorIndex", stride: KExpr) -> "TensorIndex":
    """A gather's read of its source: `src` (the source at out's index along its other dims)
    plus the gathered index times the gathered dim's stride (as many elements as src reads)."""
    return TensorIndex(src.buffer, add(src.index, mul(Var(GATHER_INDEX), stride)), src.vector)


@roles(data=("scalar", "dtype"))
@dataclasses.dataclass(eq=False, slots=True)
class ScalarValue(KExpr):
    """A fusion scalar (constant, runtime input or derived) used as an operand."""

    scalar: Any
    dtype: DataType

    def __repr__(self):
        from ..ir.scalar import scalar_str
        return scalar_str(self.scalar)


# Statements -----------------------------------------------------------------------------------
class Stmt:
    """A kernel-IR statement."""

    __slots__ = ()


@roles(defines=("var",), expr=("start", "stop", "step", "count_before"), body=("body",),
       data=("parallel", "unroll", "iter_domain", "loop", "label"))
@dataclasses.dataclass(eq=False, slots=True)
class ForLoop(Stmt):
    """for var in [start, stop) step `step`. A loop bound to a thread or block dimension prints
    no `for`: its index is that dimension (`parallel` names it)."""

    var: Var
    start: KExpr
    stop: KExpr
    step: KExpr
    body: list
    parallel: str = "Serial"       # ParallelType name
    unroll: bool = False
    iter_domain: Any = None        # the promoted IterDomain this loop iterates
    loop: Any = None               # the lowering Loop it came from
    label: str = ""                # e.g. CB_MAIN_LOOP
    # A loop whose trips depend on an enclosing loop's index (a stream-K matmul's k blocks of a
    # work unit): the iterations it ran in that loop's earlier iterations, an expression of
    # them, so that a warp-specialized pipeline's stage counter can run on across the nest
    # (lower/pipeline.py _Chain). None: the nest is rectangular.
    count_before: Any = None

    @property
    def rolled(self) -> bool:
        """A serial loop kept rolled whatever its extent (#pragma unroll 1, never unrolled):
        its IterDomain is marked so (IterDomain.rolled: the looped inner persistent steps)."""
        return self.parallel == "Serial" and getattr(self.iter_domain, "rolled", False)


@roles(expr=("cond",), body=("then_body", "else_body"))
@dataclasses.dataclass(eq=False, slots=True)
class IfThenElse(Stmt):
    """if (cond) then_body else else_body."""

    cond: KExpr
    then_body: list
    else_body: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True, slots=True)
class WarpRole:
    """One role of a warp-specialized kernel: `name` (producer, compute 0, ...), the setmaxnreg
    register count its warp groups move to, and `barrier` = (named barrier id, threads) that
    stands for a block barrier among its threads (None: the producer, which has none)."""

    name: str
    registers: int
    barrier: tuple | None = None


@roles(expr=("cond",), body=("body",), data=("role",))
@dataclasses.dataclass(eq=False, slots=True)
class RoleBody(Stmt):
    """The statements of one warp role (only inside a RoleSplit): the threads for which `cond`
    holds and no earlier role's does (cond None: all the others)."""

    role: WarpRole
    cond: KExpr | None
    body: list


@roles(body=("roles",))
@dataclasses.dataclass(eq=False, slots=True)
class RoleSplit(Stmt):
    """The block's threads split into warp roles (RoleBody statements, in order) that run at the
    same time and synchronize only through mbarriers and named barriers: a producer that fills
    circular buffers and compute roles that use them (lower/pipeline.py)."""

    roles: list


@roles(buffer=("buffer",))
@dataclasses.dataclass(eq=False, slots=True)
class Allocate(Stmt):
    buffer: Buffer


@roles(out=("out",), expr=("predicate", "else_value", "carry"), exprs=("ins",),
       data=("expr", "accumulate", "vector", "nest", "scan_fixup", "known", "quotient_flag"))
@dataclasses.dataclass(eq=False, slots=True)
class TensorOp(Stmt):
    """One element (or one vector) of a fusion expression.

    Before indexing, `out` and `ins` hold fusion Vals; after, TensorIndex / ScalarValue.
    `predicate` guards it (True when always valid). For reductions `accumulate` means
    out = op(out, in).
    """

    expr: Any
    out: Any
    ins: list
    predicate: KExpr = dataclasses.field(default_factory=lambda: Const(True, "bool"))
    accumulate: bool = False
    # A predicated-off read yields this value instead (reductions read their init).
    else_value: Any = None
    vector: int = 1
    nest: list = dataclasses.field(default_factory=list)   # lowering Loops around it
    # A scan (ScanOp, lower/scans.py): `carry` is the thread's running value (a register
    # TensorIndex). The scan step is `carry = op(carry, in); out = carry`; the fixup after the
    # block scan (`scan_fixup`) is `out = op(carry, in)`, carry then the exclusive prefix.
    carry: Any = None
    scan_fixup: bool = False
    # Set by index_and_predicate: the index graph's values known around the op (IterDomain ->
    # index), which later passes read to index the op's operands again (a cp.async copy's
    # readers, a tensor-map copy's row).
    known: Any = None
    # Set by shared_divisor_quotients on a float division in the fast body of a
    # CheckedQuotients: the name of its flag, which the quotient clears where its operands are
    # outside the range in which the reciprocal's quotient is exactly a / b.
    quotient_flag: str | None = None


def vector_operands(op: TensorOp) -> int:
    """How many of op's leading inputs a vector op reads as vectors (lower/vectorize.py): a
    gather's or window's source read alone (a gather's index and error record, a window's
    condition and fill, are one for all lanes), none of a random op's (scalars and its first
    element's index), all of any other op's."""
    if isinstance(op.expr, (GatherOp, WindowOp)):
        return 1
    if isinstance(op.expr, RandOp):
        return 0
    return len(op.ins)


@roles(buffer=("out",), expr=("value",), data=("tv",))
@dataclasses.dataclass(eq=False, slots=True)
class InitValue(Stmt):
    """out = init (reduction accumulators)."""

    out: Any
    value: Any
    tv: Any = None


@roles(exprs=("values",), buffer=("workspace",),
       data=("op", "dtype", "dims", "barrier", "tv", "inner_loops", "role", "workspace_offset"))
@dataclasses.dataclass(eq=False, slots=True)
class BlockReduce(Stmt):
    """All-reduce of `values` (registers) across the block's thread dims in `dims`; afterwards
    every participating thread holds the result. Several values (siblings grouped by
    lower/grouped_reductions.py) are reduced in one pass (reduced_values)."""

    values: list
    op: str                        # sum | max | min
    dtype: DataType
    dims: tuple                    # e.g. ("x",) or ("x", "y")
    workspace: Buffer
    barrier: Any = None            # (named barrier id, thread count) for warp-specialized groups
    # Set by lower_reductions: the reduced tensor, and the loops inside the reduction that
    # iterate its elements (index_and_predicate groups their values into one pass).
    tv: Any = None
    inner_loops: list = dataclasses.field(default_factory=list)
    # The compute role (0, 1, ...) whose threads it reduces (pipeline_loads): compute roles run
    # at the same time, each reduces in its own copy of the block-reduction workspace, which
    # starts `workspace_offset` elements into it (launch_config lays the copies out).
    role: int = 0
    workspace_offset: int = 0


@roles(exprs=("values",), buffer=("workspace", "sync_buffer", "smem_workspace"),
       data=("op", "dtype", "dims", "thread_dims", "tv", "inner_loops", "follows_last_block"))
@dataclasses.dataclass(eq=False, slots=True)
class GridReduce(Stmt):
    """Reduce `values` across blocks of the grid dims in `dims` through a global workspace: the
    last block of each kept coordinate to write its partials combines them (pf_grid_last).
    With `follows_last_block`, a grid reduction after another over the same dims: the block
    that was last there waits for every block's partials here and combines them, so that one
    block holds every result (lower/reductions.py)."""

    values: list
    op: str
    dtype: DataType
    dims: tuple
    workspace: Buffer
    sync_buffer: Buffer
    smem_workspace: Buffer
    # The thread dims the block step before it reduced: the last block's combine ends with a
    # block all-reduce over them (codegen), whose shared memory launch_config sizes.
    thread_dims: tuple = ()
    # Set by lower_reductions: the reduced tensor, and the loops inside the reduction that
    # iterate its elements (index_and_predicate groups their values into one pass).
    tv: Any = None
    inner_loops: list = dataclasses.field(default_factory=list)
    follows_last_block: bool = False


def reduced_values(s) -> int:
    """The registers a BlockReduce or GridReduce reduces at once: the vectors of all its
    values (siblings grouped into it included)."""
    return sum(v.vector for v in s.values) if s.values else 1


@roles(exprs=("values",), data=("op", "dtype", "dim", "size", "tv", "inner_loops"))
@dataclasses.dataclass(eq=False, slots=True)
class ClusterReduce(Stmt):
    """All-reduce of `values` (one per row of the block, after the block reduction over x)
    across the `size` CTAs of the thread-block cluster along block dim `dim`, through
    distributed shared memory; every CTA gets the same result."""

    values: list
    op: str
    dtype: DataType
    dim: str                      # the block dim the cluster spans
    size: int                     # CTAs per cluster
    # Set by lower_reductions: the reduced tensor, and the loops inside the reduction that
    # iterate its elements (index_and_predicate groups their values into one pass).
    tv: Any = None
    inner_loops: list = dataclasses.field(default_factory=list)


@roles(expr=("carry",), buffers=("chain",), data=("op", "dtype", "cluster"))
@dataclasses.dataclass(eq=False, slots=True)
class BlockScan(Stmt):
    """Exclusive scan of `carry` (a register TensorIndex: each thread's chunk total, in
    threadIdx.x order within each row of the block) across threadIdx.x: afterwards each thread's
    carry is op of the totals of the threads before it in its row (the identity for the first).
    With `cluster` (the block dim and CTA count a thread-block cluster spans), the totals of the
    row's CTAs of lower rank are combined in front, through distributed shared memory (every
    CTA of the cluster must reach it). With `chain` (two global buffers: values, flags), the
    totals of the row's blocks before it along blockIdx.y are combined in front instead,
    through global memory (scan.cuh's chained_exclusive_scan_row: a decoupled look-back). Uses the block-reduction shared workspace."""

    carry: Any
    op: str                        # sum | prod
    dtype: DataType
    cluster: Any = None            # (dim, size) or None
    chain: Any = None              # (values Buffer, flags Buffer) or None


@roles(buffer=("chunk", "values", "indices", "workspace"), expr=("extent",),
       data=("k", "largest", "chunk_size", "stride"))
@dataclasses.dataclass(eq=False, slots=True)
class BlockTopK(Stmt):
    """The k largest (smallest) elements of each row of the block and their indices, the row
    held in registers across threadIdx.x: thread t's `chunk` (a register buffer of `chunk_size`
    elements) holds elements t * chunk_size + e of the row, those below `extent` valid. Result
    j (in order: largest first, of equal values the lowest index first, NaN above every number)
    lands in register j / `stride` of `values` and `indices` (int64) in thread j % `stride`
    (stride 0: in register j of every thread; k = 1 as a broadcast dim).
    Every thread of the block must reach it (it synchronizes the block); `workspace` is a shared
    buffer of rows x (2 x warps per row + k) int64 slots (lower/topk.py sizes it)."""

    chunk: Buffer
    values: Buffer
    indices: Buffer
    workspace: Buffer
    extent: KExpr                  # the row's length
    k: int
    largest: bool
    chunk_size: int
    stride: int


@roles(data=("barrier_id",), expr=("count",))
@dataclasses.dataclass(eq=False, slots=True)
class BlockSync(Stmt):
    """__syncthreads(), or a named barrier among `count` threads."""

    barrier_id: int | None = None
    count: KExpr | None = None


@roles()
@dataclasses.dataclass(eq=False, slots=True)
class ClusterSync(Stmt):
    """barrier.cluster arrive (release) and wait (acquire): every thread of every CTA of the
    thread-block cluster. Before peers signal each other's mbarriers (their inits published) and
    before a CTA exits while peers may still arrive on its barriers or copy into it."""


@roles(data=("barrier_id",), expr=("count",))
@dataclasses.dataclass(eq=False, slots=True)
class NamedBarrierArrive(Stmt):
    """bar.arrive: the threads that reach it count towards named barrier `barrier_id`'s `count`
    without waiting (another role's bar.sync on it waits for them: an ordered hand-over)."""

    barrier_id: int
    count: KExpr


@roles(buffer=("sync_buffer",), data=("barrier",))
@dataclasses.dataclass(eq=False, slots=True)
class GridSync(Stmt):
    sync_buffer: Buffer
    # (named barrier id, thread count): the block's part is done by those threads only (the
    # compute warp groups of a warp-specialized kernel); None: __syncthreads.
    barrier: Any = None


@roles(data=("text",))
@dataclasses.dataclass(eq=False, slots=True)
class Raw(Stmt):
    """A line of device code emitted as written (PTX helpers calls built by passes)."""

    text: str


@roles(data=("text",))
@dataclasses.dataclass(eq=False, slots=True)
class Comment(Stmt):
    text: str


@roles(body=("fast", "exact"), data=("flag",))
@dataclasses.dataclass(eq=False, slots=True)
class CheckedQuotients(Stmt):
    """Quotients by divisors a loop shares, through each divisor's reciprocal, checked once
    for the loop (lower/shared_divisor.py):

        bool flag = true;
        fast          <- the loop; its divisions clear flag where their operands leave the range
        if (!flag)       in which the reciprocal's quotient is exactly a / b
          exact       <- the same loop, every division IEEE's a / b (labelled QUOTIENTS_EXACT)

    Running the loop twice computes what running it once does: nothing it writes that outlives
    it (registers allocated outside it, global outputs) is read in it."""

    flag: str
    fast: list
    exact: list


QUOTIENTS_EXACT = "a quotient left the reciprocal's range: the loop again, with IEEE division"


@roles(out=("out",), expr=("acc",), exprs=("lanes",), data=("loop",))
@dataclasses.dataclass(eq=False, slots=True)
class LseFoldLanes(Stmt):
    """out = lse_combine(acc, (m, s)): a logsumexp key (math.cuh) folded with a vector's lanes
    at once (lower/lse_lanes.py), m the lanes' largest value (NaN if one is NaN), s the sum of
    exp(lane - m) (the number of lanes where every one is -inf: each counts as the two passes
    count it). `out` and `acc` are the same register element, the thread's running key;
    `lanes` the float32 elements folded. `loop`: the lowering loop over the lanes where the
    fold replaced its loop whole (the fold stands for it, as an emitted loop would), else None."""

    out: Any
    acc: Any
    lanes: list
    loop: Any = None


@roles(defines=("var",), expr=("value",))
@dataclasses.dataclass(eq=False, slots=True)
class ScalarDef(Stmt):
    """const <dtype> var = value; (hoisted scalars: extents, derived fusion scalars)."""

    var: Var
    value: KExpr


# Asynchronous copies and their barriers (Hopper) ---------------------------------------------------
# Labels of the loops the circular-buffer pass makes; the epilogue repeats the main loop's body
# (the verifier allows that repetition inside it).
CB_MAIN_LOOP = "circular buffer main loop"
CB_EPILOGUE = "circular buffer epilogue"
WS_PRODUCER_LOOP = "warp-specialized producer loop"
WS_COMPUTE_LOOP = "warp-specialized compute loop"
# The loops lower/scans.py repeats after a block scan to add each thread's prefix to its chunk
# (the verifier allows that repetition inside them).
SCAN_FIXUP = "scan prefix fixup"
# The checked version of an unswitched loop (lower/unswitch.py), which repeats the unchecked one.
UNSWITCH_ELSE = "unswitched loop, checked version"


@dataclasses.dataclass(eq=False, slots=True)
class MBarriers:
    """An array of `count` mbarriers (8 bytes each) in shared memory."""

    name: str
    count: int

    def __repr__(self):
        return self.name


@roles(data=("bars",), expr=("index",))
@dataclasses.dataclass(eq=False, slots=True)
class MBarrierRef(KExpr):
    """mbarriers[index] (codegen gives its 32-bit shared-window address)."""

    bars: MBarriers
    index: KExpr

    def __repr__(self):
        return f"{self.bars.name}[{self.index!r}]"


@roles(data=("bars",))
@dataclasses.dataclass(eq=False, slots=True)
class MBarrierAlloc(Stmt):
    bars: MBarriers


@roles(expr=("bar", "arrivals"))
@dataclasses.dataclass(eq=False, slots=True)
class MBarrierInit(Stmt):
    """One thread: mbarrier.init with the number of arrivals that complete a phase."""

    bar: MBarrierRef
    arrivals: KExpr


@roles()
@dataclasses.dataclass(eq=False, slots=True)
class FenceMBarrierInit(Stmt):
    """Makes earlier inits visible to the async proxy (and the cluster); the initializing thread,
    once, before the block barrier that publishes them."""


@roles(expr=("bar", "cta"))
@dataclasses.dataclass(eq=False, slots=True)
class MBarrierArrive(Stmt):
    """One arrival on `bar`; with `cta` (a rank of the thread-block cluster), on the barrier at
    the same shared offset in that CTA (mapa, then a shared::cluster arrive of the default
    release.cta semantics: a consumer releasing a slot that a peer's multicast copy refills)."""

    bar: MBarrierRef
    cta: KExpr | None = None


@roles(expr=("bar", "parity"))
@dataclasses.dataclass(eq=False, slots=True)
class MBarrierWait(Stmt):
    """Wait until the phase of `parity` (0/1) has completed."""

    bar: MBarrierRef
    parity: KExpr


@roles(expr=("bar",))
@dataclasses.dataclass(eq=False, slots=True)
class MBarrierInval(Stmt):
    bar: MBarrierRef


@roles(data=("count", "increase"))
@dataclasses.dataclass(eq=False, slots=True)
class SetMaxNReg(Stmt):
    """setmaxnreg.{inc,dec}: every thread of each warp group that reaches it (uniformly) now
    owns `count` registers (24..256, a multiple of 8)."""

    count: int
    increase: bool


@roles(out=("dst",), expr=("src", "bytes", "bar", "predicate"))
@dataclasses.dataclass(eq=False, slots=True)
class BulkLoad(Stmt):
    """cp.async.bulk global -> shared of `bytes` bytes starting at src, completing on `bar`;
    issued by one thread (the caller's predicate selects it), which first raises the barrier's
    expected transaction bytes by the same count."""

    dst: TensorIndex
    src: TensorIndex
    bytes: KExpr
    bar: MBarrierRef
    predicate: KExpr = dataclasses.field(default_factory=lambda: Const(True, "bool"))


# Shared-memory alignment of tensor-map copy destinations (no swizzle).
TENSOR_MAP_SMEM_ALIGN = 128


@dataclasses.dataclass(frozen=True, slots=True)
class RowBoxMap:
    """A TMA tensor map over the rows of fusion input `input` (its innermost dim, N elements,
    contiguous; its outer dims merged into one row dim of a single stride), viewed in 3D,
    innermost first, as (inner, N / inner, rows) so that one box of (inner, N / inner,
    box_rows) is box_rows whole rows, stored in shared memory as [box_rows][N] exactly like
    box_rows 1D row copies. `inner` divides N and is at most 256 (the box limit per dim), as
    is N / inner. The executor encodes it for each input pointer."""

    input: int
    row_elements: int
    inner: int
    box_rows: int

    @property
    def box(self) -> tuple:
        return (self.inner, self.row_elements // self.inner, self.box_rows)

    @staticmethod
    def inner_for(row_elements: int, elem_bytes: int) -> int | None:
        """The largest `inner` that splits a row of `row_elements` into at most 256 pieces of
        at most 256 elements whose bytes are a multiple of 16 (no swizzle), or None."""
        for inner in range(min(256, row_elements), 0, -1):
            if row_elements % inner == 0 and (inner * elem_bytes) % 16 == 0 \
                    and row_elements // inner <= 256:
                return inner
        return None


@roles(out=("dst",), expr=("tmap", "bytes", "bar", "predicate"), exprs=("coords",),
       data=("map", "multicast"), buffer=("source",))
@dataclasses.dataclass(eq=False, slots=True)
class TensorMapLoad(Stmt):
    """cp.async.bulk.tensor global -> shared: the box of the tensor map parameter `tmap` at
    `coords` (innermost first) into `dst`, completing on `bar`. Issued by one thread (the
    predicate selects it), which first raises the barrier's expected bytes by `bytes`, the
    whole box: elements outside the tensor are zero-filled and still counted.

    A load built with its barrier None (a matmul's operand tiles, lower/matmul.py) is already
    placed in the loop that circular-buffers it: `pipeline_loads` gives it its stage's slot and
    mbarrier, as the copies it makes from a TensorOp's load."""

    dst: TensorIndex
    tmap: Var
    map: RowBoxMap | TileBoxMap
    source: Buffer            # the global buffer the map describes
    coords: list
    bytes: KExpr
    bar: MBarrierRef
    predicate: KExpr = dataclasses.field(default_factory=lambda: Const(True, "bool"))
    # CTAs of the thread-block cluster (along x, all of them) the box lands in: > 1, the box is
    # multicast to every CTA of the cluster at the same shared offset, completing on each one's
    # barrier at `bar`'s offset. Each CTA of the cluster issues one such copy of the same size
    # (its share of an operand the cluster's tiles have in common), so the issuing thread
    # expects `bytes` x multicast on its own barrier: every CTA's share lands there.
    multicast: int = 1


@dataclasses.dataclass(frozen=True, slots=True)
class TileBoxMap:
    """A 2D TMA tensor map over a matrix operand of the fusion (`role` "input" or "output",
    position `index`), viewed as rows of contiguous elements: its logical dim `inner` has
    stride 1 and runs along a row (the map's dim 0), its logical dim `outer` counts the rows
    (dim 1, the tensor's stride along it). A box is `box_rows` rows of `box_cols` elements,
    stored in shared memory row after row with the `swizzle`-byte pattern (128: the 16-byte
    unit u of row r lands at unit u ^ (r % 8) of its 128-byte row, `swizzled_byte`); elements
    of a load outside the matrix are zero-filled (and counted in the box's bytes), those of a
    store outside it are not written. The executor encodes it for each pointer."""

    role: str
    index: int
    inner: int
    outer: int
    box_cols: int
    box_rows: int
    swizzle: int = 128
    # A batched matmul's operand or output: the logical dims of its batch, outermost first
    # (at most 3: a map has 5 dims). The map's dims 2, 3, ... are these dims innermost first, a
    # box one matrix deep in each; coordinates (column, row, innermost batch, ...). (): a 2D
    # map. An int (or None) given here stands for (int,) (or ()).
    batch: tuple = ()

    def __post_init__(self):
        batch = (() if self.batch is None else (self.batch,) if isinstance(self.batch, int)
                 else tuple(self.batch))
        object.__setattr__(self, "batch", batch)

    @property
    def box(self) -> tuple:
        return (self.box_cols, self.box_rows) + (1,) * len(self.batch)


# Shared-memory alignment of a 128-byte-swizzled box: the swizzle pattern repeats every 8 rows
# of 128 bytes, and the hardware applies it to address bits, so a box starts on that boundary.
SWIZZLE_ATOM_BYTES = 1024


def swizzled_byte(byte: int, swizzle: int = 128) -> int:
    """Where byte `byte` of a box (row-major, rows of `swizzle` bytes, from a 1024-byte-aligned
    start) lies in shared memory under the 128-byte swizzle: its 16-byte unit XORed with the
    row's index within its group of 8 rows. TMA writes and reads boxes so, wgmma reads its
    operands so (SmemDescriptor layout 1), and stmatrix addresses are computed so."""
    if swizzle != 128:
        raise ValueError(f"only the 128-byte swizzle is modelled, not {swizzle}")
    return byte ^ (((byte >> 7) & 7) << 4)


@roles(expr=("src", "tmap", "predicate"), exprs=("coords",), data=("map",),
       buffer=("target",))
@dataclasses.dataclass(eq=False, slots=True)
class TensorMapStore(Stmt):
    """cp.async.bulk.tensor shared -> global: the box `src` (a shared buffer, laid out as the
    map's swizzle says) into the tensor of map parameter `tmap` at `coords` (innermost first);
    elements outside the tensor are dropped. Issued by one thread (the predicate selects it)
    and tracked by that thread's bulk group: BulkCommit closes the group, BulkWait waits for
    it. The shared box must have been written by the generic proxy before a FenceProxyAsync of
    each writer and a barrier."""

    src: TensorIndex
    tmap: Var
    map: TileBoxMap
    target: Buffer             # the global buffer the map describes
    coords: list
    predicate: KExpr = dataclasses.field(default_factory=lambda: Const(True, "bool"))


@roles()
@dataclasses.dataclass(eq=False, slots=True)
class BulkCommit(Stmt):
    """cp.async.bulk.commit_group: close the thread's group of bulk stores issued since its last
    commit."""


@roles(data=("pending", "read"))
@dataclasses.dataclass(eq=False, slots=True)
class BulkWait(Stmt):
    """cp.async.bulk.wait_group(.read) `pending`: the thread waits until at most `pending` of
    its committed groups are unfinished; with `read`, until they no longer read their shared
    source (it may be overwritten), else until their writes are done."""

    pending: int
    read: bool


@roles()
@dataclasses.dataclass(eq=False, slots=True)
class FenceProxyAsync(Stmt):
    """fence.proxy.async.shared::cta: this thread's shared-memory writes (generic proxy) are
    ordered before later async-proxy reads of them (a TMA store, wgmma) that a barrier
    orders after this fence."""


@roles()
@dataclasses.dataclass(eq=False, slots=True)
class WgmmaFence(Stmt):
    """wgmma.fence: orders the warp group's register and shared accesses before the next
    wgmma (before the first of a group, and after other code touched the accumulators)."""


@roles()
@dataclasses.dataclass(eq=False, slots=True)
class WgmmaCommit(Stmt):
    """wgmma.commit_group: the warp group's wgmmas issued since the last commit form a group."""


@roles(data=("pending",))
@dataclasses.dataclass(eq=False, slots=True)
class WgmmaWait(Stmt):
    """wgmma.wait_group `pending`: wait until at most `pending` of the warp group's committed
    groups are unfinished; the accumulators of the finished ones may be read, and the shared
    operands they read overwritten."""

    pending: int


# The shape of one wgmma of 16-bit inputs (m64 nN k16), and the 16-bit elements of one
# 128-byte swizzled row (a box row of a matmul's operands and of its staging boxes).
WGMMA_M = 64
WGMMA_K = 16
SWIZZLED_ROW_16BIT = 64


@roles(buffer=("acc",), expr=("a", "b", "scale_d"),
       data=("n", "dtype", "swizzle", "b_major", "b_chunk_bytes", "a_major"))
@dataclasses.dataclass(eq=False, slots=True)
class Wgmma(Stmt):
    """wgmma.mma_async m64n{n}k16 of one warp group (all 128 threads reach it): D[64, n] =
    A[64, 16] @ B[n, 16]^T + (scale_d ? D : 0), inputs of `dtype` (bf16 or fp16) from shared
    memory, D float32 in the accumulator registers `acc` (a register buffer of n / 2 elements
    per thread, constant-indexed). Both operands are K-major (each row's 16 K elements
    contiguous) in 128-byte-swizzled boxes with rows of 64 elements: `a` is the first element
    of A's 64 rows at its K offset (a multiple of 16), `b` that of B's n rows; the shared-memory
    descriptors (start address, 1024 bytes between 8-row groups, swizzle) are formed from
    them. Asynchronous: it completes at a WgmmaWait that covers its commit group.

    With `b_major` "MN", B is MN-major instead (B^T given: each K row's n elements
    contiguous, as a row-major [K, N] matrix's): its n columns in chunks of 64 (one 128-byte
    swizzled row), each chunk a box of K rows, `b_chunk_bytes` apart; `b` is the first element
    of the K offset's row of the first chunk; element (k, j) at swizzled byte b + (j / 64)
    b_chunk_bytes + (k / 8) 1024 + (k % 8) 128 + 2 (j % 64) (the descriptor's leading byte
    offset is b_chunk_bytes, its stride byte offset 1024; the wgmma's imm-trans-b is 1).

    With `a_major` "MN", A is MN-major (a column-major [M, K] matrix's layout): its 64 rows are
    one 128-byte swizzled row of each K row of a box; `a` is the first element of the K offset's
    row; element (r, k) at swizzled byte a + (k / 8) 1024 + (k % 8) 128 + 2 r (imm-trans-a 1).

    Accumulator fragment: thread t of the warp group (warp w = t / 32, lane l = t % 32), register
    i holds D[16 w + l / 4 + 8 ((i >> 1) & 1), 8 (i >> 2) + 2 (l % 4) + (i & 1)]."""

    acc: Buffer
    a: TensorIndex
    b: TensorIndex
    n: int
    dtype: DataType
    scale_d: KExpr
    swizzle: int = 128
    b_major: str = "K"
    b_chunk_bytes: int = 0
    a_major: str = "K"


# The leading byte offset of an MN-major A's descriptor: the bytes between chunks of 64 rows,
# which one m64 wgmma never crosses (a 64 x 64 box's).
A_MN_CHUNK_BYTES = 64 * SWIZZLED_ROW_16BIT * 2


@roles(buffer=("acc",))
@dataclasses.dataclass(eq=False, slots=True)
class AccumulatorFence(Stmt):
    """An empty asm that reads and writes every register of `acc`: the compiler may not move
    accumulator accesses across it (it keeps reads after the WgmmaWait before it)."""

    acc: Buffer


@roles(defines=("last",), buffers=("accs",), buffer=("partials", "counters"),
       expr=("slot", "split", "frag_row", "arrivals", "whole"), exprs=("rows",),
       data=("splits", "barrier"))
@dataclasses.dataclass(eq=False, slots=True)
class SplitKReduce(Stmt):
    """Split-K's sum of one warp group's matmul accumulators over the `splits` CTAs that
    computed the same output tile, each over its own share of K's blocks (lower/matmul.py).

    Every thread of the warp group (128 threads, threadIdx.x) stores its fp32 registers `accs`
    (one buffer per 64-row slice, in order) as partial `split` of `slot`; the registers of a
    thread are laid out [register pair][thread][2] within a partial (two 8-byte stores per four
    registers, 256 contiguous bytes per warp), partials [slot][split][...] in `partials`. Only
    the registers of valid rows are stored: register i of slice s holds row `frag_row` + 8
    ((i >> 1) & 1) of the slice, valid below `rows[s]` (the rows left in the output from the
    slice's first; rows past it are never stored by the epilogue either). Then each thread
    fences, the warp group meets at `barrier` ((named barrier id, thread count), or None for
    the role's barrier), and one thread counts its arrival at `counters[slot]`: the warp group
    that arrives `splits`-th is the last (it resets the counter for the next launch). The last
    one reads every partial in split order, 0 first, and sums them into `accs` (the same bits
    whichever CTA is last); `last` (a bool, defined here) is true in its threads only, which
    then run the epilogue.

    Stream-K (lower/matmul.py) varies the CTAs of a tile: `arrivals` (None: `splits`) is the
    count of partials of this slot, at most `splits` (the partials' stride), and where `whole`
    (None: never) is true the warp group computed the tile alone: nothing is stored and `last`
    is true. There split 0 (the tile's first k blocks, its CTA's last run) is the last: it
    waits until the others have stored their partials (every register, rows past the matrix
    too: `frag_row` None and `rows` empty) and adds them to its own registers in split
    order."""

    last: Var
    accs: tuple
    partials: Buffer
    counters: Buffer
    slot: KExpr
    split: KExpr
    frag_row: KExpr
    rows: tuple
    splits: int
    barrier: Any = None
    arrivals: Any = None
    whole: Any = None

    @property
    def registers(self) -> int:
        """fp32 registers per thread of one partial: every slice's accumulators."""
        return sum(_const_size(a) for a in self.accs)


def _const_size(b: Buffer) -> int:
    if not isinstance(b.size, Const):
        raise ValueError(f"{b.name}: a register buffer of constant size expected")
    return b.size.value


@roles(out=("dst",), exprs=("values",))
@dataclasses.dataclass(eq=False, slots=True)
class StSharedPair(Stmt):
    """Two 32-bit values into the consecutive shared-memory elements dst and dst + 1 (of
    `dst`'s buffer dtype, 8-byte aligned), one 8-byte store by each thread that reaches it: the
    matmul epilogue's fp32 staging, a fragment's two adjacent columns at once."""

    dst: TensorIndex
    values: list


@roles(out=("dst",), expr=("src",))
@dataclasses.dataclass(eq=False, slots=True)
class RegisterCopy(Stmt):
    """dst = src, converted to dst's buffer dtype (a widening that keeps the value): a value read
    into a register ahead of the statements that use it (the matmul epilogue's column inputs,
    read when a tile starts, so that their loads complete under the tile's k loop)."""

    dst: TensorIndex
    src: KExpr


@roles(out=("dst",), exprs=("values",), data=("dtype",))
@dataclasses.dataclass(eq=False, slots=True)
class StMatrix(Stmt):
    """stmatrix.m8n8.x4 of one warp (all 32 lanes reach it): four 8x8 matrices of 16-bit
    `dtype` into shared memory. Lane l gives in `dst` the first element of row l % 8 of matrix
    l / 8 (8 contiguous elements); `values` are the lane's 8 numbers, pair k (values[2k],
    values[2k + 1]) being row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix k, converted
    to `dtype` (round to nearest even) as they are stored."""

    dst: TensorIndex
    values: list
    dtype: DataType


@roles(expr=("src",), buffer=("out",))
@dataclasses.dataclass(eq=False, slots=True)
class LdMatrix(Stmt):
    """ldmatrix.m8n8.x4 of one warp (all 32 lanes reach it), the inverse of StMatrix: lane l
    gives in `src` the first element of row l % 8 of matrix l / 8 (8 contiguous 16-bit
    elements of shared memory); the lane's pair k (out[2k], out[2k + 1], a local buffer of 8
    elements of the source's dtype) receives row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of
    matrix k."""

    src: TensorIndex
    out: Buffer


@roles(out=("dst",), expr=("src", "predicate"), data=("bytes",))
@dataclasses.dataclass(eq=False, slots=True)
class CpAsyncCopy(Stmt):
    """cp.async global -> shared of `bytes` (4, 8 or 16) bytes by each thread that reaches it
    with `predicate` true (the others copy nothing); both addresses aligned to `bytes`. The copy
    joins the thread's open cp.async group and lands, visible to this thread only, at the
    CpAsyncWait that covers its group; other threads see it after a block barrier following
    that wait."""

    dst: TensorIndex
    src: TensorIndex
    bytes: int
    predicate: KExpr = dataclasses.field(default_factory=lambda: Const(True, "bool"))


@roles()
@dataclasses.dataclass(eq=False, slots=True)
class CpAsyncCommit(Stmt):
    """cp.async.commit_group: close the thread's open group (an empty one too, which keeps the
    group count uniform)."""


@roles(data=("pending",))
@dataclasses.dataclass(eq=False, slots=True)
class CpAsyncWait(Stmt):
    """cp.async.wait_group `pending`: wait until at most the `pending` most recently committed
    groups of this thread are incomplete (a constant)."""

    pending: int


# The kernel ---------------------------------------------------------------------------------------
@dataclasses.dataclass(eq=False, slots=True)
class Param:
    """A kernel parameter: a tensor's data pointer, a stride, an extent, a scalar input,
    a tensor map or a workspace pointer. `source` says where its runtime value comes from."""

    name: str
    kind: str            # ptr | index | int64 | float | double | bool | tmap
    source: tuple        # ("tensor", k) | ("stride", k, dim) | ("extent", Scalar) |
                         # ("scalar", k) | ("output", k) | ("workspace", name) |
                         # ("tmap", RowBoxMap)
    buffer: Buffer | None = None


@dataclasses.dataclass(eq=False, slots=True)
class LaunchConfig:
    grid: list            # three fusion Scalars / ints (x, y, z); may be symbolic
    block: list           # three ints or Scalars
    shared_mem_static: int = 0
    # Bytes of the one extern shared array every shared buffer is carved from (lower/launch.py
    # lays the buffers out; codegen prints the offsets, the executor launches with the size).
    shared_mem_dynamic: int = 0
    cluster: tuple | None = None
    cooperative: bool = False
    persistent: bool = False        # see kir/launch.LaunchDescription.persistent
    max_threads: int | None = None  # for __launch_bounds__
    min_blocks: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class WarpRoles:
    """The thread split of a warp-specialized kernel along block dim `dim`: `compute_roles`
    compute roles of `compute_extent` indices each, then `producer_extent` indices forming the
    producer warp group(s)."""

    dim: str                      # "y"
    row_threads: int              # threads per index of `dim` (blockDim.x)
    compute_extent: int
    producer_extent: int
    compute_registers: int
    producer_registers: int
    barrier_id: int = 1           # compute role r's named barrier is barrier_id + r
    # Compute roles side by side along `dim` (each `compute_extent` wide), taking the buffered
    # loop's iterations in turn (ping-pong when 2); the producer comes after them.
    compute_roles: int = 1

    @property
    def compute_threads(self) -> int:
        """Threads of one compute role."""
        return self.row_threads * self.compute_extent

    @property
    def producer_threads(self) -> int:
        return self.row_threads * self.producer_extent


@dataclasses.dataclass(eq=False, slots=True)
class Kernel:
    name: str
    fusion: Any
    body: list = dataclasses.field(default_factory=list)
    params: list = dataclasses.field(default_factory=list)
    launch: LaunchConfig | None = None
    index_type: str = "int"        # int (32-bit) or int64_t
    ctx: Any = None                # lowering context (ID graphs, loops, buffers)
    # Global buffers the executor allocates per launch shape: (Buffer, kind), kind one of
    # "intermediate", "grid_reduce_data", "semaphore" (zeroed once, left zeroed by the kernel),
    # "scan_chain", "scan_flag" (zeroed once; a kernel tags the flags it sets with its
    # launch's generation, scan.cuh), "split_k_partials", "split_k_counters" (zeroed once, left
    # zeroed by the kernel: SplitKReduce).
    workspaces: list = dataclasses.field(default_factory=list)
    # Elements of the workspaces sized by the fusion's extents (the split-K ones): buffer name ->
    # a fusion Scalar, which launch_config turns into a launch expression.
    workspace_elements: dict = dataclasses.field(default_factory=dict)
    # Set by passes, read by later passes, codegen and the executor:
    vector_widths: dict = dataclasses.field(default_factory=dict)  # global buffer name -> width
    # Global buffers whose vector accesses run over a flat run of a contiguous tensor whose
    # last vector may stop inside it (checked lane by lane): the executor does not require
    # whole vectors of them (lower/vectorize.py).
    ragged_vectors: set = dataclasses.field(default_factory=set)
    reduction_workspace: int = 0          # shared elements of the block-reduction workspace
    grid_sync_buffer: Buffer | None = None  # counter of the grid barrier, if any
    needs_cooperative: bool = False       # a grid sync: all blocks must be resident
    streaming_loads: bool = False         # inputs read with L1::no_allocate (an option)
    shared_divisor_quotients: bool = True  # lower/shared_divisor.py runs (an option)
    group_reductions: bool = True         # lower/grouped_reductions.py runs (an option)
    # (shared buffer name, stages, prefetch, kind) of each circular buffer, for tests and explain
    circular_buffers: list = dataclasses.field(default_factory=list)
    # Global inputs read row by row with 1D bulk copies: the executor checks their rules.
    bulk_sources: set = dataclasses.field(default_factory=set)
    # Tensor-map parameters (Param name -> RowBoxMap) the executor encodes per input pointer.
    tensor_maps: dict = dataclasses.field(default_factory=dict)
    # ids of lowering Loops a pass replaced by loops of its own (a buffered loop by its main
    # loop and epilogue, a bulk axis by one copy) or folded away (a one-iteration loop inside a
    # vector access): the verifier no longer looks for them.
    replaced_loops: set = dataclasses.field(default_factory=set)
    # Set by `pipeline_loads`: the warp roles' split that launch_config adds to the block.
    warp_roles: WarpRoles | None = None
    # Set by `launch_config`: byte offset of each shared buffer in the dynamic shared array,
    # from a base aligned to `smem_align` bytes (codegen aligns it when that is over 128).
    smem_offsets: dict = dataclasses.field(default_factory=dict)
    smem_align: int = 128
    # Set by `launch_config`: everything a launch needs, as data over the call's inputs
    # (kir/launch.py), serializable without the fusion so a kernel loaded from disk launches.
    launch_description: Any = None


def walk(stmts):
    """Every statement, depth first, parents before children (every nested body, by the
    statements' field roles)."""
    for s in stmts:
        yield s
        table = STMT_KINDS.get(type(s))
        if table is None:
            raise TypeError(f"{type(s).__name__} is not a kernel-IR statement kind (declare its "
                            "fields with kir.nodes.roles)")
        for f, role in table.items():
            if role == BODY:
                yield from walk(getattr(s, f))


def bodies(stmts: list):
    """`stmts` and every statement list nested in it (by the statements' field roles), outer
    first: the scopes of a kernel's statements."""
    yield stmts
    for s in stmts:
        for f, role in STMT_KINDS[type(s)].items():
            if role == BODY:
                yield from bodies(getattr(s, f))


# Copies whose writes land asynchronously (on an mbarrier, at a cp.async wait), not in program
# order: a block barrier after them orders nothing (the passes that make them order them).
ASYNC_COPIES = (BulkLoad, TensorMapLoad, CpAsyncCopy)
# Statements one warp group (Wgmma and its fences) or one warp (StMatrix) executes together.
WARP_GROUP_OPS = (Wgmma, WgmmaFence, WgmmaCommit, WgmmaWait)


def ops_in_loops(body: list, expr_type, parents: list | None = None) -> list:
    """(TensorOp, the ForLoops around it, outermost first) for each TensorOp of `expr_type`'s
    expressions in `body`'s loop nests (a pass's sites: scans, top-ks)."""
    parents = parents or []
    out = []
    for s in body:
        if isinstance(s, ForLoop):
            out += ops_in_loops(s.body, expr_type, parents + [s])
        elif isinstance(s, TensorOp) and isinstance(s.expr, expr_type):
            out.append((s, parents))
    return out
