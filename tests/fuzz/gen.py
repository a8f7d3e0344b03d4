"""The random fusion generator: generate(seed, index) -> a case spec (see fuzz/spec.py).

A case is built by one *pattern* (PATTERNS, chosen by weight) with a Builder that mirrors what
the frontend will do, so that the spec it records is a valid fusion whose values stay
well-conditioned:

- Axes. A case has up to 4 iteration axes with sizes drawn by `pick_size` (0, 1, small, odd,
  primes, powers of two and their neighbours, rows of several thousand elements), shrunk until
  the largest tensor has at most `max_elements` elements. Every tensor dim lies on an axis as a
  full dim (its size), a broadcast dim (size 1) or an expanded dim (the axis size, stride 0), so
  that operands always broadcast correctly.
- Inputs (Builder.tensor). Each input is `storage.as_strided(sizes, strides, offset)` with a
  random allocation order (stride_order), gaps (contiguity False), an inner step, a storage
  offset (pointers not 16-byte aligned), odd strides on size-1 dims, defined with
  define_tensor (arguments derived here, independently of pyfuser's tensor_descriptor) or
  from_pytorch.
- Values. Each value carries an interval [lo, hi] that bounds it. Ops with restricted domains
  get guarded operands (log, sqrt, rsqrt, reciprocal, div and pow see values >= 0.25: `positive`;
  exp sees values <= 8: `bounded`), and magnitudes stay below 1e4 (float16 casts below 6e4),
  so the float64 reference is well-conditioned and no inf/NaN appears unless on purpose
  (empty means).
- Exactness. A value is *exact* when kernels and the float64 reference compute it bit-for-bit
  (inputs, neg/abs/relu/max/min/where of exact values, widening casts, integer arithmetic, ...).
  Comparisons, float-to-int and float-to-bool casts only take exact operands, so that integer
  and bool outputs can be compared exactly (a float rounded differently could flip them).
- Budget. Shape ops and broadcasts never make a tensor of more than max_elements elements
  (Builder.compatible, Builder.call check it), so a case's cost stays bounded.
- float8. Some float inputs are stored as e4m3fn / e5m2 and cast at once to the float type
  asked for, and some casts round through a float8 type (an output of the case half the time)
  and widen again: float8 tensors take no arithmetic (a definition error), so no other op sees
  one. These choices draw from a stream of their own (Builder.float8_rng), so a case without
  float8 is the case it was before float8 existed.
- Options. random_options() forces kernel variants that heuristics only pick when asked (TMA,
  cp.async, warp-specialized and tensor-map rows, the norm backward's variants, streaming
  loads); the spec's "options" go to fd.execute.

generate() is deterministic: random.Random seeded with the string "pyfuser-fuzz:<seed>:<index>"
(stable across processes and Python versions), torch values seeded from the spec.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import random

import torch

from pyfuser.ir.dtype import DataType, default_scalar_type, result_type

from .spec import DTYPE_NAMES, case_id

BF16, F16, F32, F64 = DataType.BFloat16, DataType.Half, DataType.Float, DataType.Double
I32, I64, BOOL = DataType.Int32, DataType.Int, DataType.Bool
E4M3, E5M2 = DataType.Float8_e4m3fn, DataType.Float8_e5m2
FLOATS = (BF16, F16, F32)
INTS = (I32, I64)
FLOAT8 = (E4M3, E5M2)
# Shares of the float inputs stored as float8, and of the casts that round through float8.
FLOAT8_INPUT_SHARE = 0.08
FLOAT8_CAST_SHARE = 0.2
# e5m2's largest finite value: past it a value rounds to inf (e4m3fn saturates at 448: kept).
MAX_E5M2 = 57344.0

PRIMES = (2, 3, 5, 7, 11, 13, 17, 31, 61, 127, 251, 509, 1021, 2039, 4093, 8191)
# Values beyond this magnitude are scaled or squashed before further ops; float16 casts need
# values below its largest finite number (65504).
MAX_MAGNITUDE = 1e4
MAX_F16 = 6e4
# Domain margins: log/sqrt/rsqrt/reciprocal/div/pow operands are at least this (a smaller
# positive value makes the float64 reference ill-conditioned against 16-bit inputs).
POSITIVE_MARGIN = 0.25
MAX_EXP_ARG = 8.0

FLOAT_UNARY = ("exp", "exp2", "log", "sqrt", "rsqrt", "reciprocal", "tanh", "sigmoid", "erf",
               "silu")
SAME_UNARY = ("neg", "abs", "relu")
ARITH_BINARY = ("add", "sub", "mul", "pow", "maximum", "minimum", "div")
COMPARE = ("eq", "ne", "lt", "le", "gt", "ge")
LOGICAL = ("logical_and", "logical_or")
SHAPE_OPS = ("broadcast", "broadcast_in_dim", "expand", "squeeze", "reshape", "permute")
RESIZE_OPS = ("slice", "pad", "cat")
GATHER_OPS = ("take_along_axis", "gather", "index_select", "embedding")
# scatter: a one-hot (element-wise: frontend/indexing.py) in pointwise DAGs, else torch's;
# scatter_add and index_add: atomic adds (the scatter pattern).
SCATTER_OPS = ("scatter", "scatter_add", "index_add")
REDUCTIONS = ("sum", "max", "min", "mean", "var", "var_mean", "argmax", "argmin")
SCANS = ("cumsum", "cumprod")
# The top-k kernel's k and row length at most (schedulers/topk.py MAX_K, MAX_THREADS x
# MAX_CHUNK).
TOPK_MAX_K = 64
TOPK_MAX_ROW = 16384
# Every frontend op the generator emits (the coverage test checks each appears).
ALL_OPS = (FLOAT_UNARY + SAME_UNARY + ("gelu", "logical_not", "cast", "set", "segment_set")
           + ARITH_BINARY
           + COMPARE + LOGICAL + ("where",) + SHAPE_OPS + RESIZE_OPS + GATHER_OPS + SCATTER_OPS
           + REDUCTIONS
           + SCANS + ("topk",)
           + ("full", "zeros", "ones", "iota", "define_scalar", "linear", "matmul",
              "stride_order", "uniform"))


class GenError(Exception):
    """The generator broke one of its own invariants (a bug in this file)."""


@dataclasses.dataclass(frozen=True)
class Dim:
    axis: int | None     # None: a broadcast dim not tied to an axis
    kind: str            # "full", "bcast" (size 1) or "exp" (expanded: axis size, stride 0)


@dataclasses.dataclass
class Val:
    name: str
    dims: tuple | None   # None: a scalar (fd.define_scalar or an op on scalars)
    dtype: DataType
    lo: float
    hi: float
    exact: bool
    alias: str | None = None     # the frontend returned this op's input unchanged

    @property
    def is_scalar(self) -> bool:
        return self.dims is None

    @property
    def rank(self) -> int:
        return 0 if self.dims is None else len(self.dims)

    @property
    def bound(self) -> float:
        return max(abs(self.lo), abs(self.hi))


def _num_dtype(x) -> DataType:
    return x.dtype if isinstance(x, Val) else default_scalar_type(x)


def _interval(x) -> tuple[float, float]:
    if isinstance(x, Val):
        return x.lo, x.hi
    return float(x), float(x)


def _corners(fn, a, b) -> tuple[float, float]:
    vals = []
    for x in a:
        for y in b:
            try:
                v = fn(x, y)
            except (OverflowError, ZeroDivisionError, ValueError):
                v = math.inf
            if isinstance(v, complex) or math.isnan(v):
                v = math.inf
            vals.append(v)
    return min(vals), max(vals)


@functools.cache
def float8_rounded(x: float, dtype: DataType) -> float:
    """x converted to a float8 type as torch converts (e4m3fn saturates at +-448)."""
    return torch.tensor(x, dtype=torch.float32).to(
        torch.float8_e4m3fn if dtype == E4M3 else torch.float8_e5m2).item()


def _safe(fn, x, default):
    try:
        return fn(x)
    except (OverflowError, ValueError, ZeroDivisionError):
        return default


def _unary_interval(op, lo, hi):
    mono = {"exp": math.exp, "exp2": lambda v: 2.0 ** v, "log": math.log, "sqrt": math.sqrt,
            "tanh": math.tanh, "sigmoid": lambda v: 1 / (1 + math.exp(-v)) if v > -700 else 0.0,
            "erf": math.erf}
    if op in mono:
        f = mono[op]
        return _safe(f, lo, -math.inf), _safe(f, hi, math.inf)
    if op == "rsqrt":
        return _safe(lambda v: 1 / math.sqrt(v), hi, 0.0), _safe(lambda v: 1 / math.sqrt(v), lo, math.inf)
    if op == "reciprocal":
        if lo <= 0 <= hi:
            return -math.inf, math.inf
        return 1 / hi, 1 / lo
    if op in ("silu", "gelu"):
        # Both stay above -0.28 and below max(x, 0).
        return (-0.28 if lo < 0 else 0.0), max(hi, 0.0)
    if op == "neg":
        return -hi, -lo
    if op == "abs":
        return (0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))), max(abs(lo), abs(hi))
    if op == "relu":
        return max(lo, 0.0), max(hi, 0.0)
    raise GenError(f"no interval rule for {op}")


class Builder:
    """The state of one case being generated: axes, inputs, ops and the values they make."""

    def __init__(self, rng: random.Random, max_elements: int,
                 float8_rng: random.Random | None = None):
        self.rng = rng
        self.float8_rng = float8_rng      # the float8 choices' own stream (module docstring)
        self.max_elements = max_elements
        self.sizes: list[int] = []
        self.inputs: list[dict] = []
        self.ops: list[dict] = []
        self.vals: dict[str, Val] = {}
        self.outputs: list[str] = []
        self.aliases: dict[str, str] = {}     # in-place output -> input (output_in_place)
        self.tags = {"ops": set(), "dtypes": set(), "ranks": set(), "layouts": set(),
                     "sizes": set(), "scalars": set(), "outputs": set()}
        self._count = 0

    # Names ------------------------------------------------------------------------------------
    def _name(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self._count - 1}"

    # Axes -------------------------------------------------------------------------------------
    def pick_size(self, cls: str | None = None) -> int:
        """A size of class `cls` (random by weight when None)."""
        r = self.rng
        if cls is None:
            cls = r.choices(["zero", "one", "small", "odd", "prime", "pow2", "pow2pm1", "mult8",
                             "long"], [2, 8, 20, 14, 14, 18, 8, 8, 8])[0]
        if cls == "zero":
            return 0
        if cls == "one":
            return 1
        if cls == "small":
            return r.randint(2, 9)
        if cls == "odd":
            return r.randrange(11, 1000, 2)
        if cls == "prime":
            return r.choice(PRIMES)
        if cls == "pow2":
            return 2 ** r.randint(1, 13)
        if cls == "pow2pm1":
            return 2 ** r.randint(2, 12) + r.choice((-1, 1))
        if cls == "mult8":
            return 8 * r.randint(2, 300)
        if cls == "long":      # rows longer than one block holds in registers
            return r.randint(2049, 16384)
        raise GenError(f"unknown size class {cls}")

    def axis(self, size: int | None = None, cls: str | None = None) -> int:
        self.sizes.append(self.pick_size(cls) if size is None else size)
        return len(self.sizes) - 1

    def fit(self, axes, protect=()) -> None:
        """Shrink the sizes of `axes` (the largest first, `protect`ed ones last) until their
        product is at most max_elements."""
        def total():       # (a size-0 axis counts as 1: tensors may broadcast over it)
            return math.prod(max(self.sizes[a], 1) for a in axes)
        guard = 0
        while total() > self.max_elements:
            guard += 1
            if guard > 200:
                raise GenError(f"cannot fit sizes {[self.sizes[a] for a in axes]}")
            free = [a for a in axes if a not in protect and self.sizes[a] > 1] or \
                   [a for a in axes if self.sizes[a] > 1]
            a = max(free, key=lambda k: self.sizes[k])
            budget = self.max_elements // max(1, total() // self.sizes[a])
            if budget >= 2 and self.rng.random() < 0.7:
                self.sizes[a] = self.rng.randint(max(1, budget // 2), budget)
            else:
                self.sizes[a] = max(1, self.sizes[a] // self.rng.choice((2, 3, 4, 7)))

    def size_of(self, d: Dim) -> int:
        return 1 if d.kind == "bcast" else self.sizes[d.axis]

    def shape_of(self, v: Val) -> list[int]:
        return [self.size_of(d) for d in v.dims]

    def numel(self, v: Val) -> int:
        return math.prod(self.shape_of(v)) if v.dims else 1

    # Values -----------------------------------------------------------------------------------
    def _add(self, v: Val) -> Val:
        self.vals[v.name] = v
        if v.dims is not None:
            self.tags["ranks"].add(v.rank)
        return v

    def tensor(self, dims, dtype: DataType, dist: dict | None = None, layout: str | None = None,
               how: str | None = None) -> Val:
        """A fusion input over `dims` (Dim list). layout: None (random), "contiguous",
        "permuted", "strided", "offset" or "mixed"; how: None (random), "define_tensor",
        "from_pytorch"."""
        if (dtype in FLOATS and self.float8_rng is not None
                and self.float8_rng.random() < FLOAT8_INPUT_SHARE):
            stored = self._float8_input(dims, dtype, dist, layout, how)
            if stored is not None:
                return stored
        r = self.rng
        dims = list(dims)
        n = len(dims)
        sizes = [self.size_of(d) for d in dims]
        if layout is None:
            layout = r.choices(["contiguous", "permuted", "strided", "offset", "mixed"],
                               [40, 15, 15, 15, 15])[0]
        real = [k for k, d in enumerate(dims) if d.kind == "full"]
        order = list(range(n))                     # allocation order, outer to inner
        permute = layout in ("permuted", "mixed") and len(real) >= 2
        if permute:
            while True:
                shuffled = real[:]
                r.shuffle(shuffled)
                if shuffled != real:
                    break
            it = iter(shuffled)
            order = [next(it) if k in real else k for k in order]
        if layout in ("permuted", "mixed") and n >= 2 and r.random() < 0.3:
            # Broadcast dims may sit anywhere in the allocation order.
            others = [k for k in order if k not in real]
            if others:
                k = r.choice(others)
                order.remove(k)
                order.insert(r.randrange(n), k)
                permute = permute or order != list(range(n))
        strided = layout in ("strided", "mixed")
        step = r.choice((2, 3)) if strided and real and r.random() < 0.35 else 1
        strides = [0] * n
        pads = {}
        acc = None
        inner_real = [k for k in reversed(order) if k in real]
        for k in inner_real:
            if acc is None:
                strides[k] = step
            else:
                pad = 0
                if strided and r.random() < 0.6:
                    # Gaps of odd sizes, or rows padded to a multiple of 8 elements (aligned
                    # rows that are still not contiguous).
                    pad = r.choice((r.randint(1, 7), (-acc) % 8 or 8))
                pads[k] = pad
                strides[k] = acc + pad
            acc = strides[k] * max(sizes[k], 1)
        for k, d in enumerate(dims):
            if d.kind == "exp":
                strides[k] = 0
            elif d.kind == "bcast":
                # A size-1 dim's stride means nothing: vary it.
                strides[k] = r.choice((0, 1, 7, (acc or 1), 1 << 20)) if r.random() < 0.4 else (
                    self._natural_stride(k, order, strides, sizes))
        offset = 0
        if layout in ("offset", "mixed") and r.random() < (1.0 if layout == "offset" else 0.5):
            offset = r.choice((1, 2, 3, 5, 7, 8, 16)) if r.random() < 0.85 else r.randint(1, 40)
        if all(sizes):
            storage = offset + 1 + sum((s - 1) * st for s, st in zip(sizes, strides))
        else:
            storage = offset
        if how is None:
            how = "from_pytorch" if r.random() < 0.3 else "define_tensor"
        if how == "from_pytorch":
            # from_pytorch sees size-1 dims as broadcasts and stride-0 dims as expanded.
            dims = [Dim(d.axis, "bcast") if sizes[k] == 1 and d.kind != "bcast" else d
                    for k, d in enumerate(dims)]
            # (static_sizes with a size-0 dim makes from_pytorch fail: reported, not fuzzed.)
            define = {"how": "from_pytorch", "static_sizes": r.random() < 0.1 and all(sizes)}
        else:
            define = self._define_args(dims, sizes, strides, order, real, step, pads)
        name = f"t{len(self.inputs)}"
        dist = dist or self._default_dist(dtype)
        self.inputs.append({
            "name": name, "kind": "tensor", "dtype": DTYPE_NAMES[dtype], "sizes": sizes,
            "strides": strides, "offset": offset, "storage": storage,
            "values": dict(dist, seed=r.randrange(1 << 30)), "define": define,
        })
        lo, hi = (0.0, 1.0) if dist["dist"] == "bool" else (float(dist["lo"]), float(dist["hi"]))
        tags = self.tags
        tags["dtypes"].add(DTYPE_NAMES[dtype])
        tags["layouts"].add(how)
        tags["layouts"].update(
            t for t, on in (("contiguous", not permute and not strided and step == 1 and not offset),
                            ("permuted", permute), ("strided", step > 1 or any(pads.values())),
                            ("offset", offset % 8 != 0), ("aligned_offset", offset and offset % 8 == 0),
                            ("expanded", any(d.kind == "exp" for d in dims)),
                            ("size1_dim", any(d.kind == "bcast" for d in dims)),
                            ("one_tensor", n == 1 and dims[0].kind == "bcast"),
                            ("rank0", n == 0)) if on)
        for s in sizes:
            tags["sizes"].add(self._size_class(s))
        return self._add(Val(name, tuple(dims), dtype, lo, hi, True))

    def _float8_input(self, dims, dtype, dist, layout, how) -> Val | None:
        """An input stored as float8 and cast to `dtype` at once; None where the values' bounds
        are no float8 values (the rounded values would leave the interval)."""
        dist = dist or self._default_dist(dtype)
        f8 = self.float8_rng.choice(FLOAT8)
        if any(float8_rounded(float(dist[k]), f8) != float(dist[k]) for k in ("lo", "hi")):
            return None
        return self.call("cast", self.tensor(dims, f8, dist, layout, how), dtype=dtype)

    @staticmethod
    def _natural_stride(k, order, strides, sizes) -> int:
        inner = [j for j in order[order.index(k) + 1:] if strides[j]]
        if not inner:
            return 1
        j = inner[0]
        return strides[j] * max(sizes[j], 1)

    @staticmethod
    def _size_class(s: int) -> str:
        if s in (0, 1):
            return str(s)
        if s > 2048:
            return "long"
        if s & (s - 1) == 0:
            return "pow2"
        if s in PRIMES:
            return "prime"
        return "odd" if s % 2 else "even"

    def _define_args(self, dims, sizes, strides, order, real, step, pads) -> dict:
        """define_tensor's arguments for the layout built by tensor(), derived from the
        construction (not from the strides): contiguity False where a gap or a step was put."""
        r = self.rng
        shape = []
        for k, d in enumerate(dims):
            if d.kind == "bcast":
                shape.append(1)
            elif d.kind == "exp":
                shape.append(-1)
            elif sizes[k] > 1 and r.random() < 0.08:
                shape.append(sizes[k])             # a static size
            else:
                shape.append(-1)
        innermost = next((k for k in reversed(order) if k in real), None)
        contiguity = []
        for k in order:
            if dims[k].kind != "full":
                contiguity.append(None)
            elif k == innermost:
                contiguity.append(step == 1)
            else:
                contiguity.append(pads.get(k, 0) == 0)
        stride_order = None
        if order != list(range(len(dims))):
            stride_order = [0] * len(dims)
            for pos, k in enumerate(order):
                stride_order[k] = len(dims) - 1 - pos
        expanded = [d.kind == "exp" for d in dims]
        return {"how": "define_tensor", "shape": shape, "contiguity": contiguity,
                "stride_order": stride_order, "expanded": expanded if any(expanded) else None}

    def _default_dist(self, dtype: DataType) -> dict:
        if dtype == BOOL:
            return {"dist": "bool", "lo": 0, "hi": 1}
        if dtype in INTS:
            lo = self.rng.choice((-8, -3, 0))
            return {"dist": "int", "lo": lo, "hi": lo + self.rng.choice((4, 8, 16))}
        if self.rng.random() < 0.25:
            return {"dist": "uniform", "lo": 0.5, "hi": 2.0}
        return {"dist": "normal", "lo": -4.0, "hi": 4.0}

    def scalar_input(self, dtype: DataType, value) -> Val:
        name = f"s{len(self.inputs)}"
        self.inputs.append({"name": name, "kind": "scalar", "dtype": DTYPE_NAMES[dtype],
                            "value": value})
        self.tags["scalars"].add("runtime")
        return self._add(Val(name, None, dtype, float(value), float(value), True))

    # Ops --------------------------------------------------------------------------------------
    def call(self, op: str, *args, **kwargs):
        """Record `fd.ops.<op>(*args, **kwargs)` and return its value(s)."""
        outs = self._infer(op, list(args), dict(kwargs))
        single = not isinstance(outs, tuple)
        outs = (outs,) if single else outs
        for o in outs:
            if o.dims is not None and math.prod(self.size_of(d) for d in o.dims) > self.max_elements:
                raise GenError(f"{op} makes {o.name} of {self.shape_of(o)} elements, over the "
                               f"budget of {self.max_elements}")
        names = [o.name for o in outs]
        enc = [a.name if isinstance(a, Val) else a for a in args]
        kw = {k: (DTYPE_NAMES[v] if isinstance(v, DataType) else v) for k, v in kwargs.items()
              if not k.startswith("_")}
        self.ops.append({"out": names[0] if single else names, "op": op, "args": enc,
                         "kwargs": kw})
        self.tags["ops"].add(op)
        for o in outs:
            self._add(o)
        return outs[0] if single else outs

    def scalar(self, value, dtype: DataType | None = None) -> Val:
        """fd.define_scalar(value[, dtype]): a constant scalar value."""
        kw = {"value": value}
        if dtype is not None:
            kw["dtype"] = dtype
        self.tags["scalars"].add("constant")
        return self.call("define_scalar", **kw)

    def _pointwise_dims(self, operands) -> tuple | None:
        tensors = [x for x in operands if isinstance(x, Val) and not x.is_scalar]
        if not tensors:
            return None
        rank = max(t.rank for t in tensors)
        out = []
        for k in range(rank):
            col = []
            for t in tensors:
                j = k - (rank - t.rank)
                col.append(t.dims[j] if j >= 0 else Dim(None, "bcast"))
            concrete = [d for d in col if d.kind != "bcast"]
            if not concrete:
                out.append(Dim(None, "bcast"))
                continue
            if len({d.axis for d in concrete}) != 1:
                raise GenError(f"operands {[t.name for t in tensors]} do not broadcast at dim {k}")
            kind = "full" if any(d.kind == "full" for d in concrete) else "exp"
            out.append(Dim(concrete[0].axis, kind))
        return tuple(out)

    def compatible(self, *operands) -> bool:
        """Whether the operands broadcast together into a result within the element budget."""
        try:
            dims = self._pointwise_dims(operands)
        except GenError:
            return False
        return dims is None or math.prod(self.size_of(d) for d in dims) <= self.max_elements

    def _infer(self, op, args, kw):
        name = self._name("v")
        vals = [a for a in args if isinstance(a, Val)]
        if op == "define_scalar":
            value = kw["value"]
            dt = kw.get("dtype") or default_scalar_type(value)
            return Val(name, None, dt, float(value), float(value), True)
        x = args[0] if args else None
        if op in FLOAT_UNARY or op == "gelu":
            dt = x.dtype if x.dtype.is_floating else F32
            lo, hi = _unary_interval("gelu" if op == "gelu" else op, x.lo, x.hi)
            return Val(name, x.dims, dt, lo, hi, False)
        if op in SAME_UNARY:
            lo, hi = _unary_interval(op, x.lo, x.hi)
            return Val(name, x.dims, x.dtype, lo, hi, x.exact)
        if op == "logical_not":
            return Val(name, x.dims, BOOL, 0.0, 1.0, x.exact)
        if op in ("set", "segment_set"):
            return Val(name, x.dims, x.dtype, x.lo, x.hi, x.exact)
        if op == "cast":
            dt = kw["dtype"]
            if dt == x.dtype:
                return Val(name, x.dims, dt, x.lo, x.hi, x.exact, alias=x.alias or x.name)
            return Val(name, x.dims, dt, *self._cast_interval(x, dt), self._cast_exact(x, dt))
        if op in ARITH_BINARY or op in COMPARE or op in LOGICAL:
            a, b = args
            dims = self._pointwise_dims([a, b])
            tensors = [v.dtype for v in (a, b) if isinstance(v, Val) and not v.is_scalar]
            scalars = [_num_dtype(v) for v in (a, b) if not (isinstance(v, Val) and not v.is_scalar)]
            dt = result_type(tensors, scalars) if tensors else result_type(scalars, [])
            # Operands promoted to dt round in the kernel, not in the float64 reference (a
            # count of 2039 compared with a bf16 tensor is 2032 there): exact only if dt holds
            # each operand's values.
            exact = all(v.exact and self._cast_exact(v, dt) for v in vals)
            if op in COMPARE or op in LOGICAL:
                return Val(name, dims, BOOL, 0.0, 1.0, exact)
            if op == "div" and not dt.is_floating:
                dt = F32
            fns = {"add": lambda p, q: p + q, "sub": lambda p, q: p - q,
                   "mul": lambda p, q: p * q, "pow": lambda p, q: p ** q,
                   "maximum": max, "minimum": min, "div": lambda p, q: p / q}
            lo, hi = _corners(fns[op], _interval(a), _interval(b))
            if op == "mul" and a is b:        # a square
                lo = 0.0 if a.lo <= 0 <= a.hi else min(a.lo ** 2, a.hi ** 2)
            if dt == BOOL:
                lo, hi = 0.0, 1.0
            if op in ("add", "sub", "mul", "pow"):
                exact = exact and not dt.is_floating
            elif op == "div":
                exact = False
            return Val(name, dims, dt, lo, hi, exact)
        if op == "where":
            c, a, b = args
            dims = self._pointwise_dims([c, a, b])
            tensors = [v.dtype for v in (a, b) if isinstance(v, Val) and not v.is_scalar]
            scalars = [_num_dtype(v) for v in (a, b) if not (isinstance(v, Val) and not v.is_scalar)]
            dt = result_type(tensors, scalars) if tensors else result_type(scalars, [])
            (la, ha), (lb, hb) = _interval(a), _interval(b)
            exact = all(v.exact and self._cast_exact(v, dt) for v in vals if v is not c)
            return Val(name, dims, dt, min(la, lb), max(ha, hb),
                       exact and getattr(c, "exact", True))
        if op == "broadcast":
            flags = args[1]
            it = iter(x.dims)
            dims = tuple(Dim(None, "bcast") if f else next(it) for f in flags)
            return Val(name, dims, x.dtype, x.lo, x.hi, x.exact)
        if op == "broadcast_in_dim":
            shape, bdims = args[1], args[2]
            dims = []
            axes = kw.pop("_axes")      # axis of each new expanded dim (generator-only)
            for k, s in enumerate(shape):
                if k in bdims:
                    dims.append(x.dims[bdims.index(k)])
                elif s in (-1, 1):
                    dims.append(Dim(None, "bcast"))
                else:
                    dims.append(Dim(axes[k], "exp"))
            return Val(name, tuple(dims), x.dtype, x.lo, x.hi, x.exact)
        if op == "expand":
            shape = args[1]
            axes = kw.pop("_axes")
            dims = tuple(d if s == -1 else (Dim(None, "bcast") if s == 1 else Dim(axes[k], "exp"))
                         for k, (d, s) in enumerate(zip(x.dims, shape)))
            return Val(name, dims, x.dtype, x.lo, x.hi, x.exact)
        if op == "squeeze":
            drop = args[1]
            dims = tuple(d for k, d in enumerate(x.dims) if k not in drop)
            return Val(name, dims, x.dtype, x.lo, x.hi, x.exact)
        if op == "permute":
            perm = args[1]
            return Val(name, tuple(x.dims[p] for p in perm), x.dtype, x.lo, x.hi, x.exact)
        if op == "reshape":
            new_axes = kw.pop("_axes")
            dims = tuple(Dim(None, "bcast") if s == 1 else Dim(a, "full")
                         for s, a in zip(args[1], new_axes))
            return Val(name, dims, x.dtype, x.lo, x.hi, x.exact)
        if op in REDUCTIONS:
            return self._infer_reduction(op, name, x, args, kw)
        if op == "uniform":
            axes = kw.pop("_axes")
            dims = tuple(Dim(None, "bcast") if s == 1 else Dim(a, "full")
                         for s, a in zip(args[2], axes))
            return Val(name, dims, kw["dtype"], float(args[0]), float(args[1]), True)
        if op in ("full", "zeros", "ones"):
            shape = args[0]
            axes = kw.pop("_axes")
            value = {"zeros": 0, "ones": 1}.get(op, args[1] if len(args) > 1 else None)
            dt = kw.get("dtype") or default_scalar_type(value)
            if op == "full" and "dtype" not in kw and dt == F64:
                dt = F32
            dims = tuple(Dim(None, "bcast") if s == 1 else Dim(a, "full")
                         for s, a in zip(shape, axes))
            v = float(value.lo if isinstance(value, Val) else value)
            return Val(name, dims, dt, v, v, not isinstance(value, Val) or value.exact)
        if op in RESIZE_OPS:
            k, axis = kw.pop("_k"), kw.pop("_axis")
            srcs = args[:-1] if op == "cat" else [x]
            src = srcs[0]
            dims = src.dims[:k] + (Dim(axis, "full"),) + src.dims[k + 1:]
            lo, hi = min(v.lo for v in srcs), max(v.hi for v in srcs)
            dt = result_type([v.dtype for v in srcs], []) if op == "cat" else src.dtype
            exact = all(v.exact for v in srcs)
            if op == "pad":
                v = float(args[2])
                lo, hi = min(lo, v), max(hi, v)
            return Val(name, dims, dt, lo, hi, exact)
        if op in SCATTER_OPS:
            # x's dims and dtype; the generator knows the interval the writes or sums keep to.
            return Val(name, kw.pop("_dims"), x.dtype, kw.pop("_lo"), kw.pop("_hi"),
                       kw.pop("_exact"))
        if op in GATHER_OPS:
            # Elements of the source at in-range indices: its values, its interval.
            src = args[1] if op == "embedding" else x
            return Val(name, kw.pop("_dims"), src.dtype, src.lo, src.hi, src.exact)
        if op == "iota":
            # start + k * step for k < length: exact small integers or multiples of 0.5.
            n, start, step = args
            axis = kw.pop("_axis")
            ends = (start, start + (n - 1) * step)
            return Val(name, (Dim(None, "bcast") if n == 1 else Dim(axis, "full"),),
                       kw["dtype"], float(min(ends)), float(max(ends)), True)
        if op in SCANS:
            # torch's dtypes: int64 for integers and bools. Running sums of n elements stay
            # within n times the input's interval; products within its bound to the n-th power.
            dim = args[1] % x.rank
            n = self.size_of(x.dims[dim])
            dt = x.dtype if x.dtype.is_floating else I64
            if op == "cumsum":
                lo, hi = min(x.lo, n * x.lo), max(x.hi, n * x.hi)
            else:
                big = n * math.log(max(1.0, x.bound)) > math.log(1e30)
                hi = 1e30 if big else max(1.0, x.bound) ** n
                lo = 0.0 if x.lo >= 0 else -hi
            return Val(name, x.dims, dt, lo, hi, x.exact and not dt.is_floating)
        if op == "topk":
            # (values, int64 indices): x's dims with a new axis of k along dim.
            k, dim = args[1], args[2] % x.rank
            dims = tuple(Dim(self.axis(k), "full") if d == dim else x.dims[d]
                         for d in range(x.rank))
            n = self.size_of(x.dims[dim])
            return (Val(name, dims, x.dtype, x.lo, x.hi, x.exact),
                    Val(self._name("v"), dims, I64, 0.0, float(max(n - 1, 0)), True))
        if op == "stride_order":
            # A copy laid out in memory by the order (fd.ops.stride_order): same values.
            return Val(name, x.dims, x.dtype, x.lo, x.hi, x.exact)
        if op == "matmul":
            # a [(B,) M, K] @ b [(B,) K, N]: the matmul kernel, or torch's where it does not take
            # it. (b batched only with a.)
            w = args[1]
            k = self.size_of(x.dims[-1])
            bound = k * x.bound * w.bound
            return Val(name, x.dims[:-1] + (w.dims[-1],), x.dtype, -bound, bound, False)
        if op == "linear":
            # x [M, K] @ w[N, K]^T (+ bias [N]): the matmul kernel where it takes the shapes,
            # else a library segment (cuBLAS through torch).
            w = args[1]
            bias = args[2] if len(args) > 2 else kw.get("bias")
            k = self.size_of(x.dims[-1])
            bound = k * x.bound * w.bound + (bias.bound if isinstance(bias, Val) else 0.0)
            return Val(name, x.dims[:-1] + (w.dims[0],), x.dtype, -bound, bound, False)
        raise GenError(f"no inference rule for {op}")

    def _infer_reduction(self, op, name, x, args, kw):
        dims_arg = args[1] if len(args) > 1 else None
        keepdim = kw.get("keepdim", False)
        if op in ("argmax", "argmin"):
            # One dim, or the flattened tensor (None): an int64 index into it.
            red = list(range(x.rank)) if dims_arg is None else [dims_arg % x.rank]
            count = math.prod(self.size_of(x.dims[k]) for k in red)
            out_dims = (tuple(Dim(None, "bcast") if k in red else d for k, d in enumerate(x.dims))
                        if keepdim else tuple(d for k, d in enumerate(x.dims) if k not in red))
            return Val(name, out_dims, I64, 0.0, float(max(count - 1, 0)), True)
        red = list(range(x.rank)) if dims_arg is None else sorted(d % x.rank for d in dims_arg)
        count = math.prod(self.size_of(x.dims[k]) for k in red)
        if keepdim:
            out_dims = tuple(Dim(None, "bcast") if k in red else d for k, d in enumerate(x.dims))
        else:
            out_dims = tuple(d for k, d in enumerate(x.dims) if k not in red)
        if op == "sum":
            dt = kw.get("dtype") or (x.dtype if x.dtype.is_floating else I64)
            lo, hi = min(0.0, count * x.lo), max(0.0, count * x.hi)
            return Val(name, out_dims, dt, lo, hi, x.exact and not dt.is_floating)
        if op in ("max", "min"):
            return Val(name, out_dims, x.dtype, x.lo, x.hi, x.exact)
        if op == "mean":
            return Val(name, out_dims, x.dtype, min(x.lo, 0.0), max(x.hi, 0.0), False)
        # var, var_mean: the two-pass formula over N - correction.
        correction = kw.get("correction", 1)
        denom = max(count - correction, 1)
        var = Val(name, out_dims, x.dtype, 0.0, (x.hi - x.lo) ** 2 * count / denom, False)
        if op == "var":
            return var
        mean_dims = tuple(Dim(None, "bcast") if k in red else d for k, d in enumerate(x.dims)) \
            if keepdim else out_dims
        return var, Val(self._name("v"), mean_dims, x.dtype, min(x.lo, 0.0), max(x.hi, 0.0), False)

    @staticmethod
    def _cast_interval(x: Val, dt: DataType):
        if dt == BOOL:
            return 0.0, 1.0
        if dt.is_float8:
            # Rounding is monotonic: the bounds' float8 values bound the values'.
            return float8_rounded(x.lo, dt), float8_rounded(x.hi, dt)
        if not dt.is_floating and x.dtype.is_floating:
            return float(math.trunc(x.lo)), float(math.trunc(x.hi))
        return x.lo, x.hi

    @staticmethod
    def _cast_exact(x: Val, dt: DataType) -> bool:
        if not x.exact:
            return False
        if dt.is_float8:
            # The reference rounds a float8 value where it is made, as the kernel does.
            return True
        if dt.is_floating and x.dtype.is_floating:
            # Widening keeps the value; narrowing rounds in the kernel, not in the reference.
            return dt.size > x.dtype.size or dt == x.dtype or (x.dtype in (BF16, F16) and dt == F32)
        if dt.is_floating:
            # Small integers and bools are exact in every float type.
            return x.bound <= 256
        return True

    # Guards -----------------------------------------------------------------------------------
    def as_float(self, v: Val, dtype: DataType | None = None) -> Val:
        if v.dtype.is_floating:
            return v
        return self.call("cast", v, dtype=dtype or self.rng.choice((F32, F32, BF16)))

    def positive(self, v: Val, margin: float = POSITIVE_MARGIN) -> Val:
        """v itself if it is at least `margin`, else a guarded value that is (abs(v) + c, v*v + c
        or sigmoid(v) + c)."""
        if v.lo >= margin and v.bound <= MAX_MAGNITUDE:
            return v
        r = self.rng
        v = self.bounded(v, 30.0)
        choice = r.random()
        if v.is_scalar:
            return self.call("add", self.call("mul", v, v), r.choice((0.5, 1.0)))
        if choice < 0.5 or v.dtype == BOOL:
            base = self.call("abs", v) if v.dtype != BOOL else self.call("cast", v, dtype=F32)
        elif choice < 0.8 and v.dtype.is_floating:
            base = self.call("mul", v, v)
        else:
            base = self.call("sigmoid", v)
        c = r.choice((0.5, 1.0, 0.25 + margin)) if base.dtype.is_floating else r.choice((1, 2))
        if base.dtype.is_floating and r.random() < 0.3:
            c = self.scalar(float(c))
        return self.call("add", base, c)

    def bounded(self, v: Val, limit: float = MAX_MAGNITUDE) -> Val:
        """v with |v| <= limit: scaled by a power of two (exact) when a little above, else
        squashed by tanh/sigmoid/erf and scaled."""
        if v.bound <= limit:
            return v
        r = self.rng
        v = self.as_float(v)
        ratio = v.bound / limit
        if ratio <= 16 and math.isfinite(ratio):
            return self.call("mul", v, 2.0 ** -math.ceil(math.log2(ratio)))
        if v.bound > 1e30 or not math.isfinite(v.bound):
            v = self.call(r.choice(("tanh", "sigmoid", "erf")), v)
        else:
            v = self.call("mul", v, 2.0 ** -math.ceil(math.log2(v.bound)))  # into [-1, 1]
            v = self.call(r.choice(("tanh", "sigmoid", "erf")), v)
        return v if limit >= 1 else self.call("mul", v, limit)

    # Random pieces ----------------------------------------------------------------------------
    def pick_float_dtype(self, allow_f64: bool = True) -> DataType:
        dts = [BF16, F16, F32] + ([F64] if allow_f64 else [])
        return self.rng.choices(dts, [35, 25, 35, 5][:len(dts)])[0]

    def random_scalar_operand(self, like: Val):
        """A scalar operand for an op with `like`: a Python number, an fd constant or an
        fd.ops expression of scalars; exactly representable in every float type."""
        r = self.rng
        if like.dtype.is_floating or r.random() < 0.3:
            value = r.choice((0.5, 2.0, -1.0, 1.5, 0.25, 3.0, -0.75))
        else:
            value = r.choice((1, 2, 3, -1))
        roll = r.random()
        if roll < 0.6:
            return value
        if roll < 0.85:
            return self.scalar(value)
        s = self.scalar(value)
        return self.call(r.choice(("add", "mul")), s, r.choice((1.0, 0.5)) if isinstance(value, float) else 1)

    def unary_step(self, x: Val) -> Val:
        """One random elementwise op on x (guards included)."""
        r = self.rng
        kind = r.choices(["float", "same", "gelu", "cast", "set", "not"], [50, 18, 8, 14, 4, 6])[0]
        if kind == "not" or (x.dtype == BOOL and kind in ("same", "float") and r.random() < 0.5):
            return self.call("logical_not", x) if x.exact else self.call("logical_not", self.exact_bool(x))
        if kind == "same" and x.dtype != BOOL:
            return self.call(r.choice(SAME_UNARY), x)
        if kind == "gelu":
            return self.call("gelu", self.bounded(x), approximate=r.choice(("none", "tanh")))
        if kind == "set":
            return self.call("set", x)
        if kind == "cast":
            return self.random_cast(x)
        op = r.choice(FLOAT_UNARY)
        if op in ("log", "sqrt", "rsqrt", "reciprocal"):
            x = self.positive(x)
        elif op in ("exp", "exp2"):
            x = self.bounded(x, MAX_EXP_ARG)
            if x.lo < -60:
                x = self.call("maximum", x, -8.0) if x.dtype.is_floating else x
        else:
            x = self.bounded(x)
        return self.call(op, x)

    def random_cast(self, x: Val) -> Val:
        if (x.dtype.is_floating and not x.is_scalar and self.float8_rng is not None
                and self.float8_rng.random() < FLOAT8_CAST_SHARE):
            widened = self.float8_round_trip(x)
            if widened is not None:
                return widened
        r = self.rng
        targets = [BF16, F16, F32, F64, I32, I64, BOOL]
        weights = [25, 15, 30, 3, 8, 8, 6]
        for _ in range(8):
            dt = r.choices(targets, weights)[0]
            if dt == x.dtype:
                continue
            if not dt.is_floating and x.dtype.is_floating and not x.exact:
                continue                 # a rounded float could truncate the other way
            if dt == F16 and x.bound > MAX_F16:
                continue
            if dt in (I32,) and x.bound > 2 ** 30:
                continue
            return self.call("cast", x, dtype=dt)
        return self.call("cast", x, dtype=F32 if x.dtype != F32 else BF16)

    def float8_round_trip(self, x: Val) -> Val | None:
        """x cast to a float8 type (an output half the time) and widened again, since float8
        tensors take no other op; None where e5m2 would overflow to inf."""
        f8 = self.float8_rng.choice(FLOAT8)
        if f8 == E5M2 and x.bound >= MAX_E5M2:
            f8 = E4M3                  # saturates at 448 instead
        stored = self.call("cast", x, dtype=f8)
        if self.float8_rng.random() < 0.5:
            self.output(stored)
        return self.call("cast", stored, dtype=self.float8_rng.choice((F32, BF16, F16)))

    def exact_bool(self, x: Val) -> Val:
        """A bool from x for logical ops: x itself if exact bool, else a comparison of an exact
        input with a constant."""
        if x.dtype == BOOL and x.exact:
            return x
        src = x if x.exact else self.exact_source(x.dims)
        return self.call(self.rng.choice(COMPARE), src, 0 if not src.dtype.is_floating else 0.5)

    def exact_source(self, dims) -> Val:
        """An exact value whose dims broadcast with `dims` (an input, else a full of zeros)."""
        cands = [v for v in self.vals.values() if v.exact and not v.is_scalar and v.dims is not None
                 and not v.dtype.is_float8
                 and (dims is None or self.compatible_dims(v.dims, dims))]
        if cands:
            return self.rng.choice(cands)
        # (full refuses size 0; a size-1 dim broadcasts against it instead.)
        shape_axes = [(self.size_of(d), d.axis) if self.size_of(d) else (1, None)
                      for d in (dims or ())]
        if math.prod(s for s, _ in shape_axes) > self.max_elements:
            # dims of two broadcast operands can span more than the budget (fuzz 20261407:767:
            # the generator raised and the worker died): size 1 everywhere broadcasts too.
            shape_axes = [(1, None)] * len(shape_axes)
        return self.call("full", [s for s, _ in shape_axes], 1.0, dtype=F32,
                         _axes=[a for _, a in shape_axes])

    def compatible_dims(self, a, b) -> bool:
        return self.compatible(Val("_a", tuple(a), F32, 0, 0, True), Val("_b", tuple(b), F32, 0, 0, True))

    def binary_step(self, a: Val, b) -> Val:
        """One random binary/compare/where op on a and b (b may be a Python number)."""
        r = self.rng
        kind = r.choices(["arith", "compare", "logical", "where"], [62, 14, 8, 16])[0]
        if kind == "compare":
            a2 = a if a.exact else self.exact_source(a.dims)
            b2 = b if (not isinstance(b, Val) or b.exact) else self.exact_source(a2.dims)
            if isinstance(b2, Val) and not self.compatible(a2, b2):
                b2 = 0.5
            if not isinstance(b2, Val) and not a2.dtype.is_floating:
                b2 = int(b2) if not isinstance(b2, bool) else b2
            return self.call(r.choice(COMPARE), a2, b2)
        if kind == "logical":
            p = self.exact_bool(a)
            q = self.exact_bool(b) if isinstance(b, Val) else r.choice((True, False))
            if isinstance(q, Val) and not self.compatible(p, q):
                q = True
            return self.call(r.choice(LOGICAL), p, q)
        if kind == "where":
            cond = self.exact_bool(self.exact_source(self._pointwise_dims([a, b])))
            return self.call("where", cond, a, b)
        op = r.choice(("add", "sub", "mul", "mul", "pow", "maximum", "minimum", "div"))
        if op == "sub" and (a.dtype == BOOL or (isinstance(b, Val) and b.dtype == BOOL) or isinstance(b, bool)):
            op = "add"
        if op == "pow":
            base = self.positive(a) if a.dtype.is_floating or not isinstance(b, Val) else a
            if base.dtype.is_floating:
                if isinstance(b, Val):
                    e = self.bounded(self.as_float(b), 2.0)
                else:
                    e = r.choice((2, 0.5, -1.0, 3, 1.5, -0.5))
                return self.call("pow", self.bounded(base, 4.0) if base.bound > 4 else base, e)
            return self.call("pow", self.call("abs", base) if base.dtype != BOOL else base,
                             r.choice((0, 1, 2, 3)))
        if op == "div":
            return self.call("div", a, self.positive(b) if isinstance(b, Val) else r.choice((2.0, -4.0, 0.5, 3)))
        if op == "mul":
            if a.bound > 100:
                a = self.bounded(a, 100)
            if isinstance(b, Val) and b.bound > 100:
                b = self.bounded(b, 100)
        if not a.dtype.is_floating and isinstance(b, Val) and not b.dtype.is_floating and \
                max(a.bound, b.bound) > 2 ** 20:
            op = "maximum"
        out = self.call(op, a, b)
        if out.bound > MAX_MAGNITUDE and out.dtype.is_floating:
            out = self.bounded(out)
        return out

    def pointwise_dag(self, pool: list, steps: int) -> list:
        """`steps` random elementwise ops over values of `pool` (which grows); returns the new
        values in order."""
        r = self.rng
        made = []
        for _ in range(steps):
            x = r.choice(pool)
            roll = r.random()
            if roll < 0.4 or x.is_scalar:
                if x.is_scalar:
                    tensors = [v for v in pool if not v.is_scalar]
                    if not tensors:
                        continue
                    y = self.binary_step(r.choice(tensors), x)
                else:
                    y = self.unary_step(x)
            elif roll < 0.85:
                partners = [v for v in pool if v is not x and self.compatible(x, v)]
                if partners and r.random() < 0.8:
                    y = self.binary_step(x, r.choice(partners))
                else:
                    y = self.binary_step(x, self.random_scalar_operand(x))
            elif roll < 0.9:
                y = self.shape_step(x) or self.unary_step(x)
            elif roll < 0.925:
                y = self.resize_step(x) or self.unary_step(x)
            elif roll < 0.94:
                y = self.gather_step(x) or self.unary_step(x)
            elif roll < 0.95:
                y = self.one_hot_step(x) or self.unary_step(x)
            else:
                y = self.binary_step(x, self.creation_step(x))
            pool.append(y)
            made.append(y)
        return made

    def creation_step(self, like: Val) -> Val:
        """fd.ops.full / zeros / ones shaped like `like` (size-0 dims as 1, which broadcast)."""
        r = self.rng
        dims = like.dims or ()
        shape = [self.size_of(d) or 1 for d in dims]
        axes = [d.axis if self.size_of(d) > 1 else None for d in dims]
        if dims and r.random() < 0.25:
            return self.iota_step(like)
        if r.random() < 0.3:
            # Uniform random numbers from a constant seed and offset: the same bits on every
            # path (normal draws are left out: their logf and cosf round apart).
            low, high = r.choice(((0.0, 1.0), (-2.0, 3.0)))
            return self.call("uniform", low, high, shape, rng_seed=r.randrange(2 ** 40),
                             rng_offset=r.randrange(100), dtype=r.choice((F32, BF16)),
                             _axes=axes)
        op = r.choice(("full", "zeros", "ones"))
        dt = r.choice((F32, BF16, F16, I32, I64))
        if op == "full":
            scalars = [v for v in self.vals.values() if v.is_scalar and v.exact]
            value = r.choice(scalars) if scalars and r.random() < 0.3 else r.choice((0.5, 2.0, -1.0, 3.0))
            if not dt.is_floating and not isinstance(value, Val):
                value = int(value)
            if isinstance(value, Val) and not value.dtype.is_floating and dt.is_floating:
                dt = F32
            return self.call("full", shape, value, dtype=dt, _axes=axes)
        return self.call(op, shape, dtype=dt, _axes=axes)

    def iota_step(self, like: Val) -> Val:
        """fd.ops.iota along one dim of `like`, broadcast to its rank: values that differ along
        that dim, made from the kernel's index."""
        r = self.rng
        k = r.randrange(like.rank)
        n = self.size_of(like.dims[k]) or 1
        dt = r.choice((I64, I32, F32))
        start, step = r.choice((0, 3, -5)), r.choice((1, 2, -1))
        if dt.is_floating:
            start, step = start / 2, step / 2
        v = self.call("iota", n, start, step, dtype=dt,
                      _axis=like.dims[k].axis if n > 1 else None)
        if like.rank == 1:
            return v
        return self.call("broadcast", v, [j != k for j in range(like.rank)])

    def full_dim(self, x: Val) -> tuple | None:
        """(position, size) of a random full dim of x of size 2 or more, or None (a size-1 axis
        may be defined as a broadcast, and a resize or gather of it says little)."""
        if x.is_scalar:
            return None
        ks = [k for k, d in enumerate(x.dims) if d.kind == "full" and self.size_of(d) >= 2]
        if not ks:
            return None
        k = self.rng.choice(ks)
        return k, self.size_of(x.dims[k])

    def resize_step(self, x: Val) -> Val | None:
        """A slice, pad or cat of x along one of its full dims (a new axis of the result's
        size), or None when x has none of size 2 or more."""
        r = self.rng
        picked = self.full_dim(x)
        if picked is None:
            return None
        k, n = picked
        # (A size-0 dim counts as 1: values made to broadcast with x take size 1 there.)
        total = math.prod(max(self.size_of(d), 1) for d in x.dims)
        op = r.choice(("slice", "slice", "pad", "cat"))
        left, right = r.choice(((1, 0), (0, 2), (3, 1), (2, 2)))
        grown = {"cat": 2 * n, "pad": n + left + right}.get(op, n)
        if total // n * grown > self.max_elements:
            op = "slice"
        if op == "slice":
            step = r.choice((1, 1, 2, 3))
            start = r.randrange(0, n - 1)
            end = r.randrange(start + 1, n + 1)
            if len(range(start, end, step)) < 2:
                start, end, step = 0, n, 1 if n < 4 else 2
            m = len(range(start, end, step))
            starts, ends, steps = [None] * x.rank, [None] * x.rank, [1] * x.rank
            # Python indices: negative ones count from the end, ends past it clamp.
            starts[k] = start - n if r.random() < 0.3 else start
            ends[k] = end + r.choice((0, 0, 5)) if end == n else (end - n if r.random() < 0.3
                                                                  else end)
            steps[k] = step
            return self.call("slice", x, starts, ends, steps, _k=k, _axis=self.axis(m))
        if op == "pad":
            widths = [0] * (2 * (x.rank - k))
            widths[-2:] = [left, right]
            value = r.choice((0.0, 1.5, -2.0)) if x.dtype.is_floating else (
                r.choice((False, True)) if x.dtype == BOOL else r.choice((0, 3)))
            return self.call("pad", x, widths, value, _k=k, _axis=self.axis(n + left + right))
        y = self.unary_step(x)
        if y.dims != x.dims:
            return None
        # The tensors as separate arguments (build.py prints them as cat's list), so that
        # every reader of a case finds the names it uses among the arguments.
        parts = (x, y) if r.random() < 0.5 else (y, x)
        return self.call("cat", *parts, k - x.rank if r.random() < 0.5 else k, _k=k,
                         _axis=self.axis(2 * n))

    def gather_step(self, x: Val) -> Val | None:
        """A take_along_axis, gather, index_select or embedding of x along one of its full dims
        at the values of a new integer index input, all in range (an index out of range is an
        error, tested apart); None when x has no full dim of size 2 or more."""
        r = self.rng
        picked = self.full_dim(x)
        if picked is None:
            return None
        k, n = picked
        dt = r.choice((I64, I64, I32))
        dist = {"dist": "int", "lo": 0, "hi": n - 1}
        rest = math.prod(max(self.size_of(d), 1) for j, d in enumerate(x.dims) if j != k)
        m = self.axis(min(self.pick_size(), max(1, self.max_elements // rest)))
        ops = ["take_along_axis", "gather", "index_select"]
        if x.rank == 2 and k == 0:
            ops.append("embedding")
        op = r.choice(ops)
        dim = k - x.rank if r.random() < 0.3 else k
        if op == "embedding":
            idx = self.tensor([Dim(m, "full")], dt, dist=dist)
            return self.call("embedding", idx, x, _dims=(Dim(m, "full"), x.dims[1]))
        out = x.dims[:k] + (Dim(m, "full"),) + x.dims[k + 1:]
        if op == "index_select":
            idx = self.tensor([Dim(m, "full")], dt, dist=dist)
            return self.call("index_select", x, idx, dim, _dims=out)
        # take_along_axis: the index may broadcast (size 1) along x's other dims, which take
        # x's size; gather's index has x's sizes there (at most x's, as torch.gather).
        idims = [Dim(m, "full") if j == k else
                 Dim(None, "bcast") if op == "take_along_axis" and r.random() < 0.3 else d
                 for j, d in enumerate(x.dims)]
        idx = self.tensor(idims, dt, dist=dist)
        if op == "gather":
            out = tuple(idims)
        return self.call(op, x, idx, dim, _dims=out)

    def one_hot_step(self, x: Val) -> Val | None:
        """torch.scatter of x along one of its full dims at one index per row (a one-hot: the
        frontend's compare with an iota) of a new index input, in range; the value a number,
        or a tensor of the index's dims (at times wider along the dim: its first element is
        written). None when x has no full dim of size 2 or more."""
        r = self.rng
        picked = self.full_dim(x)
        if picked is None:
            return None
        k, n = picked
        dt = r.choice((I64, I64, I32))
        # The index pairs with x's other dims (an expanded one of x takes values of its own).
        idims = [Dim(None, "bcast") if j == k else Dim(d.axis, "full") if d.kind == "exp" else d
                 for j, d in enumerate(x.dims)]
        idx = self.tensor(idims, dt, dist={"dist": "int", "lo": 0, "hi": n - 1})
        dim = k - x.rank if r.random() < 0.3 else k
        if x.dtype == BOOL or r.random() < 0.4:
            value = (r.random() < 0.5 if x.dtype == BOOL else
                     r.choice((1.0, -0.5, 2.0)) if x.dtype.is_floating else r.choice((1, -3)))
            return self.call("scatter", x, idx, value, dim,
                             _dims=self._pointwise_dims([x, idx]), _lo=min(x.lo, float(value)),
                             _hi=max(x.hi, float(value)), _exact=x.exact)
        sdims = list(idims)
        if r.random() < 0.3:
            sdims[k] = Dim(self.axis(r.randint(2, 5)), "full")
            if math.prod(self.size_of(d) for d in sdims) > self.max_elements:
                sdims[k] = Dim(None, "bcast")
        src = self.tensor(sdims, x.dtype)
        return self.call("scatter", x, idx, src, dim,
                         _dims=self._pointwise_dims([x, idx]), _lo=min(x.lo, src.lo),
                         _hi=max(x.hi, src.hi), _exact=x.exact and src.exact)

    def shape_step(self, x: Val) -> Val | None:
        """A random shape op on x that keeps it combinable with values over the same axes, or
        None when none applies."""
        r = self.rng
        if x.is_scalar:
            return None
        kinds = ["permute", "broadcast", "broadcast_in_dim", "expand", "squeeze", "reshape"]
        r.shuffle(kinds)
        for kind in kinds:
            if kind == "permute" and x.rank >= 2:
                perm = list(range(x.rank))
                while perm == list(range(x.rank)):
                    r.shuffle(perm)
                return self.call("permute", x, perm)
            if kind == "broadcast" and x.rank < 4:
                flags = [False] * x.rank
                flags.insert(r.randint(0, x.rank), True)
                return self.call("broadcast", x, flags)
            bc = [k for k, d in enumerate(x.dims) if d.kind == "bcast"]
            if kind == "squeeze" and bc:
                return self.call("squeeze", x, sorted(r.sample(bc, r.randint(1, len(bc)))))
            if kind == "expand" and bc and self.sizes:
                shape, axes = [-1] * x.rank, [None] * x.rank
                room = self.max_elements // max(1, self.numel(x))
                for k in bc:
                    if r.random() < 0.7:
                        a = r.randrange(len(self.sizes))
                        if 1 < self.sizes[a] <= room:      # the element budget holds
                            shape[k], axes[k] = self.sizes[a], a
                            room //= self.sizes[a]
                if all(s == -1 for s in shape):
                    continue
                return self.call("expand", x, shape, _axes=axes)
            if kind == "broadcast_in_dim" and x.rank < 4:
                n = x.rank + r.randint(1, 4 - x.rank)
                bdims = sorted(r.sample(range(n), x.rank))
                shape, axes = [], []
                room = self.max_elements // max(1, self.numel(x))
                for k in range(n):
                    a = r.randrange(len(self.sizes)) if self.sizes else None
                    if k in bdims:
                        shape.append(-1)
                        axes.append(None)
                    elif a is not None and r.random() < 0.4 and 1 < self.sizes[a] <= room:
                        shape.append(self.sizes[a])
                        axes.append(a)
                        room //= self.sizes[a]
                    else:
                        shape.append(1)
                        axes.append(None)
                return self.call("broadcast_in_dim", x, shape, bdims, _axes=axes)
            if kind == "reshape" and x.rank >= 1 and self.numel(x) > 0:
                return self.reshape_step(x)
        return None

    def reshape_step(self, x: Val) -> Val:
        """Flatten x, merge two adjacent dims, or split its last dim (new axes)."""
        r = self.rng
        shape = self.shape_of(x)
        roll = r.random()
        if roll < 0.35 or x.rank == 1:
            # Split the last dim by one of its divisors (or flatten when it has none).
            n = shape[-1]
            divs = [d for d in range(2, min(n, 64) + 1) if n % d == 0 and d < n]
            if divs:
                d = r.choice(divs)
                new = shape[:-1] + [d, n // d]
            else:
                new = [math.prod(shape)]
        elif roll < 0.7:
            k = r.randrange(x.rank - 1)
            new = shape[:k] + [shape[k] * shape[k + 1]] + shape[k + 2:]
        else:
            new = [math.prod(shape)]
        axes = [self.axis(s) for s in new]
        spec_shape = list(new)
        if r.random() < 0.5:
            spec_shape[r.randrange(len(spec_shape))] = -1
        return self.call("reshape", x, spec_shape, _axes=axes)

    def reduce_step(self, x: Val, dims=None, op: str | None = None, keepdim: bool | None = None):
        """A random reduction of x over `dims` (random non-empty subset when None)."""
        r = self.rng
        if dims is None:
            # Full reductions are one kind among many (the reduction scheduler refuses them).
            full = x.rank == 1 or r.random() < 0.15
            k = x.rank if full else r.randint(1, x.rank - 1)
            dims = sorted(r.sample(range(x.rank), k))
        if keepdim is None:
            keepdim = r.random() < 0.5
        empty = any(self.size_of(x.dims[k]) == 0 for k in dims)
        if op is None and x.exact and x.dtype != BOOL and not empty and r.random() < 0.12:
            # An index reduction of exact values (an input, its casts): the kernel's values
            # equal the reference's, so ties break alike (computed floats may round apart).
            op = r.choice(("argmax", "argmin"))
            dim = None if len(dims) == x.rank and (x.rank == 1 or r.random() < 0.5) else \
                r.choice(dims)
            if dim is not None and r.random() < 0.3:
                dim -= x.rank
            kw = {"keepdim": keepdim} if keepdim or r.random() < 0.5 else {}
            return self.call(op, x, dim, **kw) if dim is not None or r.random() < 0.5 \
                else self.call(op, x, **kw)
        if op is None:
            choices = ["sum", "max", "min", "mean", "var", "var_mean"]
            weights = [35, 12, 8, 20, 10, 15]
            op = r.choices(choices, weights)[0]
        if op in ("max", "min") and (empty or x.dtype == BOOL):
            op = "sum"
        if op in ("mean", "var", "var_mean"):
            x = self.as_float(x)
        if op in ("sum", "mean", "var", "var_mean") and x.dtype.is_floating:
            x = self.bounded(x, 100.0)
        use_none = dims == list(range(x.rank)) and r.random() < 0.3
        args = [x] if use_none else [x, dims if r.random() < 0.8 else [d - x.rank for d in dims]]
        kw = {"keepdim": keepdim} if keepdim or r.random() < 0.5 else {}
        if op in ("var", "var_mean"):
            kw["correction"] = r.choice((0, 1))
        if op == "sum" and r.random() < 0.1 and x.dtype.is_floating:
            kw["dtype"] = F32
        if use_none and r.random() < 0.5:
            args = [x]
        out = self.call(op, *args, **kw)
        return out

    # Outputs ----------------------------------------------------------------------------------
    def output(self, v: Val) -> bool:
        """Make v an output unless it is an input, a scalar or already one (the frontend
        refuses those)."""
        if v.is_scalar:
            return False
        target = v.alias or v.name
        inputs = {i["name"] for i in self.inputs}
        taken = {self.vals[o].alias or o for o in self.outputs}
        if target in inputs or target in taken:
            return False
        self.outputs.append(v.name)
        if v.dims is not None:
            self.tags["ranks"].add(f"out{v.rank}")
        return True

    def finish_outputs(self, candidates: list, at_least: int = 1, at_most: int = 3) -> None:
        """Outputs among `candidates` (unused ones first), so that every case has one."""
        r = self.rng
        used = set()
        for op in self.ops:
            used.update(a for a in op["args"] if isinstance(a, str))
        leaves = [v for v in candidates if v.name not in used and not v.is_scalar]
        others = [v for v in candidates if v not in leaves and not v.is_scalar]
        r.shuffle(others)
        want = r.randint(at_least, at_most)
        same_rank = r.random() < 0.85     # the pointwise scheduler needs outputs of one rank
        for v in leaves[::-1] + others:
            if len(self.outputs) >= want:
                break
            if same_rank and self.outputs and v.rank != self.vals[self.outputs[0]].rank:
                continue
            self.output(v)
        if not self.outputs:
            fallback = next((v for v in candidates[::-1] if not v.is_scalar), None)
            if fallback is None or not self.output(fallback):
                base = self.vals[self.inputs[0]["name"]] if self.inputs else None
                if base is None:
                    raise GenError("no output candidate")
                self.output(self.call("set", base))

    def output_in_place(self, v: Val, target: Val) -> bool:
        """fd.add_output(v, alias_input=target): v written into input `target`'s storage
        (execute does not return it). v must have target's dims and dtype, and one input
        receives one output."""
        inputs = {i["name"]: i for i in self.inputs}
        if (target.name not in inputs or inputs[target.name]["kind"] == "scalar"
                or target.name in self.aliases.values() or v.is_scalar
                or v.dims != target.dims or v.dtype != target.dtype or v.name in self.aliases
                or v.name in self.outputs or v.name in inputs):
            return False
        self.aliases[v.name] = target.name
        self.tags["outputs"].add("in_place")
        return True

    def spec(self, seed: int, index: int, pattern: str) -> dict:
        tags = {k: sorted(map(str, v)) for k, v in self.tags.items()}
        out = {"id": case_id(seed, index), "seed": seed, "index": index, "pattern": pattern,
               "max_elements": self.max_elements, "inputs": self.inputs, "ops": self.ops,
               "outputs": self.outputs, "tags": tags}
        if self.aliases:
            out["aliases"] = dict(self.aliases)   # output name -> the input it is written into
        return out


# Patterns ---------------------------------------------------------------------------------------
def _random_dims(b: Builder, axes: list, full_prob: float = 0.8, suffix: bool = True) -> list:
    """Dims of an input over `axes` (or a suffix of them): full mostly, else size 1 or
    expanded."""
    r = b.rng
    start = r.randint(0, len(axes)) if suffix and r.random() < 0.3 else 0
    dims = []
    for a in axes[start:]:
        roll = r.random()
        if roll < full_prob or b.sizes[a] == 1:
            dims.append(Dim(a, "full"))
        elif roll < full_prob + (1 - full_prob) * 0.6:
            dims.append(Dim(a, "bcast"))
        else:
            dims.append(Dim(a, "exp"))
    return dims


def _input_dtype(b: Builder, float_only: bool = False) -> DataType:
    r = b.rng
    if float_only or r.random() < 0.75:
        return b.pick_float_dtype()
    return r.choice((I32, I64, BOOL))


def pat_pointwise(b: Builder) -> None:
    """A random elementwise DAG over 1-4 inputs of rank 0-4 broadcast together."""
    r = b.rng
    rank = r.choices([0, 1, 2, 3, 4], [4, 20, 36, 24, 16])[0]
    axes = [b.axis() for _ in range(rank)]
    b.fit(axes)
    pool = []
    full = b.tensor([Dim(a, "full") for a in axes], _input_dtype(b))
    pool.append(full)
    for _ in range(r.randint(0, 3)):
        kind = r.random()
        if kind < 0.15:
            pool.append(b.tensor([Dim(None, "bcast")], _input_dtype(b)))        # a [1] tensor
        elif kind < 0.25 and rank:
            pool.append(b.tensor([], _input_dtype(b)))                           # rank 0
        else:
            pool.append(b.tensor(_random_dims(b, axes), _input_dtype(b)))
    if r.random() < 0.25:
        dt = r.choice((F32, F64, I64))
        pool.append(b.scalar_input(dt, r.choice((0.5, 2.0, 3.0, -1.5) if dt.is_floating else (2, 3, -1))))
    made = b.pointwise_dag(pool, r.randint(2, 10))
    b.finish_outputs(made or pool)


def pat_multi_chain(b: Builder) -> None:
    """Two or three independent pointwise chains over tensors of different sizes in one
    fusion (same rank mostly: the pointwise scheduler needs outputs of one rank)."""
    r = b.rng
    chains = r.randint(2, 3)
    rank = r.choice((1, 2, 2, 3))
    outs = []
    for _ in range(chains):
        rk = rank if r.random() < 0.85 else r.choice((1, 2, 3))
        axes = [b.axis() for _ in range(rk)]
        b.fit(axes)
        pool = [b.tensor([Dim(a, "full") for a in axes], _input_dtype(b))]
        if r.random() < 0.5:
            pool.append(b.tensor(_random_dims(b, axes), _input_dtype(b)))
        made = b.pointwise_dag(pool, r.randint(1, 5))
        outs.append((made or pool)[-1])
    for v in outs:
        if not b.output(v):
            b.output(b.call("set", v))


def pat_adamw(b: Builder) -> None:
    """AdamW updates of 1-3 parameters of different sizes (p, g, m, v each) in one fusion:
    returns the new p, m and v of each."""
    r = b.rng
    rank = r.choice((1, 2, 2))
    hyper = {}
    for k, v in (("lr", 1e-3 * r.choice((1, 2, 5))), ("beta1", 0.9), ("beta2", 0.999),
                 ("eps", 1e-8), ("wd", 0.01)):
        hyper[k] = b.scalar_input(F32, v) if r.random() < 0.4 else v
    step = r.randint(1, 10)
    bc1, bc2 = 1 - 0.9 ** step, 1 - 0.999 ** step
    for _ in range(r.randint(1, 3)):
        axes = [b.axis() for _ in range(rank)]
        b.fit(axes)
        pdt = r.choice((F32, BF16, F16))
        dims = [Dim(a, "full") for a in axes]
        p = b.tensor(dims, pdt)
        g = b.tensor(dims, pdt)
        m = b.tensor(dims, F32)
        v = b.tensor(dims, F32, dist={"dist": "uniform", "lo": 0.0, "hi": 1.0})
        gf, pf = b.as_float(b.call("cast", g, dtype=F32)), b.call("cast", p, dtype=F32)
        m2 = b.call("add", b.call("mul", m, hyper["beta1"]),
                    b.call("mul", gf, 1 - 0.9 if not isinstance(hyper["beta1"], Val) else
                           b.call("sub", 1.0, hyper["beta1"])))
        v2 = b.call("add", b.call("mul", v, hyper["beta2"]),
                    b.call("mul", b.call("mul", gf, gf), 1 - 0.999))
        mhat = b.call("div", m2, bc1)
        vhat = b.call("div", v2, bc2)
        denom = b.call("add", b.call("sqrt", vhat), hyper["eps"])
        upd = b.call("add", b.call("div", mhat, b.positive(denom, 1e-8)),
                     b.call("mul", pf, hyper["wd"]))
        p2 = b.call("sub", pf, b.call("mul", upd, hyper["lr"]))
        b.output(b.call("cast", p2, dtype=pdt) if pdt != F32 else p2)
        b.output(m2)
        b.output(v2)


def pat_bias_gelu(b: Builder) -> None:
    """gelu(x + bias) with a [N] (or [1, N], or expanded) bias, optionally a residual."""
    r = b.rng
    rank = r.choice((2, 2, 3))
    axes = [b.axis() for _ in range(rank)]
    b.fit(axes)
    dt = b.pick_float_dtype(allow_f64=False)
    x = b.tensor([Dim(a, "full") for a in axes], dt)
    form = r.random()
    if form < 0.6:
        bias = b.tensor([Dim(axes[-1], "full")], dt)
    elif form < 0.8:
        bias = b.tensor([Dim(None, "bcast")] * (rank - 1) + [Dim(axes[-1], "full")], dt)
    else:
        bias = b.tensor([Dim(a, "exp") for a in axes[:-1]] + [Dim(axes[-1], "full")], dt)
    h = b.call("add", b.call("cast", x, dtype=F32), b.call("cast", bias, dtype=F32))
    y = b.call("gelu", h, approximate=r.choice(("tanh", "none")))
    if r.random() < 0.3:
        res = b.tensor([Dim(a, "full") for a in axes], dt)
        y = b.call("add", y, b.call("cast", res, dtype=F32))
    b.output(b.call("cast", y, dtype=dt) if dt != F32 else y)
    if r.random() < 0.3:
        b.output(h)


def pat_reduction(b: Builder) -> None:
    """A prologue, one reduction over a random set of dims (sometimes all), an epilogue with
    inputs shaped like the kept dims."""
    r = b.rng
    rank = r.choices([1, 2, 3, 4], [15, 45, 25, 15])[0]
    axes = [b.axis() for _ in range(rank)]
    # Tall and narrow, reduced over the rows (BatchNorm's channels-last statistics in 2-D):
    # the few-columns outer rule, its rows split over blocks with interleaved steps where the
    # element budget leaves them long (a GPU run's).
    tall = rank == 2 and r.random() < 0.15
    if tall:
        b.sizes[axes[0]] = b.pick_size("long")
        b.sizes[axes[1]] = 8 * r.randint(8, 64)
    elif r.random() < 0.3:
        b.sizes[axes[r.randrange(rank)]] = b.pick_size("long")
    b.fit(axes, protect=axes[1:] if tall else ())
    x = b.tensor([Dim(a, "full") for a in axes] if tall else
                 _random_dims(b, axes, 0.9, suffix=False) if r.random() < 0.3 else
                 [Dim(a, "full") for a in axes],
                 _input_dtype(b))
    pool = [x]
    if r.random() < 0.4:
        pool.append(b.tensor(_random_dims(b, axes), _input_dtype(b)))
    made = b.pointwise_dag(pool, r.randint(0, 3))
    src = made[-1] if made and not made[-1].is_scalar and made[-1].rank >= 1 else x
    if src.rank == 0:
        src = x
    red = b.reduce_step(src, dims=[0] if tall and src.rank == 2 else None)
    outs = [red] if not isinstance(red, tuple) else list(red)
    if r.random() < 0.5:
        v = outs[0]
        epi = [v]
        if v.dims and r.random() < 0.6:
            kept = [d for d in v.dims]
            epi.append(b.tensor([Dim(d.axis, "full") if d.kind != "bcast" else d for d in kept],
                                b.pick_float_dtype(allow_f64=False)))
        outs += b.pointwise_dag(epi, r.randint(1, 3))
    b.finish_outputs(outs, 1, 2)


def pat_normalization(b: Builder) -> None:
    """Row statistics broadcast back over the row: softmax, log-softmax, RMSNorm, LayerNorm
    (returning mean and rstd [M, 1]), or random ones, reduced over the innermost 1-2 dims, or
    over the outermost 1-2 (softmax over dim 0, a BatchNorm-like normalization over all dims
    but the channels, with weights over the kept dims). The input's random allocation order
    decides which of them are outermost in memory."""
    r = b.rng
    rank = r.choices([1, 2, 3, 4], [5, 60, 25, 10])[0]
    axes = [b.axis() for _ in range(rank)]
    nred = 1 if rank == 1 or r.random() < 0.75 else 2
    outer = rank >= 2 and r.random() < 0.3
    if outer:
        nred = 1 if rank == 2 or r.random() < 0.6 else 2
        red = list(range(nred))
    else:
        red = list(range(rank - nred, rank))
    red_axes = [axes[k] for k in red]
    if r.random() < 0.4:
        b.sizes[red_axes[-1]] = b.pick_size("long")
    b.fit(axes, protect=red_axes)
    dt = b.pick_float_dtype()
    if rank == 2 and not outer and r.random() < 0.12:
        # The rows of an embedding table at random ids (a token embedding and its norm).
        rows = b.axis(cls=r.choice(("small", "odd", "pow2")))
        b.fit([rows, axes[1]], protect=[axes[1]])
        ids = b.tensor([Dim(axes[0], "full")], r.choice((I64, I32)),
                       dist={"dist": "int", "lo": 0, "hi": max(b.sizes[rows], 1) - 1})
        if b.sizes[rows] == 0:
            b.sizes[rows] = 1
        table = b.tensor([Dim(rows, "full"), Dim(axes[1], "full")], dt)
        x = b.call("embedding", ids, table, _dims=(Dim(axes[0], "full"), Dim(axes[1], "full")))
    else:
        x = b.tensor([Dim(a, "full") for a in axes], dt)
    xf = b.call("cast", x, dtype=F32) if dt != F32 and r.random() < 0.85 else x
    kind = r.choice(("softmax", "log_softmax", "rmsnorm", "layernorm", "center", "scale",
                     "random", "logsumexp"))
    if kind == "logsumexp" and any(b.sizes[axes[k]] == 0 for k in red):
        # A max over a dim of size 0 has no value, and the statistics reach the outputs:
        # check_inputs would refuse the call (a softmax's outputs are empty there).
        kind = "softmax"
    if outer and r.random() < 0.6:
        # Weights over the kept dims (BatchNorm's per-channel scale and shift).
        w_dims = [Dim(axes[k], "full") for k in range(red[-1] + 1, rank)]
    else:
        # Weights over the reduced dims, broadcast over the dims right of them.
        w_dims = [Dim(axes[k], "full") if k in red else Dim(None, "bcast")
                  for k in range(red[0], rank)]
    outs = []
    if kind in ("softmax", "log_softmax") and not outer and rank >= 2 and r.random() < 0.5:
        xf = _causal_masked(b, xf, axes)
    if kind in ("softmax", "log_softmax"):
        m = b.call("max", xf, red, keepdim=True)
        z = b.call("sub", xf, m)
        e = b.call("exp", z)
        s = b.call("sum", e, red, keepdim=True)
        if kind == "softmax":
            y = b.call("mul", e, b.call("reciprocal", b.positive(s))) if r.random() < 0.5 else \
                b.call("div", e, s)
        else:
            y = b.call("sub", z, b.call("log", b.positive(s, 1.0)))
        outs.append(y)
        if rank == 2 and not outer and b.size_of(Dim(axes[1], "full")) >= 1 \
                and r.random() < 0.3:
            # Cross-entropy's loss: log-sum-exp minus the target's logit (take_along_axis).
            n = b.sizes[axes[1]]
            t = b.tensor([Dim(axes[0], "full"), Dim(None, "bcast")], I64,
                         dist={"dist": "int", "lo": 0, "hi": n - 1})
            picked = b.call("take_along_axis", xf, t, 1,
                            _dims=(Dim(axes[0], "full"), Dim(None, "bcast")))
            lse = b.call("add", b.call("log", b.positive(s, 1.0)), m)
            outs.append(b.call("sub", lse, picked))
    elif kind == "logsumexp":
        # Only the row statistics, nothing along the row: one pass of (max, sum) keys
        # (schedule/logsumexp.py); with cross-entropy's target logit, or the max as well.
        m = b.call("max", xf, red, keepdim=True)
        s = b.call("sum", b.call("exp", b.call("sub", xf, m)), red, keepdim=True)
        lse = b.call("add", b.call("log", b.positive(s, 1.0)), m)
        if rank == 2 and not outer and r.random() < 0.4:
            n = b.sizes[axes[1]]
            t = b.tensor([Dim(axes[0], "full"), Dim(None, "bcast")], I64,
                         dist={"dist": "int", "lo": 0, "hi": max(n, 1) - 1})
            picked = b.call("take_along_axis", xf, t, 1,
                            _dims=(Dim(axes[0], "full"), Dim(None, "bcast")))
            lse = b.call("sub", lse, picked)
        outs.append(lse)
        if r.random() < 0.3:
            outs.append(m)
    elif kind == "rmsnorm":
        ms = b.call("mean", b.call("mul", xf, xf), red, keepdim=True)
        rstd = b.call("rsqrt", b.call("add", ms, r.choice((1e-5, 1e-6, 0.5))))
        y = b.call("mul", xf, rstd)
        if r.random() < 0.7:
            w = b.tensor(w_dims, dt)
            y = b.call("mul", y, b.call("cast", w, dtype=F32) if dt != F32 else w)
        outs.append(y)
        if r.random() < 0.4:
            outs.append(rstd)
    elif kind == "layernorm":
        var, mean = b.call("var_mean", xf, red, correction=0, keepdim=True)
        rstd = b.call("rsqrt", b.call("add", var, r.choice((1e-5, 0.25))))
        y = b.call("mul", b.call("sub", xf, mean), rstd)
        if r.random() < 0.7:
            w = b.tensor(w_dims, dt)
            bias = b.tensor(w_dims, dt)
            y = b.call("add", b.call("mul", y, w), bias)
        outs.append(y)
        if r.random() < 0.6:
            outs += [mean, rstd]
    elif kind == "center":
        mean = b.call("mean", xf, red, keepdim=True)
        outs.append(b.call("sub", xf, mean))
    elif kind == "scale":
        mx = b.call("max", b.call("abs", xf), red, keepdim=True)
        outs.append(b.call("div", xf, b.positive(mx, 0.5)))
    else:
        stat = b.reduce_step(xf, red, keepdim=True)
        stat = stat[r.randrange(2)] if isinstance(stat, tuple) else stat
        pool = [xf, stat]
        made = b.pointwise_dag(pool, r.randint(1, 4))
        y = b.binary_step(xf, stat) if stat not in made[-1:] else made[-1]
        outs.append(y)
        if r.random() < 0.3:
            outs.append(stat)
    main = outs[0]
    if main.dtype != dt and dt != F32 and r.random() < 0.8:
        outs[0] = b.call("cast", b.bounded(main, MAX_F16 / 2) if dt == F16 else main, dtype=dt)
    for v in outs:
        b.output(v)


def _causal_masked(b: Builder, x: Val, axes: list) -> Val:
    """x [..., M, N] with the elements above the diagonal (column > row) set to -60, the mask
    made from two iotas (an attention's causal mask); column 0 stays, so no row is all
    masked."""
    rank = len(axes)
    dt = b.rng.choice((I64, I32))
    index = []
    for k in (rank - 2, rank - 1):
        n = b.size_of(x.dims[k]) or 1
        v = b.call("iota", n, 0, 1, dtype=dt, _axis=axes[k] if n > 1 else None)
        index.append(b.call("broadcast", v, [j != k for j in range(rank)]))
    return b.call("where", b.call("le", index[1], index[0]), x, -60.0)


def pat_norm_backward(b: Builder) -> None:
    """RMSNorm / LayerNorm backward: dx (row reductions broadcast back) and dw, db (column
    sums) over [M, N] rows, rstd and mean given as [M, 1] float inputs."""
    r = b.rng
    m_axis, n_axis = b.axis(), b.axis()
    if r.random() < 0.35:
        b.sizes[n_axis] = b.pick_size("long")
    b.fit([m_axis, n_axis], protect=[n_axis])
    dt = b.pick_float_dtype(allow_f64=False)
    row = [Dim(m_axis, "full"), Dim(n_axis, "full")]
    stat = [Dim(m_axis, "full"), Dim(None, "bcast")]
    x = b.tensor(row, dt)
    dy = b.tensor(row, dt)
    w = b.tensor([Dim(n_axis, "full")], dt) if r.random() < 0.85 else None
    layer = r.random() < 0.5
    mean = b.tensor(stat, F32) if layer else None
    rstd = b.tensor(stat, F32, dist={"dist": "uniform", "lo": 0.5, "hi": 2.0})
    xf = b.call("cast", x, dtype=F32)
    dyf = b.call("cast", dy, dtype=F32)
    xhat = b.call("mul", b.call("sub", xf, mean) if layer else xf, rstd)
    g = b.call("mul", dyf, b.call("cast", w, dtype=F32)) if w is not None else dyf
    c2 = b.call("mean", b.call("mul", g, xhat), [1], keepdim=True)
    if layer:
        c1 = b.call("mean", g, [1], keepdim=True)
        dx = b.call("mul", b.call("sub", b.call("sub", g, c1), b.call("mul", xhat, c2)), rstd)
    else:
        dx = b.call("mul", b.call("sub", g, b.call("mul", xhat, c2)), rstd)
    b.output(b.call("cast", dx, dtype=dt) if dt != F32 else dx)
    dw = b.call("sum", b.call("mul", dyf, xhat), [0])
    b.output(b.call("cast", dw, dtype=dt) if dt != F32 and r.random() < 0.7 else dw)
    if layer and r.random() < 0.7:
        db = b.call("sum", dyf, [0])
        b.output(b.call("cast", db, dtype=dt) if dt != F32 and r.random() < 0.7 else db)


def pat_random(b: Builder) -> None:
    """A random mixture: elementwise ops, reductions at random points (some broadcast back,
    some outputs), shape ops; any scheduler or none may take it."""
    r = b.rng
    rank = r.choices([1, 2, 3, 4], [10, 45, 30, 15])[0]
    axes = [b.axis() for _ in range(rank)]
    b.fit(axes)
    pool = [b.tensor([Dim(a, "full") for a in axes], _input_dtype(b, float_only=r.random() < 0.7))]
    for _ in range(r.randint(0, 2)):
        pool.append(b.tensor(_random_dims(b, axes), _input_dtype(b)))
    made = []
    for _ in range(r.randint(1, 3)):
        made += b.pointwise_dag(pool, r.randint(1, 4))
        srcs = [v for v in pool if not v.is_scalar and v.rank >= 1]
        if srcs and r.random() < 0.8:
            src = r.choice(srcs)
            red = b.reduce_step(src)
            red = list(red) if isinstance(red, tuple) else [red]
            pool += red
            made += red
            if r.random() < 0.5 and red[0].rank == src.rank and b.compatible(src, red[0]):
                y = b.binary_step(src, red[0])
                pool.append(y)
                made.append(y)
    b.finish_outputs(made or pool, 1, 3)


def _negated(b: Builder, v):
    """-v, or not v for a bool (neg is not defined for bools: fuzz 20261127:798)."""
    return b.call("logical_not", v) if v.dtype == BOOL else b.call("neg", v)


def pat_segmented(b: Builder) -> None:
    """Fusions that no one kernel takes, so that the plan runs several segments: a row
    normalization whose result is also reduced over columns (sometimes used again by the rows),
    a reduction feeding a reduction over other dims, an unrelated second part over tensors of
    other sizes, or a pointwise DAG cut by segment_set."""
    r = b.rng
    form = r.choice(("norm_columns", "reduction_of_reduction", "unrelated", "segment_set"))
    outs = []
    if form == "norm_columns":
        m_axis, n_axis = b.axis(), b.axis()
        b.fit([m_axis, n_axis], protect=[n_axis])
        dt = b.pick_float_dtype(allow_f64=False)
        x = b.as_float(b.tensor([Dim(m_axis, "full"), Dim(n_axis, "full")], dt), F32)
        xf = b.call("cast", x, dtype=F32) if x.dtype != F32 else x
        if r.random() < 0.5:
            mx = b.call("max", xf, [1], keepdim=True)
            e = b.call("exp", b.call("sub", xf, mx))
            y = b.call("div", e, b.call("sum", e, [1], keepdim=True))
        else:
            ms = b.call("mean", b.call("mul", xf, xf), [1], keepdim=True)
            y = b.call("mul", xf, b.call("rsqrt", b.call("add", ms, 0.5)))
        if r.random() < 0.3:
            y = b.call("segment_set", y)
        col = b.reduce_step(y, [0], op=r.choice(("sum", "max", "mean")),
                            keepdim=r.random() < 0.5)
        outs += [y, col]
        if r.random() < 0.4 and col.rank == 2:
            outs.append(b.call("mul", y, col))          # the rows use the column result again
        if r.random() < 0.3 and col.rank == 2 and b.sizes[m_axis] > 1:
            # The column result expanded over the rows (an output of stride 0 along them).
            outs.append(b.call("expand", col, [b.sizes[m_axis], -1], _axes=[m_axis, None]))
    elif form == "reduction_of_reduction":
        axes = [b.axis() for _ in range(3)]
        b.fit(axes)
        x = b.tensor([Dim(a, "full") for a in axes], _input_dtype(b, float_only=True))
        first = r.choice(([2], [1, 2], [0]))
        s1 = b.reduce_step(x, first, keepdim=False)
        s1 = s1[r.randrange(2)] if isinstance(s1, tuple) else s1
        if r.random() < 0.3:
            s1 = b.call("segment_set", s1)
        outs.append(s1)
        if s1.rank >= 1:
            second = [0] if s1.rank == 1 or r.random() < 0.5 else [s1.rank - 1]
            s2 = b.reduce_step(s1, second)
            outs += list(s2) if isinstance(s2, tuple) else [s2]
    elif form == "unrelated":
        for _ in range(2):
            rank = r.choice((1, 2, 2, 3))
            axes = [b.axis() for _ in range(rank)]
            b.fit(axes)
            x = b.tensor([Dim(a, "full") for a in axes], _input_dtype(b))
            pool = [x]
            made = b.pointwise_dag(pool, r.randint(0, 2))
            src = made[-1] if made and not made[-1].is_scalar and made[-1].rank == rank else x
            if r.random() < 0.6:
                dims = [rank - 1] if rank == 1 or r.random() < 0.6 else [0]
                red = b.reduce_step(src, dims)
                outs += list(red) if isinstance(red, tuple) else [red]
            else:
                outs.append(made[-1] if made else _negated(b, x))
    else:
        rank = r.choice((1, 2, 2, 3))
        axes = [b.axis() for _ in range(rank)]
        b.fit(axes)
        pool = [b.tensor([Dim(a, "full") for a in axes], _input_dtype(b))]
        if r.random() < 0.5:
            pool.append(b.tensor(_random_dims(b, axes), _input_dtype(b)))
        made = b.pointwise_dag(pool, r.randint(1, 4))
        cut = b.call("segment_set", (made or pool)[-1])
        rest = b.pointwise_dag(pool + [cut], r.randint(1, 3))
        if r.random() < 0.5 or not any(cut.name in op["args"] for op in b.ops):
            outs.append(cut)                    # a segment_set nothing reads would be dead
        if rest and not rest[-1].is_scalar and rest[-1].rank >= 1 and r.random() < 0.4:
            red = b.reduce_step(rest[-1])
            rest += list(red) if isinstance(red, tuple) else [red]
        outs += rest or [_negated(b, cut)]
    for v in outs:
        b.output(v)


def live_names(ops: list, roots) -> set:
    """The names `roots` are computed from through `ops` (spec op dicts), roots included."""
    made = {}
    for op in ops:
        for out in op["out"] if isinstance(op["out"], list) else [op["out"]]:
            made[out] = op     # ops of several results (var_mean) name a list
    live, todo = set(), list(roots)
    while todo:
        n = todo.pop()
        if n in live:
            continue
        live.add(n)
        if n in made:
            todo += [a for a in made[n]["args"] if isinstance(a, str)]
    return live


def _reads(b: Builder, v: Val, source: Val) -> bool:
    """Whether v is source or computed from it, through the ops built so far."""
    return source.name in live_names(b.ops, [v.name])


def pat_outputs_and_library(b: Builder) -> None:
    """What the plan does besides pointwise and reduction kernels: a linear layer or a matmul
    (the matmul kernel with its epilogue fused where it takes the shapes, else a library
    segment, cuBLAS through torch) with a pointwise epilogue and sometimes a reduction after it; in-place
    outputs (fd.add_output(t, alias_input=x): an optimizer-style update written into its
    input, beside other outputs); outputs laid out by fd.ops.stride_order."""
    r = b.rng
    form = r.choice(("linear", "linear", "in_place", "stride_order"))
    outs = []
    if form == "linear":
        # Half the time shapes and dtypes the matmul kernel takes (N and K multiples of 8,
        # 16-bit floats), sometimes as a @ b with b row-major [K, N] (B MN-major).
        kernel = r.random() < 0.5
        cls = "mult8" if kernel else None
        m_axis, n_axis, k_axis = b.axis(), b.axis(cls=cls), b.axis(cls=cls)
        b.fit([m_axis, n_axis, k_axis], protect=[k_axis, n_axis] if kernel else [k_axis])
        dt = r.choice((BF16, F16)) if kernel else b.pick_float_dtype(allow_f64=False)
        x = b.tensor([Dim(m_axis, "full"), Dim(k_axis, "full")], dt)
        if kernel and r.random() < 0.4:
            w = b.tensor([Dim(k_axis, "full"), Dim(n_axis, "full")], dt)
            y = b.bounded(b.call("matmul", x, w))
        else:
            w = b.tensor([Dim(n_axis, "full"), Dim(k_axis, "full")], dt)
            args = [x, w]
            if r.random() < 0.5:
                # (A bias of one element when N is 1 is a broadcast dim: defined [-1], it
                # would not broadcast against [M, 1] at run time: fuzz 20262002:107.)
                args.append(b.tensor([Dim(n_axis, "full" if b.sizes[n_axis] != 1 else "bcast")],
                                     dt))
            y = b.bounded(b.call("linear", *args))
        # The epilogue reads y (a dead linear would leave the plan without its library segment).
        last = b.unary_step(y) if r.random() < 0.7 else y
        if r.random() < 0.5:
            other = b.tensor(_random_dims(b, [m_axis, n_axis]), _input_dtype(b))
            # (A compare step on y may stand in an exact input for it that broadcasts with y
            # but not with [M, N]: a [K, N] weight when M is 1.)
            if b.compatible(last, other):
                last = b.binary_step(last, other)
        if not _reads(b, last, y):
            # A compare or logical step on a float operand reads an exact stand-in for it
            # (unary_step, binary_step), which would leave the linear dead: output it too.
            outs.append(y)
        outs.append(last)
        # The epilogue may have changed the rank (a binary step with a broadcast operand of
        # higher rank: fuzz 20261327:801 reduced dim 1 of what was no longer [M, N]).
        if r.random() < 0.4 and not last.is_scalar and last.rank >= 1:
            red = b.reduce_step(last, [r.randrange(last.rank)])
            outs += list(red) if isinstance(red, tuple) else [red]
    elif form == "in_place":
        rank = r.choice((1, 2, 2, 3))
        axes = [b.axis() for _ in range(rank)]
        b.fit(axes)
        dims = [Dim(a, "full") for a in axes]
        dt = b.pick_float_dtype(allow_f64=False)
        p = b.tensor(dims, dt)
        g = b.tensor(_random_dims(b, axes), b.pick_float_dtype(allow_f64=False))
        made = b.pointwise_dag([p, g], r.randint(1, 3))
        step = next((v for v in made[::-1] if not v.is_scalar and v.rank == rank
                     and b.compatible(p, v)), g)
        step = b.bounded(step)
        update = b.call("sub", b.as_float(p, F32), b.call("mul", b.as_float(step, F32), 0.125))
        new_p = b.call("cast", update, dtype=dt) if update.dtype != dt else update
        if new_p.dims != p.dims:
            new_p = b.call("add", new_p, b.call("mul", b.as_float(p, dt), 0.0))
        if r.random() < 0.5:
            outs.append(made[-1] if made and not made[-1].is_scalar else update)
        if r.random() < 0.3:
            red = b.reduce_step(b.as_float(update, F32))
            outs += list(red) if isinstance(red, tuple) else [red]
        if not b.output_in_place(new_p, p):
            outs.append(new_p)
        elif r.random() < 0.2:
            outs.append(new_p)        # also returned: nvFuser's in-place output added twice
    else:
        rank = r.choice((2, 3, 3, 4))
        axes = [b.axis() for _ in range(rank)]
        b.fit(axes)
        pool = [b.tensor([Dim(a, "full") for a in axes], _input_dtype(b))]
        made = b.pointwise_dag(pool, r.randint(1, 3))
        src = next((v for v in made[::-1] if not v.is_scalar and v.rank == rank), pool[0])
        order = list(range(rank))
        r.shuffle(order)
        outs.append(b.call("stride_order", src, order))
        b.tags["layouts"].add("out_stride_order")
        if r.random() < 0.3:
            outs.append(_negated(b, pool[0]))
    for v in outs:
        b.output(v)
    if not b.outputs and not b.aliases:
        b.finish_outputs(list(b.vals.values()))


def pat_matmul(b: Builder) -> None:
    """A matmul of the shapes the matmul kernel takes where the layouts allow (16-bit floats, N
    and K multiples of 8; random layouts make some inputs strided or offset, which torch then
    runs): a linear (a bias sometimes) or a @ b, 2-D or a batch (one or two dims of two or
    three), then a chain of element-wise ops (the epilogue the kernel fuses) reading other
    inputs over the output's dims, sometimes first a residual of the output's dims and dtype."""
    r = b.rng
    batched = r.random() < 0.3
    # A batch of one dim mostly, sometimes two (attention's [batch, heads, rows, cols]).
    lead_axes = ([b.axis(r.randint(2, 3)) for _ in range(r.choice((1, 1, 2)))] if batched
                 else [])
    # Sometimes a column-major x the kernel takes (an MN-major A): M a multiple of 8 too, kept
    # through the fitting, and x permuted.
    column_major_a = r.random() < 0.15
    m_axis = b.axis(cls="mult8") if column_major_a else b.axis()
    n_axis, k_axis = b.axis(cls="mult8"), b.axis(cls="mult8")
    b.fit(lead_axes + [m_axis, n_axis, k_axis],
          protect=[k_axis, n_axis] + ([m_axis] if column_major_a else []))
    if column_major_a:
        for a in (m_axis, n_axis, k_axis):
            if b.sizes[a] >= 8:
                b.sizes[a] -= b.sizes[a] % 8
    dt = r.choice((BF16, F16))
    lead = [Dim(a, "full") for a in lead_axes]
    x = b.tensor(lead + [Dim(m_axis, "full"), Dim(k_axis, "full")], dt,
                 layout="permuted" if column_major_a else None)
    if r.random() < 0.5:
        w = b.tensor([Dim(n_axis, "full"), Dim(k_axis, "full")], dt)
        args = [x, w]
        if r.random() < 0.5:
            args.append(b.tensor([Dim(n_axis, "full" if b.sizes[n_axis] != 1 else "bcast")], dt))
        y = b.bounded(b.call("linear", *args))
    else:
        w_lead = lead if r.random() < 0.7 else []
        w = b.tensor(w_lead + [Dim(k_axis, "full"), Dim(n_axis, "full")], dt)
        y = b.bounded(b.call("matmul", x, w))
    out_axes = lead_axes + [m_axis, n_axis]
    last = y
    if r.random() < 0.3:
        # A residual of the output's dims and dtype (the kernel reads it through its staging
        # boxes where the layouts allow).
        last = b.call(r.choice(("add", "add", "sub", "mul")), last,
                      b.tensor([Dim(a, "full") for a in out_axes], dt))
    for _ in range(r.randint(0, 3)):
        if r.random() < 0.5:
            last = b.unary_step(last)
        else:
            other = b.tensor(_random_dims(b, out_axes), _input_dtype(b))
            if b.compatible(last, other):
                last = b.binary_step(last, other)
    if last is not y and last.dtype.is_floating and last.dtype != dt and r.random() < 0.6:
        last = b.call("cast", last, dtype=dt)   # the kernel stores 16-bit outputs
    if not _reads(b, last, y) or (last is not y and r.random() < 0.3):
        b.output(y)     # the pre-activation beside its activation: a second stored output
    b.output(last)


# Running sums of fp16 stay below this (fp16's largest is 65504).
FP16_SCAN_LIMIT = 30000.0


def pat_scan(b: Builder) -> None:
    """cumsum or cumprod along a dim (mostly the innermost: the scan kernel; another dim: the
    library op), with element-wise ops before and after it (a top-p style mask of the running
    sums); sometimes a second scan of the first's result."""
    r = b.rng
    rank = r.choices([1, 2, 3], [20, 60, 20])[0]
    axes = [b.axis() for _ in range(rank)]
    u = r.random()
    if u < 0.1:
        # Rows of most of the budget: over a cluster, or (with --max-elements past 131072)
        # longer than a cluster holds, chained across blocks.
        b.sizes[axes[-1]] = r.randint(b.max_elements // 2, b.max_elements)
    elif u < 0.4:
        b.sizes[axes[-1]] = b.pick_size("long")
    b.fit(axes, protect=(axes[-1],))
    full = [Dim(a, "full") for a in axes]
    op = r.choice(("cumsum", "cumsum", "cumsum", "cumprod"))
    if op == "cumprod":
        # Factors near 1, so that products over long rows neither overflow nor vanish.
        src = b.tensor(full, b.pick_float_dtype(allow_f64=False),
                       dist={"dist": "uniform", "lo": 0.97, "hi": 1.03})
    else:
        x = b.tensor(full, _input_dtype(b))
        pool = [x]
        if r.random() < 0.4:
            pool.append(b.tensor(_random_dims(b, axes), _input_dtype(b)))
        made = b.pointwise_dag(pool, r.randint(0, 3))
        src = next((v for v in made[::-1] if not v.is_scalar and v.rank == rank), x)
        src = b.bounded(src)
        if r.random() < 0.3:
            # A per-row weight expanded along the row (stride 0 along the scanned dim).
            col = b.tensor(full[:-1] + [Dim(None, "bcast")], b.pick_float_dtype(allow_f64=False))
            wide = b.call("expand", col, [-1] * (rank - 1) + [b.sizes[axes[-1]]],
                          _axes=[None] * (rank - 1) + [axes[-1]])
            if b.compatible(src, wide):
                src = b.call("mul", b.as_float(src, F32), wide)
    dim = rank - 1 if r.random() < 0.8 else r.randrange(rank)
    n = b.size_of(src.dims[dim])
    if src.dtype == F16 and n * src.bound > FP16_SCAN_LIMIT:
        src = b.call("cast", src, dtype=F32)      # running sums past fp16's range
    s = b.call(op, src, dim - rank if r.random() < 0.5 else dim)
    outs = [s]
    if op == "cumsum" and r.random() < 0.2 and (s.dtype != F16 or n * s.bound <= FP16_SCAN_LIMIT):
        outs.append(b.call("cumsum", s, dim))
    if r.random() < 0.6:
        outs += b.pointwise_dag([outs[-1]] + ([src] if r.random() < 0.3 else []),
                                r.randint(1, 3))
    b.finish_outputs(outs, 1, 2)


def pat_topk(b: Builder) -> None:
    """top-k along the innermost dim of an exact row (an input, its casts and sign ops: the
    kernel and the float64 reference then order the same values, equal ones by index), with
    few distinct values (ties) at times, element-wise ops after it on the values and indices,
    and at times the row itself an output."""
    r = b.rng
    rank = r.choices([1, 2, 3], [20, 60, 20])[0]
    axes = [b.axis() for _ in range(rank)]
    # Rows the kernel takes (schedulers/topk.py: one block of 1024 threads of 16), read along
    # their stride-1 dim: torch.topk, which runs the others, orders equal values its own way.
    b.sizes[axes[-1]] = min(b.sizes[axes[-1]], TOPK_MAX_ROW)
    b.fit(axes)
    full = [Dim(a, "full") for a in axes]
    dt = r.choice((F32, F32, BF16, F16, I32))
    dist = ({"dist": "int", "lo": -8, "hi": 8} if dt == I32 or r.random() < 0.3 else None)
    x = b.tensor(full, dt, dist=dist, layout=r.choice(("contiguous", "offset")))
    src = x
    for _ in range(r.randint(0, 2)):
        step = r.choice(("neg", "abs", "relu", "cast"))
        if step == "cast":
            if src.dtype != I32:
                src = b.call("cast", src, dtype=F32)
        else:
            src = b.call(step, src)
    n = b.size_of(src.dims[-1])
    k = r.randint(1, min(n, TOPK_MAX_K)) if n else 0
    dim = rank - 1 if r.random() < 0.5 else -1
    largest = r.random() < 0.6
    values, indices = b.call("topk", src, k, dim, largest)
    outs = [values, indices]
    if r.random() < 0.5:
        outs += b.pointwise_dag([values], r.randint(1, 2))
    if r.random() < 0.3:
        outs.append(b.call("cast", indices, dtype=I32))
    if r.random() < 0.2 and src is not x:
        outs.append(src)
    b.finish_outputs(outs, 2, 3)


def pat_scatter(b: Builder) -> None:
    """index_add or scatter_add (an embedding's backward: a gradient's rows added into a table
    at ids, duplicate ids summed) of element-wise ops over the rows added, into zeros or an
    input, with element-wise ops after it at times; a one-hot scatter of the result at times
    (cross-entropy's one-hot)."""
    r = b.rng
    rank = r.choices([1, 2, 3], [25, 55, 20])[0]
    axes = [b.axis() for _ in range(rank)]
    k = r.randrange(rank)
    it_axis = b.axis()
    b.fit(axes)
    b.fit([a for j, a in enumerate(axes) if j != k] + [it_axis], protect=axes)
    b.sizes[axes[k]] = max(b.sizes[axes[k]], 1)     # an index needs a row to point at
    n_rows, n_adds = b.sizes[axes[k]], b.sizes[it_axis]
    # (bool sums: torch's scatter_add_ as a library segment, a logical or)
    dt = r.choice((F32, F32, BF16, F16, F64, I32, I64, F32, BF16, I64, BOOL))
    op = r.choice(("index_add", "index_add", "scatter_add"))
    it_dims = [Dim(it_axis, "full") if j == k else Dim(a, "full") for j, a in enumerate(axes)]
    idt = r.choice((I64, I64, I32))
    dist = {"dist": "int", "lo": 0, "hi": n_rows - 1}
    # The rows added: element-wise ops of inputs over the iteration, in x's dtype (torch
    # adds only a source of the input's dtype), bounded so that the sums keep to fp16's range.
    pool = [b.tensor(it_dims, dt if r.random() < 0.6 else _input_dtype(b))]
    if r.random() < 0.3:
        pool.append(b.tensor(_random_dims(b, [a.axis for a in it_dims]), _input_dtype(b)))
    made = b.pointwise_dag(pool, r.randint(0, 3))
    src = next((v for v in made[::-1] if not v.is_scalar and v.dims == tuple(it_dims)), pool[0])
    if src.dims != tuple(it_dims):
        src = b.tensor(it_dims, dt)
    if dt.is_floating:
        src = b.bounded(b.as_float(src, F32), max(0.5, min(100.0, 2000.0 / max(n_adds, 1))))
    elif not src.exact or src.dtype.is_floating:
        # Integer sums are compared exactly: of exact values only.
        src = b.tensor(it_dims, dt, dist={"dist": "int", "lo": -20, "hi": 20})
    if src.dtype != dt:
        src = b.call("cast", src, dtype=dt)
    if dt in INTS and src.bound > 100:
        src = b.call("maximum", b.call("minimum", src, 100), -100)
    if r.random() < 0.4 and all(b.sizes[a] for a in axes):      # (full refuses size 0)
        x = b.call("zeros", [b.sizes[a] for a in axes], dtype=dt,
                   _axes=[a if b.sizes[a] > 1 else None for a in axes])
    else:
        x = b.tensor([Dim(a, "full") for a in axes], dt,
                     dist=None if dt.is_floating else {"dist": "int", "lo": -50, "hi": 50})
    alpha = 1
    dim = k - rank if r.random() < 0.3 else k
    if op == "index_add":
        idx = b.tensor([Dim(it_axis, "full")], idt, dist=dist)
        kwargs = {}
        if r.random() < 0.3 and dt != BOOL:
            alpha = r.choice((2, -1, 3))
            kwargs["alpha"] = alpha
    else:
        idx = b.tensor(it_dims, idt, dist=dist)
        kwargs = {}
    reach = n_adds * abs(alpha)
    lo = x.lo + reach * min(0.0, src.lo)
    hi = x.hi + reach * max(0.0, src.hi)
    if dt == BOOL:
        lo, hi = 0.0, 1.0
    exact = not dt.is_floating and x.exact and src.exact
    out = b.call(op, x, dim, idx, src, _dims=x.dims, _lo=lo, _hi=hi, _exact=exact, **kwargs)
    outs = [out]
    if r.random() < 0.4:
        y = b.bounded(out) if out.dtype.is_floating else out
        outs += b.pointwise_dag([y], r.randint(1, 2))
    b.finish_outputs(outs, 1, 2)


# name -> (weight, builder)
PATTERNS = {
    "pointwise": (24, pat_pointwise),
    "multi_chain": (6, pat_multi_chain),
    "adamw": (5, pat_adamw),
    "bias_gelu": (5, pat_bias_gelu),
    "reduction": (20, pat_reduction),
    "normalization": (20, pat_normalization),
    "norm_backward": (10, pat_norm_backward),
    "random": (10, pat_random),
    "segmented": (8, pat_segmented),
    "outputs_and_library": (5, pat_outputs_and_library),
    "matmul": (4, pat_matmul),
    "scan": (6, pat_scan),
    "topk": (4, pat_topk),
    "scatter": (5, pat_scatter),
}

DEFAULT_MAX_ELEMENTS = 64 * 1024


def random_options(rng: random.Random, pattern: str) -> dict:
    """Features forced on or off for the case (pyfuser/options.py FEATURES): the variants that
    heuristics only pick when asked (TMA / cp.async / warp-specialized / tensor-map rows of the
    inner persistent scheduler, the norm backward's warp-specialized or multi-wave choice, the
    matmul's ping-pong, split-K and clusters, streaming loads), so that the fuzzer reaches
    their code too."""
    enable, disable = [], []
    if pattern in ("normalization", "random") and rng.random() < 0.35:
        enable.append(rng.choice(("tma_inner_persistent", "tma_inner_persistent",
                                  "ws_inner_persistent")))
        if rng.random() < 0.35:
            enable.append("tma_tensor_map")
    if pattern in ("norm_backward", "random") and rng.random() < 0.4:
        (enable if rng.random() < 0.6 else disable).append("ws_normalization")
    if pattern == "matmul" and rng.random() < 0.3:
        enable.append("matmul_pingpong")
    if pattern == "matmul" and rng.random() < 0.3:
        enable.append("matmul_split_k")
    if pattern == "matmul" and rng.random() < 0.25:
        # Stream-K (cooperative tiles; the heuristic's own rule takes it for few tiles of long K).
        enable.append("matmul_stream_k")
    if pattern == "matmul" and rng.random() < 0.3:
        # Clusters of 2 CTAs with B multicast (the heuristic takes them only for large tiles
        # over a wave of SMs; with split-K also asked, the tile is not clustered).
        enable.append("matmul_cluster")
    if pattern in ("matmul", "outputs_and_library", "random") and rng.random() < 0.7:
        # Matmuls of few rows (common at fuzz sizes) run torch unless the kernel is asked for.
        enable.append("matmul_few_rows")
    if rng.random() < 0.05:
        enable.append("streaming_loads")
    out = {}
    if enable:
        out["enable"] = enable
    if disable:
        out["disable"] = disable
    return out


def generate(seed: int, index: int, max_elements: int = DEFAULT_MAX_ELEMENTS,
             pattern: str | None = None) -> dict:
    """The spec of case (seed, index): the same arguments always give the same spec."""
    for attempt in range(8):
        # A draw over the element budget (an axis used twice by one tensor, through an
        # expanded dim, which Builder.fit counts once: 20263106:43) is drawn again from a
        # derived seed: the same arguments still give the same spec.
        tail = f":{attempt}" if attempt else ""
        rng = random.Random(f"pyfuser-fuzz:{seed}:{index}{tail}")
        name = pattern
        if name is None:
            names = list(PATTERNS)
            name = rng.choices(names, [PATTERNS[n][0] for n in names])[0]
        b = Builder(rng, max_elements, random.Random(f"pyfuser-fuzz-float8:{seed}:{index}{tail}"))
        try:
            PATTERNS[name][1](b)
            break
        except GenError as e:
            if "over the budget" not in str(e) or attempt == 7:
                raise
    pattern = name
    if not b.outputs and not b.aliases:
        raise GenError(f"case {seed}:{index} ({pattern}) has no outputs")
    spec = b.spec(seed, index, pattern)
    spec["options"] = random_options(rng, pattern)
    spec["tags"]["options"] = sorted(spec["options"].get("enable", []) +
                                     ["no_" + f for f in spec["options"].get("disable", [])])
    return spec
