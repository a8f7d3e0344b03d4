"""Tensor expressions of the fusion IR."""
from __future__ import annotations

import dataclasses
import enum

from .base import Expr, Val


class UnaryOpType(enum.Enum):
    Neg = "neg"
    Abs = "abs"
    Exp = "exp"
    Exp2 = "exp2"
    Log = "log"
    Sqrt = "sqrt"
    Rsqrt = "rsqrt"
    Reciprocal = "reciprocal"
    Tanh = "tanh"
    Sigmoid = "sigmoid"
    Erf = "erf"
    Relu = "relu"
    Silu = "silu"
    GeluTanh = "gelu_tanh"
    GeluErf = "gelu_erf"
    Not = "logical_not"
    Cast = "cast"
    Set = "set"
    # The index an int64 arg key holds (BinaryOpType.ArgMaxKey).
    ArgKeyIndex = "arg_key_index"
    # logsumexp in one pass (ReductionOpType.LogSumExp): a float32 element's int64 key of
    # (m, s) = (x, 1), and the largest element (m) and sum of exp(x - m) (s) a reduced key holds
    # (pf::lse_key / lse_max / lse_sum in math.cuh; runtime/lse_key.py).
    LseKey = "lse_key"
    LseMax = "lse_max"
    LseSum = "lse_sum"


class BinaryOpType(enum.Enum):
    Add = "add"
    Sub = "sub"
    Mul = "mul"
    Div = "div"
    Pow = "pow"
    Max = "maximum"
    Min = "minimum"
    Eq = "eq"
    Ne = "ne"
    Lt = "lt"
    Le = "le"
    Gt = "gt"
    Ge = "ge"
    And = "logical_and"
    Or = "logical_or"
    # (value, index) -> an int64 key whose max over a dim is the key of the first largest
    # (ArgMaxKey) or first smallest (ArgMinKey) value, NaN counted extreme as torch does: an
    # argmax in one max reduction. The value is a float32, 16-bit float or int32 (read in its
    # compute type), the index an int64 below 2^32 (pf::arg_max_key in math.cuh).
    ArgMaxKey = "arg_max_key"
    ArgMinKey = "arg_min_key"

    @property
    def is_arg_key(self) -> bool:
        return self in (BinaryOpType.ArgMaxKey, BinaryOpType.ArgMinKey)

    @property
    def is_comparison(self) -> bool:
        return self in (BinaryOpType.Eq, BinaryOpType.Ne, BinaryOpType.Lt, BinaryOpType.Le,
                        BinaryOpType.Gt, BinaryOpType.Ge)

    @property
    def is_logical(self) -> bool:
        return self in (BinaryOpType.And, BinaryOpType.Or)


class ReductionOpType(enum.Enum):
    Sum = "sum"
    Max = "max"
    Min = "min"
    # Of UnaryOpType.LseKey keys: (the largest, the sum of exp(x - the largest)) in one pass.
    LogSumExp = "logsumexp"


# A LogSumExp reduction's start value: the key of no elements, (m, s) = (-inf, 0) (m's float
# bits low, s's high; runtime/lse_key.py, pf::lse_identity).
LSE_IDENTITY = 0xFF800000


class LoadKind(enum.Enum):
    """How a LoadStoreOp moves data: a plain copy, cp.async, or TMA (1D bulk or tensor map)."""

    Set = "set"
    CpAsync = "cp.async"
    TmaBulk = "tma.1d"
    TmaTensor = "tma.tensor"

    @property
    def is_tma(self) -> bool:
        return self in (LoadKind.TmaBulk, LoadKind.TmaTensor)

    @property
    def is_async(self) -> bool:
        return self != LoadKind.Set


class UnaryOp(Expr):
    def __init__(self, op: UnaryOpType, out: Val, inp: Val):
        self.op = op
        super().__init__([inp], [out])

    @property
    def in_val(self):
        return self.inputs[0]


class BinaryOp(Expr):
    def __init__(self, op: BinaryOpType, out: Val, a: Val, b: Val):
        self.op = op
        super().__init__([a, b], [out])

    @property
    def operand_dtype(self):
        """The dtype both operands are converted to before the op (kernels compute in its
        compute_type, the generated code and the interpreter alike): bool for logical ops; for
        comparisons torch's result type of the pair (a scalar only lifts the category, so an
        int64 tensor == 16777217.0 compares in float32, as torch does); for an arg key the
        value's (its index is read as an int64); for arithmetic the output's dtype (the
        frontend promoted the operands to it)."""
        from .dtype import DataType, result_type
        if self.op.is_logical:
            return DataType.Bool
        if self.op.is_arg_key:
            return self.inputs[0].dtype       # the value's; the index is read as an int64
        if self.op.is_comparison:
            a, b = self.inputs
            tensors = [x.dtype for x in (a, b) if not _is_scalar(x)]
            scalars = [x.dtype for x in (a, b) if _is_scalar(x)]
            return result_type(tensors, scalars)
        return self.outputs[0].dtype


def _is_scalar(v) -> bool:
    from .scalar import Scalar
    return isinstance(v, Scalar)


class WhereOp(Expr):
    """out = cond ? a : b"""

    def __init__(self, out: Val, cond: Val, a: Val, b: Val):
        super().__init__([cond, a, b], [out])


class LoadStoreOp(Expr):
    """out = in, element by element: caches, permutes (out root = in logical, out logical
    permuted) and TMA/cp.async loads."""

    def __init__(self, out: Val, inp: Val, load_kind: LoadKind = LoadKind.Set):
        self.load_kind = load_kind
        super().__init__([inp], [out])

    @property
    def in_val(self):
        return self.inputs[0]


class SegmentSetOp(LoadStoreOp):
    """out = in (fd.ops.segment_set, nvFuser's name): a copy whose output is a segment boundary.
    The segmenter never merges the producer's segment with a consumer across it; everything
    else (schedulers, lowering, the reference evaluator) sees the plain copy it is."""


class BroadcastOp(Expr):
    """Insert broadcast IDs: `is_broadcast_dim[k]` says whether output logical dim k is new."""

    def __init__(self, out: Val, inp: Val, is_broadcast_dim: list[bool]):
        self.is_broadcast_dim = list(is_broadcast_dim)
        super().__init__([inp], [out])


class ExpandOp(Expr):
    """Give broadcast IDs an expanded extent (stride 0 when materialized)."""

    def __init__(self, out: Val, inp: Val):
        super().__init__([inp], [out])


class SqueezeOp(Expr):
    """Drop input logical dims flagged in `is_squeezed` (each a broadcast of extent 1).

    `reduction` (a ReductionOpType, or None for a plain squeeze): the squeezed dims include
    expanded ones (stride 0, E copies of one element) and this squeeze stands for that
    reduction over them, so that no kernel reduces over a broadcast ID (for a sum, the
    frontend multiplies the result by E)."""

    def __init__(self, out: Val, inp: Val, is_squeezed: list[bool], reduction=None):
        self.is_squeezed = list(is_squeezed)
        self.reduction = reduction
        super().__init__([inp], [out])


class ReshapeOp(Expr):
    """out's root domain maps to in's logical domain; out's logical domain is derived from its
    root by Split/Merge (only reshapes of contiguous dims are expressible)."""

    def __init__(self, out: Val, inp: Val):
        super().__init__([inp], [out])


class ReductionOp(Expr):
    """out = reduce(op, in) over the reduction IDs of out's domain, starting from `init`."""

    def __init__(self, op: ReductionOpType, out: Val, inp: Val, init: Val):
        self.op = op
        self.init = init
        super().__init__([inp], [out])

    @property
    def in_val(self):
        return self.inputs[0]


class FullOp(Expr):
    """out = fill_value everywhere (full, zeros, ones)."""

    def __init__(self, out: Val, fill_value: Val):
        super().__init__([fill_value], [out])


class IotaOp(Expr):
    """out[k] = start + k * step for k < out's length (iota, arange): a 1-D tensor whose values
    come from its own index. start and step are scalars of out's dtype; a broadcast out (length
    1) holds start."""

    def __init__(self, out: Val, start: Val, step: Val):
        super().__init__([start, step], [out])


# Random bits of a uniform draw, by output dtype name: its significand (torch draws so), so u is
# exact in the dtype and below 1 (runtime/philox.py).
UNIFORM_BITS = {"float32": 24, "float64": 24, "float16": 11, "bfloat16": 8}


class RandOp(Expr):
    """out = random numbers drawn from the element's row-major index in out, a seed and an
    offset (runtime/philox.py defines the stream): `dist` "uniform" (in [a, b)) or "normal"
    (mean a, standard deviation b). `stream` tells the random ops of one fusion apart: op k
    draws at Philox counter offset / 4 + k. seed and offset are int64 scalars (fusion inputs,
    or constants)."""

    def __init__(self, out: Val, seed: Val, offset: Val, a: Val, b: Val, dist: str,
                 stream: int):
        self.dist = dist
        self.stream = stream
        super().__init__([seed, offset, a, b], [out])


@dataclasses.dataclass(frozen=True)
class DimWindow:
    """What one dim of a WindowOp reads: out index j reads src index offset + j * step where
    every guard (a, b, lo, hi) holds, lo <= a + b * j < hi, and the op's fill elsewhere (a pad's
    value). offset, a, lo, hi: ints or integer Scalars; step, b: ints (step >= 1)."""

    offset: object = 0
    step: int = 1
    guards: tuple = ()


class WindowOp(Expr):
    """out = a window of src: slice, pad and their compositions (fd.ops.slice, pad, cat, chunk).
    `windows[k]` (a DimWindow, or None: out's index) says where out's dim k reads src's dim k.

    src is read from global memory where the kernel runs: a fusion input, or a segment input
    (registry refuses a group that computes it, so the segmenter cuts there). A slice of an input
    is thus an offset into it, not a copy. out's IDs have no partners in src (`dim_map`): the ID
    graph, scheduling and indexing reach src only through this op's windows (lower/index.py)."""

    def __init__(self, out: Val, src: Val, windows, fill: Val):
        self.windows = tuple(windows)
        self.dim_map = ((),)
        super().__init__([src, fill], [out])

    @property
    def src(self):
        return self.inputs[0]

    @property
    def fill(self):
        return self.inputs[1]


class GatherOp(Expr):
    """out = elements of src picked by an index tensor (take_along_axis, gather, index_select,
    embedding): src's dim `dim` is read at the value of `index` (an integer tensor of out's
    rank, broadcast where the op repeats it), every other src dim d at out's index along dim
    `src_dims[d]` (`src_dims[dim]` is None). take_along_axis(x, i, 1) on x [M, V], i [M, 1]:
    out [M, 1], src_dims (0, None); embedding(ids [B, S], w [V, D]): index ids as [B, S, 1],
    out [B, S, D], src_dims (None, 2).

    An index outside [0, src's extent along dim) is an error the kernel reports (its read is
    skipped and out takes 0 there); the runtime raises IndexOutOfRange after the launch.

    src is read from global memory where the kernel runs, as a WindowOp's (registry refuses a
    group that computes it); the index is an ordinary operand, its dims paired with out's
    (`dim_map`), so out lines up with the tensor the index came from, and so are the src dims
    out iterates whole (never the gathered one)."""

    def __init__(self, out: Val, src: Val, index: Val, dim: int, src_dims, what: str = "gather",
                 src_pairs=()):
        self.what = what            # the frontend op, for error messages
        self.dim = dim
        self.src_dims = tuple(src_dims)
        rank = len(out.domain.logical)
        # The index's dims pair with out's; so do the src dims out iterates with their extent
        # (`src_pairs`: (src dim, out dim)), so that a recomputed gather and what it feeds line
        # up with the original along them (an embedding's row under its normalization).
        self.dim_map = (tuple(src_pairs), tuple((k, k) for k in range(rank)))
        super().__init__([src, index], [out])

    @property
    def src(self):
        return self.inputs[0]

    @property
    def index(self):
        return self.inputs[1]


class IndexCheckOp(Expr):
    """out = index, an integer tensor checked against [0, extent): a value outside is an error
    the kernel reports in the index-error record as a gather's index (runtime/index_check.py;
    the runtime raises IndexOutOfRange naming `what`, `dim` and the extent). Element-wise: out
    has index's dims and dtype. The frontend checks the index of a scatter it makes a compare
    with an iota (frontend/indexing.one_hot_scatter): out of range, no element would match,
    and the scatter would silently write nothing. extent is an integer Scalar (the size of
    the dim indexed), an operand like a binary op's scalar."""

    def __init__(self, out: Val, index: Val, extent: Val, what: str, dim: int):
        self.what, self.dim = what, dim
        super().__init__([index, extent], [out])

    @property
    def index(self):
        return self.inputs[0]

    @property
    def extent(self):
        return self.inputs[1]


class ScatterOp(Expr):
    """out = x with src's elements written into it along `dim` at index's values: op "add"
    adds them (torch.scatter_add, index_add: duplicates accumulate), op "set" stores them
    (torch.scatter: of duplicates, one wins). x None: zeros of out's shape.

    out's domain has two sides. Its root is the op's iteration: one ID per dim of index's rank
    (index's, or src's where index is a broadcast: an index_add's 1-D index broadcast over
    src's rows), and index and src pair with it dim for dim (`dim_map`), as operands of an
    element-wise op. Its logical domain is the target's shape (x's), with no ID-graph partner
    and no transform from the root: element j of the iteration goes to out at index[j] along
    `dim` and at j's own index along every other dim. A scheduler loops over the root (loop =
    root until scheduled); lowering writes out at those offsets (lower/index._scatter_write), a
    gather's read turned around. An index outside [0, out's extent along dim) is an error the
    kernel reports (runtime/index_check.py).

    The `scatter` scheduler takes op "add" into zeros (x None) of float32, float64, int32 and
    int64 with atomic adds (pf::atomic_add: float sums in no fixed order), its output zeroed
    by the executor before the launch (a launch's `zeroed_outputs`); every other scatter runs
    as a library op (runtime/library.py: torch's scatter, scatter_add)."""

    def __init__(self, out: Val, x: Val | None, index: Val, src: Val, dim: int, op: str,
                 what: str):
        self.dim, self.op, self.what = dim, op, what
        pairs = tuple((k, k) for k in range(len(out.domain.maybe_root)))
        self.dim_map = (pairs, pairs) + (((),) if x is not None else ())
        super().__init__([index, src] + ([x] if x is not None else []), [out])

    @property
    def index(self):
        return self.inputs[0]

    @property
    def src(self):
        return self.inputs[1]

    @property
    def x(self):
        return self.inputs[2] if len(self.inputs) > 2 else None


class MatmulOp(Expr):
    """out = a @ b with torch.matmul's shape rules: a [..., M, K] or [K], b [..., K, N] or [K],
    batch dims broadcast against each other; out [batch..., M, N] without the dims a 1-D
    operand lacks. The sum over K is inside the op (out has no reduction ID) and accumulates in
    float32; out has the operands' dtype. A library op (schedule/op_support.py): it runs
    through runtime/library.py, never in a generated kernel.

    `dim_map[k]`: (operand k's logical dim, out's logical dim) for each out dim operand k
    iterates (batch dims, a's M, b's N). K maps to no out dim; the ID graph pairs only these,
    so a pointwise epilogue reading `out` lines up with the operands' M, N and batch dims."""

    def __init__(self, out: Val, a: Val, b: Val, dim_map):
        self.dim_map = tuple(tuple(pairs) for pairs in dim_map)
        super().__init__([a, b], [out])


class TopKOp(Expr):
    """values, indices = the k largest (or smallest) elements of x along `dim` and their int64
    indices, as torch.topk: both x's shape with k along dim, in order (largest first, or
    smallest first), of equal values the lowest index first (torch leaves ties unordered), NaN
    above every number as torch (a NaN value comes back as the canonical NaN). The `topk`
    scheduler generates a block top-k kernel for rows that fit on chip (lower/topk.py); the
    others run as a library op, torch.topk (runtime/library.py;
    schedule/op_support.LIBRARY_FALLBACK_OPS). `dim_map` pairs x's other
    dims with both outputs' (the ID graph's producer/consumer pairs); k, an int scalar, has
    none."""

    def __init__(self, values: Val, indices: Val, x: Val, k: Val, dim: int, largest: bool,
                 sorted: bool):
        self.dim, self.largest, self.sorted = dim, largest, sorted
        # A constant k is the op's; a runtime one (an int scalar input) its second operand.
        self.k = k.value
        rank = len(values.domain.logical)
        self.dim_map = (tuple((d, d) for d in range(rank) if d != dim), ())
        super().__init__([x] if k.value is not None else [x, k], [values, indices])

    def selected_ids(self, out) -> list:
        """The IDs of output `out`'s domain (root to loop) that iterate its k selected elements:
        its logical ID along `dim` and everything split or merged from it alone."""
        return _derived_ids(out, out.domain.logical[self.dim])


class ScanOp(Expr):
    """out = the inclusive scan of x along `dim` (torch.cumsum with op "sum", torch.cumprod
    with "prod"), x's shape, in `out`'s dtype (torch's: int64 for integer and bool inputs; the
    frontend scans 16-bit floats in float32). The `scan` scheduler generates a block-scan
    kernel for it (lower/scans.py); where no kernel takes it, it runs as a library op
    (runtime/library.py runs torch's; schedule/op_support.LIBRARY_FALLBACK_OPS). `dim_map`
    pairs every dim of x with out's."""

    def __init__(self, out: Val, x: Val, dim: int, op: str):
        self.dim, self.op = dim, op
        self.dim_map = (tuple((d, d) for d in range(len(out.domain.logical))),)
        super().__init__([x], [out])

    @property
    def identity(self) -> int:
        """op's identity: the prefix of a row's first element."""
        return 0 if self.op == "sum" else 1

    def scanned_ids(self) -> list:
        """The IDs of out's domain (root to loop) that iterate the scanned dim: its logical ID
        and everything split or merged from it alone."""
        out = self.outputs[0]
        return _derived_ids(out, out.domain.logical[self.dim])


def _derived_ids(tv, logical_id) -> list:
    """tv's IDs (root to loop) that iterate `logical_id` alone: it and what was split or merged
    from it and no other logical ID."""
    from .iter_domain import ancestors
    roots = tv.domain.logical
    return [i for i in tv.domain.all_ids()
            if i is logical_id or (i.definition is not None
                                   and ancestors(i, roots) == [logical_id])]


class LinearOp(Expr):
    """out = x @ w^T (+ bias) as torch.nn.functional.linear: x [..., K], w [N, K], bias [N]
    (optional); out [..., N] in the operands' dtype, float32 accumulation, K summed inside the
    op. A library op, like MatmulOp; `dim_map` as there (x's leading dims, w's N, bias's N)."""

    def __init__(self, out: Val, x: Val, w: Val, bias: Val | None, dim_map):
        self.dim_map = tuple(tuple(pairs) for pairs in dim_map)
        super().__init__([x, w] + ([bias] if bias is not None else []), [out])

    @property
    def bias(self):
        return self.inputs[2] if len(self.inputs) > 2 else None
