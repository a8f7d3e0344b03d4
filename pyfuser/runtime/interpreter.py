"""The kernel-IR interpreter: runs a lowered kernel on CPU tensors, checking what a GPU would not.

`PYFUSER_ENABLE=interpret` (or `fd.execute(cpu_inputs, options={"enable": ["interpret"]})`)
runs a fusion's generated kernels through it, scheduled for a device-table entry (see
runtime/executor.py), much as TRITON_INTERPRET runs Triton kernels in numpy; tests call
`interpret(kernel, bindings, inputs)` directly.

The model
---------
Every thread of the grid runs in lockstep: a statement is executed by all the threads that reach
it before the next statement starts. It is executed once for all of them, vectorized with
numpy over the thread set:

- Per-thread variables (threadIdx, blockIdx, loop indices, hoisted scalars) are int64 arrays
  over the active threads, or plain Python numbers where every thread holds the same value.
  Each kernel expression is compiled once into a Python function over those (C semantics:
  `/` and `%` truncate toward zero).
- An `if` splits the active set; a serial loop runs iteration by iteration with the threads whose
  own trip count covers that iteration (per-thread start, stop and step may differ); loops bound
  to thread or block dims are the thread set itself; GridStride loops start at blockIdx.x and
  step by gridDim.x.
- Memory: global buffers are flat arrays at the tensors' strides; shared buffers are one row per
  block; register buffers one row per thread. Floating values are held in float64 and rounded
  to the buffer's dtype on every write (float32, fp16, bf16 round to nearest even; fp16 and
  bf16 through float32, as pf::cast converts; float8 through float32 by torch's own conversion,
  runtime/float8.py, which the device library's matches bit for bit); integer buffers hold exact int64 (a float
  stored to one truncates toward zero, NaN gives 0 and out-of-range values saturate, like
  cvt.rzi); bool buffers hold bools. Arithmetic is float64, so a value agrees with the GPU's
  up to its last bits before the rounding at its write; integer arithmetic is exact int64
  (pow too: pf::pow of integers), wrapped to int32 at the write as C wraps. A binary op's
  operands are first converted to its compute type as the generated code reads them (an
  int64 added to a float32 is rounded to float32 first), and a scalar op's value to its
  dtype (a scalar cast to int64 truncates).
  maximum / minimum, relu and max / min reductions propagate NaN as the generated code does
  (max.NaN); a reduction's order is the threads' order (sums may differ from the GPU's tree in
  the last bits).
- When several threads store to one element in one statement, the later thread (in
  blockIdx-major, threadIdx.x-minor order) wins.
- A scatter's atomic adds (ScatterOp, pf::atomic_add) land one after another in that order,
  each rounded to the output's dtype (float32 adds in float32, as red.add.f32 rounds); the
  output a kernel adds into (the launch's zeroed_outputs) starts at 0, as the executor zeroes
  it.
- Block reductions all-reduce over the block's thread dims, grid reductions over blocks (the last
  block of each group gets the result and pf_grid_last; which block arrives last is any on a
  GPU, so the k-th grid reduction of a launch elects the k-th block from the end, and a kernel
  that assumes one block last for two of them computes wrong values here), cluster reductions
  over the CTAs of a cluster; a lockstep grid sync is a check only. A scan's step and fixup (lower/scans.py) use
  the thread's running value; a block scan is the exclusive scan of the running values in
  threadIdx.x order within each row of the block (and across the CTAs of a cluster in rank
  order), in float64 then rounded to the value's dtype.
- Warp-specialized kernels (RoleSplit): the roles (a producer, one or more compute roles) run
  as cooperating groups (each in lockstep), taking turns, the producer first: a group runs until
  an mbarrier wait or a named barrier it cannot pass, then hands over. Named barriers inside
  roles count their arrivals (bar.sync and bar.arrive) per block and complete at their count.
- Bulk and tensor-map copies land when issued (their transaction bytes come and go at once);
  cp.async copies read their source when issued and land at the wait_group that completes their
  group.
- Hopper matmul nodes (kir/nodes.py is their definition):
  - A tile tensor-map load (TensorMapLoad of a TileBoxMap) lands like the row-box loads, at
    issue: box element (r, c) at coordinates (c0 column, c1 row) is the tensor's (c1 + r,
    c0 + c), 0 outside it, at element swizzled_byte((r box_cols + c) bytes) of the box. A tile
    tensor-map store (TensorMapStore) reads its box the same way and writes the elements inside
    the tensor at issue, counted as stores are (outside: dropped); BulkCommit and BulkWait are
    therefore no-ops (a store's shared source is never overwritten too early here, which the
    model does not check), as are FenceProxyAsync (generic-proxy writes are not told apart from
    the async proxy's), WgmmaFence and AccumulatorFence.
  - Wgmma runs per warp group (128 consecutive linear thread ids of the block) at issue:
    D[64, n] = A @ B^T in float64 over the stored 16-bit operands, added to (scale_d) or
    replacing the accumulators, rounded to float32 and scattered over the documented fragment.
    Its operands are read through the shared-memory descriptor model (row r, K element k at
    swizzled byte start + (r / 8) 1024 + (r % 8) 128 + 2 k). WgmmaCommit and WgmmaWait keep
    the warp group's commit groups: until the WgmmaWait that completes a wgmma, its
    accumulators are busy (any other read or write of them fails; later wgmmas into them are
    fine) and its operand reads are still going on (a copy over them before that wait fails,
    and the wait is when the slot checks see the read).
  - StMatrix runs per warp (32 consecutive linear thread ids): lane l's pair k lands in row
    l / 4 of matrix k, at columns 2 (l % 4) + {0, 1} from the row address lane 8 k + l / 4
    gives, rounded to its 16-bit dtype. LdMatrix reads the same places into the lane's 8
    registers (a read of shared memory as any other: poison and copy waits checked).
  - Clusters (the launch's, along x): a multicast TensorMapLoad lands at issue in every CTA
    of the issuer's cluster, at the same offset of each one's shared buffer, completing its
    bytes on each one's barrier at the same index; the issuer's barrier expects the bytes of
    every CTA's share (a peer's share may land first: the pending bytes go below zero until
    the issuer's own expectation). An MBarrierArrive with a CTA rank arrives on that peer's
    barrier. A ClusterSync must be reached by every thread of every CTA of a cluster.
  - SplitKReduce runs per warp group: its partial (the registers of valid rows) is kept by
    (slot, split), its arrival counted per slot in block order; the arrival that completes a
    slot is the last, which sums the slot's partials in split order (float32 adds from 0).
    Stream-K's (with `whole`): the groups of later splits store first; split 0 then sums, and
    fails if a partial it would wait for is not stored yet (the CTAs run in lockstep here).
    A partial stored twice before its sum, a slot summed without one of its partials, or
    partials left unsummed at the kernel's end are errors.

The checks (each an InterpreterError naming the access and the thread)
-------------------------------------------------------------------
- Every access in bounds of its buffer (a thread's own register row, its block's shared row),
  vector accesses aligned to their width, indices integers.
- POISON: registers and shared memory start unwritten. A value computed from an unwritten
  element may sit in registers, but storing it to shared or global memory, or accumulating into
  or from one, fails.
- Global writes are counted per element (`writes`: {(buffer name, element offset): count});
  an output element written more than once, or never, fails when the kernel ends (each output
  element is written exactly once: `check_output_writes`, on by default and in the executor).
  An output the kernel adds into must never be stored to (a store would race with the adds).
- cp.async: a copy's destination reads as unwritten until the wait_group completing its group;
  the landed data is visible only to the copying thread until a block barrier (another thread's
  read fails); a copy over an element another thread read since the last barrier fails, as does
  a copy over one still in flight, and a kernel ending with copies never waited for.
- Circular-buffer slots (shared buffers that bulk or tensor-map copies fill): a read of an
  element must follow a wait on the barrier phase its copy completed (RAW: a broken parity or a
  missing wait fails), and a copy over an element read since must follow a barrier the reading
  threads arrived at after the read (WAR: a missing release or a missing block barrier fails).
  Each thread tracks, per group (the copies, and each warp role or the whole block), the latest
  moment that group's work was made visible to it (mbarrier phases carry their arrivals', block
  and named barriers their participants').
- mbarriers: allocation, index and initialization before use, no more arrivals than the count,
  transaction bytes; a wait that can never return fails (with warp roles: a deadlock, when no
  role can move); bulk copies 16-byte sized and aligned; tensor-map boxes and 128-byte aligned
  destinations; tensor maps the executor's encoder would refuse.
- Tile tensor maps: the executor's rules (schedule/tma_rules.check_tile_box: 16-byte aligned
  base, row and batch strides, box sizes; one row needs no stride), the inner dim of stride 1,
  the dims outside the map of size 1, rows of 128 bytes under the 128-byte swizzle; a 128-byte-swizzled box (load, store) starts on a
  1024-byte boundary of shared memory (kernel.smem_offsets counted where launch_config set
  them); the copy's global buffer is the map's tensor.
- wgmma: whole warp groups (the fences, commits and waits too), bf16 / fp16 operands in shared
  buffers of that dtype, n a multiple of 8 up to 256, accumulators n / 2 float registers;
  each operand's index uniform over the warp group, starting on a 1024-byte boundary plus a K
  offset of 0, 32, 64 or 96 bytes, in bounds, written, and (circular-buffer slots) waited for
  by every thread of the warp group; scale_d uniform, and no unwritten accumulator added to; a
  kernel ending with a wgmma never waited for fails.
- stmatrix: whole warps, 16-byte aligned row addresses of 8 elements in bounds, no value
  computed from unwritten registers.
- Block barriers (__syncthreads, named barriers), block, cluster and grid reductions and grid
  syncs must be reached by every thread that takes part (all threads of each block, the named
  barrier's count, every CTA of a cluster, every block of the grid): fewer would hang.

Limits
------
- At most `max_threads` threads (default 2**20) and `max_bytes` of interpreter storage
  (default 2 GiB: registers cost 9 bytes per element per thread); above, an InterpreterError.
- Time grows with the statements executed (loop trips times statements) more than with the
  thread count: about 10-50 microseconds per statement for thousands of threads.
- Races between threads of one statement are not reported (the later thread wins; of an
  output, the second write fails the write count check); data races across statements are
  reported only for cp.async data. Raw device code is not interpreted.
"""
from __future__ import annotations

import math
import threading

import numpy as np
import torch

from ..ir import scalar as S
from ..ir.dtype import DataType, compute_type, to_torch
from ..ir.exprs import (BinaryOp, BinaryOpType, BroadcastOp, ExpandOp, FullOp, IotaOp,
                        GatherOp, IndexCheckOp, LinearOp, LoadStoreOp, MatmulOp, RandOp,
                        ReshapeOp, ScatterOp, SqueezeOp, UnaryOp, UnaryOpType, WhereOp, WindowOp)
from ..ir.tensor import TensorView
from ..kir import nodes as K
from ..kir.launch import INDEX_ERROR_ELEMENTS, LaunchLimitError, check_launch_limits
from . import lse_key
from .arg_key import arg_key, arg_key_index, topk_in_order
from .float8 import to_float8
from .index_check import raise_if_failed

_ND = np.ndarray


# Expressions ------------------------------------------------------------------------------------
# Compiled kernel expressions take a dict of variables whose values are Python numbers (the same
# for every thread) or numpy arrays (one value per active thread); the helpers below keep the
# Python-number case exact and cheap.
def _zero_divisor(b):
    if type(b) is not _ND and b == 0:
        raise ZeroDivisionError("integer division by zero in a kernel expression")


def _tdiv(a, b):
    if type(a) is _ND or type(b) is _ND:
        _zero_divisor(b)
        return (a - np.fmod(a, b)) // b       # np.fmod is C's remainder: exact division
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _tmod(a, b):
    if type(a) is _ND or type(b) is _ND:
        _zero_divisor(b)
        return np.fmod(a, b)
    return a - _tdiv(a, b) * b


def _ceil(a, b):
    return -(-a // b)


def _min(a, b):
    if type(a) is _ND or type(b) is _ND:
        return np.minimum(a, b)
    return min(a, b)


def _max(a, b):
    if type(a) is _ND or type(b) is _ND:
        return np.maximum(a, b)
    return max(a, b)


def _and(a, fb):
    if type(a) is _ND:
        return np.logical_and(a, fb())
    return a and fb()


def _or(a, fb):
    if type(a) is _ND:
        return np.logical_or(a, fb())
    return a or fb()


def _not(a):
    if type(a) is _ND:
        return np.logical_not(a)
    return not a


def _sel(c, fa, fb):
    if type(c) is _ND:
        return np.where(c, fa(), fb())
    return fa() if c else fb()


_HELPERS = {"_tdiv": _tdiv, "_tmod": _tmod, "_ceil": _ceil, "_min": _min, "_max": _max,
            "_and": _and, "_or": _or, "_not": _not, "_sel": _sel}
_BIN = {"+": "({a} + {b})", "-": "({a} - {b})", "*": "({a} * {b})", "/": "_tdiv({a}, {b})",
        "%": "_tmod({a}, {b})", "ceilDiv": "_ceil({a}, {b})", "min": "_min({a}, {b})",
        "max": "_max({a}, {b})", "<": "({a} < {b})", "<=": "({a} <= {b})", ">": "({a} > {b})",
        ">=": "({a} >= {b})", "==": "({a} == {b})", "!=": "({a} != {b})",
        "&&": "_and({a}, lambda: {b})", "||": "_or({a}, lambda: {b})", "^": "({a} ^ {b})"}


def py_source(e) -> str:
    """Python source of kernel expression `e` reading variables from a dict `env` (Python
    numbers, or numpy arrays with one value per thread)."""
    if isinstance(e, K.Const):
        return repr(e.value)
    if isinstance(e, (K.Var, K.Special)):
        return f"env[{e.name!r}]"
    if isinstance(e, K.Bin):
        return _BIN[e.op].format(a=py_source(e.a), b=py_source(e.b))
    if isinstance(e, K.Not):
        return f"_not({py_source(e.a)})"
    if isinstance(e, K.Select):
        return (f"_sel({py_source(e.cond)}, lambda: {py_source(e.a)}, "
                f"lambda: {py_source(e.b)})")
    raise TypeError(f"not an index expression: {e!r} ({type(e).__name__})")


_COMPILED: dict = {}


def _shared_divisor_check(a, b):
    """math.cuh div_shared_divisor's check of a quotient a / b: |b| in [2^-26, 2^100] and the
    quotient finite and at least 2^-75 in magnitude, or a == +0. (The device checks its own
    quotient, which is a / b wherever either passes; where a / b is finite but a * RN(1/b)
    overflows, or the reverse, the two may decide differently, and either way the value is
    a / b.)"""
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    with np.errstate(all="ignore"):
        q = np.abs(a / b)
    ab = np.abs(b)
    return ((ab >= 2.0 ** -26) & (ab <= 2.0 ** 100)
            & ((a.view(np.uint32) == 0) | ((q >= np.float32(2.0 ** -75)) & np.isfinite(q))))


def compile_expr(e):
    key = id(e)
    hit = _COMPILED.get(key)
    if hit is not None and hit[0] is e:
        return hit[1]
    fn = eval("lambda env: " + py_source(e), dict(_HELPERS))  # noqa: S307 - our own text
    _COMPILED[key] = (e, fn)
    return fn


def eval_expr(e, env: dict):
    """Value of kernel expression `e`; env maps Var and Special names to values."""
    return compile_expr(e)(env)


def expr_vars(e, out=None) -> set:
    out = set() if out is None else out
    if isinstance(e, (K.Var, K.Special)):
        out.add(e.name)
    elif isinstance(e, K.Bin):
        expr_vars(e.a, out)
        expr_vars(e.b, out)
    elif isinstance(e, K.Not):
        expr_vars(e.a, out)
    elif isinstance(e, K.Select):
        for x in (e.cond, e.a, e.b):
            expr_vars(x, out)
    elif isinstance(e, K.TensorIndex):
        expr_vars(e.index, out)
    return out


# Values -----------------------------------------------------------------------------------------
class InterpreterError(RuntimeError):
    """The kernel would fault, hang or race on a GPU (an out-of-bounds or misaligned access, an
    unwritten value stored, a barrier some threads miss, a wait that never returns): a bug in
    the generated kernel, reported where a GPU would report an illegal address or hang."""


class _Poison:
    """A value computed from a register nobody wrote: harmless unless it reaches memory."""

    def __repr__(self):
        return "POISON"


POISON = _Poison()


def round_to(dt: DataType, x):
    """One value rounded to `dt` (scalar form of the rounding every write does: a Python int
    converts from int64, a float from float64)."""
    if x is POISON:
        return x
    with np.errstate(all="ignore"):
        if dt == DataType.Bool:
            return bool(x)
        r = _round_array(dt, np.array([x]))[0]
        return int(r) if dt.is_integral else float(r)


_INT_RANGE = {DataType.Int32: (-2 ** 31, 2 ** 31 - 1), DataType.Int: (-2 ** 63, 2 ** 63 - 1)}


def _storage_dtype(dt: DataType):
    if dt.is_floating:
        return np.float64
    if dt.is_integral:
        return np.int64
    return np.bool_


def _round_array(dt: DataType, x):
    """`x` (a numpy array or a number) rounded to `dt`, as the storage dtype of `dt`."""
    x = np.asarray(x)
    if dt == DataType.Float:
        return x.astype(np.float32).astype(np.float64)
    if dt == DataType.Double:
        return x.astype(np.float64, copy=False)
    if dt == DataType.BFloat16:
        f = x.astype(np.float32)
        bits = f.view(np.uint32)
        bits = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) \
            & np.uint32(0xFFFF0000)
        return np.where(np.isfinite(f), bits.view(np.float32), f).astype(np.float64)
    if dt == DataType.Half:
        # Through float32, as pf::cast (and torch's c10::Half(float)) converts: a double is
        # rounded twice, an int64 first to float32.
        return x.astype(np.float32).astype(np.float16).astype(np.float64)
    if dt.is_float8:
        # numpy has no float8: torch's conversion (through float32 as well) is the definition.
        f = torch.from_numpy(np.ascontiguousarray(x.astype(np.float32)))
        return to_float8(f, dt).to(torch.float64).numpy().reshape(x.shape)
    if dt == DataType.Bool:
        return x != 0 if x.dtype != np.bool_ else x
    # Integers: an integer keeps its low bits (C's conversion to a narrower integer: int64 ->
    # int32 wraps); a float truncates toward zero, NaN gives 0 and values out of range saturate
    # (cvt.rzi).
    if x.dtype.kind in "iub":
        x = x.astype(np.int64, copy=False)
        return x.astype(np.int32).astype(np.int64) if dt == DataType.Int32 else x
    lo, hi = _INT_RANGE.get(dt, _INT_RANGE[DataType.Int])
    x = np.where(np.isnan(x), 0.0, x)
    # np.where, not item assignment: x may be a 0-d value (a scalar operand's), whose trunc
    # is a numpy scalar.
    out = np.trunc(x).astype(np.int64)
    return np.where(x >= float(hi), hi, np.where(x <= float(lo), lo, out))


def _as_float(x):
    if type(x) is _ND and x.dtype != np.float64:
        return x.astype(np.float64)
    return x


def _as_number(x):
    """bool arrays take part in arithmetic as 0 / 1 (numpy would make + a logical or)."""
    if type(x) is _ND and x.dtype == np.bool_:
        return x.astype(np.int64)
    return x


def _integer_pow(a, b):
    """pf::pow of integers (math.cuh), torch's integer pow: exact, by repeated squaring that
    wraps at 64 bits (an int32 result is wrapped again where it is written, which leaves the
    same low bits as wrapping at 32); a negative exponent gives 1 for a base of 1, +-1 for -1,
    else 0."""
    scalar = type(a) is not _ND and type(b) is not _ND
    a = np.asarray(_as_number(a), dtype=np.int64)
    b = np.asarray(_as_number(b), dtype=np.int64)
    a, b = np.broadcast_arrays(a, b)
    result = np.ones(a.shape, dtype=np.int64)
    base = a.copy()
    e = np.where(b < 0, 0, b)
    with np.errstate(over="ignore"):
        while (e != 0).any():
            result = np.where(e & 1 == 1, result * base, result)
            base = base * base
            e = e >> 1
    negative = np.where(a == 1, 1, np.where(a == -1, np.where(b & 1 == 1, -1, 1), 0))
    result = np.where(b < 0, negative, result)
    return int(result) if scalar else result


def _binary(e, a, b):
    """A binary op on operand values, converted first to its operand dtype's compute type as
    the generated code reads them (pf::cast<float> of an int64 rounds it: 16777217 - 16777216.0f
    is 0 in float32, as in torch); integer pow is exact, not the float64 power the other outputs
    take."""
    if e.op.is_arg_key:
        # The value read in its compute type, the index as an int64 (pf::arg_max_key).
        return _arg_key(_converted(compute_type(e.operand_dtype), a), b,
                        e.op == BinaryOpType.ArgMaxKey)
    if not e.op.is_logical:
        dt = compute_type(e.operand_dtype)
        a, b = _converted(dt, a), _converted(dt, b)
    if e.op == BinaryOpType.Pow and not e.outputs[0].dtype.is_floating:
        return _integer_pow(a, b)
    return _BINARY[e.op](a, b)


def _arg_key(value, index, largest: bool):
    """runtime/arg_key.py's keys of numpy values (or a number) at numpy indices."""
    scalar = type(value) is not _ND and type(index) is not _ND
    key = arg_key(torch.from_numpy(np.ascontiguousarray(value)),
                  torch.from_numpy(np.ascontiguousarray(index, dtype=np.int64)), largest).numpy()
    return int(key) if scalar else key


def _lse(fn, *args):
    """runtime/lse_key.py's `fn` of numpy values (or numbers), numpy out (a number for
    numbers): keys are int64, values float32."""
    scalar = all(type(a) is not _ND for a in args)
    ts = [torch.as_tensor(np.asarray(a, dtype=np.int64 if fn is not lse_key.lse_key
                                     else np.float32)) for a in args]
    out = fn(*ts).numpy()
    return out.item() if scalar else out


def _converted(dt: DataType, x):
    """An operand value converted to `dt` as pf::cast<dt> reads it (float32: rounded; int32:
    wrapped or truncated); arrays stay arrays, Python numbers numbers. float64 operands are
    left as numpy converts them (an int64 to float64 rounds alike), int64 ones too."""
    if x is POISON or dt in (DataType.Double, DataType.Bool) or (
            dt == DataType.Int and not isinstance(x, float) and (
                type(x) is not _ND or x.dtype.kind in "iub")):
        return x
    if type(x) is _ND:
        return _round_array(dt, x)
    return round_to(dt, x)


def _torch_special(fn, x):
    """torch's float64 `fn` (erf, erfc: numpy has neither) of a numpy value or a number."""
    t = torch.from_numpy(np.ascontiguousarray(np.asarray(x, dtype=np.float64)))
    out = fn(t).numpy()
    return out if type(x) is _ND else float(out)


def _erf(x):
    return _torch_special(torch.special.erf, x)


def _erfc(x):
    return _torch_special(torch.special.erfc, x)


# The gelus in float64 without cancellation, as pf::gelu_tanh and pf::gelu compute them (and
# runtime/reference.py): x / (1 + exp(-2u)) and 0.5 x erfc(-x / sqrt 2).
def _gelu_tanh(x):
    x = _as_float(x)
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-2.0 * math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _gelu_erf(x):
    x = _as_float(x)
    return 0.5 * x * _erfc(x * -math.sqrt(0.5))


def _relu(x):
    return np.maximum(_as_number(x), 0)      # a NaN stays NaN (pf::relu is maximum(x, 0))


_UNARY = {
    UnaryOpType.Neg: lambda x: np.negative(_as_number(x)),
    UnaryOpType.Abs: lambda x: np.abs(_as_number(x)),
    UnaryOpType.Exp: lambda x: np.exp(_as_float(x)),
    UnaryOpType.Exp2: lambda x: np.exp2(_as_float(x)),
    UnaryOpType.Log: lambda x: np.log(_as_float(x)),
    UnaryOpType.Sqrt: lambda x: np.sqrt(_as_float(x)),
    UnaryOpType.Rsqrt: lambda x: 1.0 / np.sqrt(_as_float(x)),
    UnaryOpType.Reciprocal: lambda x: 1.0 / _as_float(x),
    UnaryOpType.Tanh: lambda x: np.tanh(_as_float(x)),
    UnaryOpType.Sigmoid: lambda x: 1.0 / (1.0 + np.exp(-_as_float(x))),
    UnaryOpType.Erf: lambda x: _erf(x),
    UnaryOpType.Relu: _relu,
    UnaryOpType.Silu: lambda x: _as_float(x) / (1.0 + np.exp(-_as_float(x))),
    UnaryOpType.GeluTanh: _gelu_tanh,
    UnaryOpType.GeluErf: _gelu_erf,
    UnaryOpType.Not: np.logical_not,
    UnaryOpType.Cast: lambda x: x, UnaryOpType.Set: lambda x: x,
    UnaryOpType.ArgKeyIndex: arg_key_index,
    UnaryOpType.LseKey: lambda x: _lse(lse_key.lse_key, x),
    UnaryOpType.LseMax: lambda x: _lse(lse_key.lse_max, x),
    UnaryOpType.LseSum: lambda x: _lse(lse_key.lse_sum, x),
}
_BINARY = {
    BinaryOpType.Add: lambda a, b: np.add(_as_number(a), _as_number(b)),
    BinaryOpType.Sub: lambda a, b: np.subtract(_as_number(a), _as_number(b)),
    BinaryOpType.Mul: lambda a, b: np.multiply(_as_number(a), _as_number(b)),
    BinaryOpType.Div: lambda a, b: np.true_divide(_as_float(a), b),
    BinaryOpType.Pow: lambda a, b: np.power(_as_float(a), _as_float(b)),
    # pf::maximum / pf::minimum (max.NaN): a NaN operand gives NaN, like torch.maximum.
    BinaryOpType.Max: np.maximum, BinaryOpType.Min: np.minimum,
    BinaryOpType.Eq: np.equal, BinaryOpType.Ne: np.not_equal,
    BinaryOpType.Lt: np.less, BinaryOpType.Le: np.less_equal,
    BinaryOpType.Gt: np.greater, BinaryOpType.Ge: np.greater_equal,
    BinaryOpType.And: np.logical_and, BinaryOpType.Or: np.logical_or,
}
# Accumulations and block / cluster / grid reductions (max / min propagate NaN: pf::OpMax).
_REDUCE = {"sum": lambda a, b: np.add(_as_number(a), _as_number(b)), "max": np.maximum,
           "min": np.minimum, "logsumexp": lambda a, b: _lse(lse_key.lse_combine, a, b)}
# A scan's combine, op(earlier, later) (lower/scans.py); cumulative forms for the block scan.
_SCAN = {"sum": _REDUCE["sum"], "prod": lambda a, b: np.multiply(_as_number(a), _as_number(b))}
_SCAN_IDENTITY = {"sum": 0, "prod": 1}
_CUMULATIVE = {"sum": np.cumsum, "prod": np.cumprod}


def _exclusive_scan(op: str, table):
    """(the exclusive scan of each row of `table` under `op`, each row's total)."""
    cum = _CUMULATIVE[op](table, axis=1)
    excl = np.empty_like(cum)
    excl[:, 0] = _SCAN_IDENTITY[op]
    excl[:, 1:] = cum[:, :-1]
    return excl, cum[:, -1]


def _lse_reduceat(v, starts, axis=0):
    """np.ufunc.reduceat's result for logsumexp keys: each segment of `v` (from each start to
    the next) folded in order with lse_combine."""
    v = np.asarray(v, dtype=np.int64)
    ends = np.r_[starts[1:], v.shape[0]]
    res = v[starts].copy()
    shape = (-1,) + (1,) * (v.ndim - 1)
    for j in range(1, int((ends - starts).max(initial=1))):
        at = starts + j
        nxt = np.where((at < ends).reshape(shape), v[np.minimum(at, v.shape[0] - 1)],
                       lse_key.IDENTITY)
        res = _lse(lse_key.lse_combine, res, nxt)
    return res


_REDUCEAT = {"sum": np.add.reduceat, "max": np.maximum.reduceat, "min": np.minimum.reduceat,
             "logsumexp": _lse_reduceat}


def _py(x):
    """A numpy scalar as the Python number it holds."""
    return x.item() if isinstance(x, np.generic) else x


def _or_masks(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return a | b


def _lanes(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64)


# Thread sets ------------------------------------------------------------------------------------
class _Env(dict):
    """Variables of a thread set. A variable missing here comes from the parent set's variables,
    narrowed to this set (`sel`: positions of this set's threads in the parent's; None: the same
    threads)."""

    __slots__ = ("parent", "sel")

    def __missing__(self, key):
        v = self.parent[key]
        if self.sel is not None and type(v) is _ND:
            v = v[self.sel]
        self[key] = v
        return v


def _env(parent, sel) -> _Env:
    e = _Env()
    e.parent = parent
    e.sel = sel
    return e


class _Ctx:
    """The threads executing a statement: their global ids (ascending) and their variables."""

    __slots__ = ("tids", "env", "n", "tpb", "full", "_blk", "_bases")

    def __init__(self, tids, env, tpb, full=False):
        self.tids = tids
        self.env = env
        self.n = len(tids)
        self.tpb = tpb
        self.full = full            # every thread of the grid (tids is 0, 1, ...)
        self._blk = None
        self._bases = None

    def ev(self, e):
        return compile_expr(e)(self.env)

    def arr(self, value, dtype=None) -> np.ndarray:
        """`value` (a number or a per-thread array) as an array over these threads."""
        if type(value) is _ND:
            return value
        return np.full(self.n, value, dtype=dtype)

    @property
    def blk(self) -> np.ndarray:
        if self._blk is None:
            self._blk = self.tids // self.tpb
        return self._blk

    def base(self, kind: str, row: int):
        """Flat offset of each thread's row of a register (per thread) or shared (per block)
        buffer of `row` elements."""
        if kind == "global":
            return 0
        key = (kind, row)
        if self._bases is None:
            self._bases = {}
        b = self._bases.get(key)
        if b is None:
            b = (self.tids if kind == "local" else self.blk) * row
            self._bases[key] = b
        return b

    def child(self) -> "_Ctx":
        """The same threads in a new scope (a loop iteration)."""
        c = _Ctx(self.tids, _env(self.env, None), self.tpb, self.full)
        c._blk = self._blk
        c._bases = self._bases
        return c

    def subset(self, mask) -> "_Ctx":
        """The threads where `mask` (a bool array over these threads) holds."""
        if mask.dtype != np.bool_:
            mask = mask != 0
        sel = np.flatnonzero(mask)
        if len(sel) == self.n:
            return self.child()
        c = _Ctx(self.tids[sel], _env(self.env, sel), self.tpb)
        if self._blk is not None:
            c._blk = self._blk[sel]
        return c

    def take(self, sel) -> "_Ctx":
        return _Ctx(self.tids[sel], _env(self.env, sel), self.tpb)


class _Mem:
    """One buffer's storage: flat values, the written mask (None: always written), one row of
    `row` elements per thread (registers) or block (shared) or one row (global) of which `limit`
    are the buffer's; for global buffers the write counts, for shared buffers of a cp.async
    kernel its copy bookkeeping."""

    __slots__ = ("buf", "kind", "vals", "written", "counts", "row", "limit", "allocated",
                 "all_allocated", "owner", "reader", "inflight", "align0", "last_read", "landed",
                 "busy")

    def __init__(self, buf, kind, vals, written, row, limit):
        self.buf, self.kind, self.vals, self.written = buf, kind, vals, written
        self.row, self.limit = row, limit
        self.counts = None
        self.allocated = None
        self.all_allocated = True
        self.owner = self.reader = self.inflight = None
        # Slots of asynchronous copies: per group, the moment each element was last read
        # ([groups, elements]), and the moment its last copy was issued.
        self.last_read = self.landed = None
        # Accumulators of wgmma (register buffers): per thread, the wgmma commit group of the
        # latest wgmma writing them that no wait has completed yet, or -1 (None: never one).
        self.busy = None
        # Elements between index 0 and the 16-byte boundary below it: an input's data pointer
        # (a sliced view may start anywhere); 0 for buffers the kernel or executor allocates.
        self.align0 = 0


class _Bars:
    """The mbarriers of one MBarriers array in every block: [blocks, count] arrays."""

    def __init__(self, nblocks: int, count: int):
        self.count = count
        self.allocated = np.zeros(nblocks, dtype=bool)
        self.state = np.zeros(nblocks * count, dtype=np.int8)    # 0 none, 1 live, 2 invalid
        self.arrivals = np.zeros(nblocks * count, dtype=np.int64)
        self.arrived = np.zeros(nblocks * count, dtype=np.int64)
        self.tx = np.zeros(nblocks * count, dtype=np.int64)
        self.phase = np.zeros(nblocks * count, dtype=np.int64)
        # Per group: the latest moment a member arrived (or, for the copies, issued bytes) on
        # each barrier; a completed phase hands them to its waiters.
        self.arrival_moments = np.zeros((nblocks * count, _GROUPS), dtype=np.int64)


class _TileView:
    """A TileBoxMap over its tensor in this launch: the tensor's storage, its rows and columns,
    the row stride (elements), its dtype."""

    __slots__ = ("map", "mem", "rows", "cols", "row_stride", "dtype", "batches", "batch_strides")

    def __init__(self, tile, mem, rows, cols, row_stride, dtype, batches=(), batch_strides=()):
        self.map, self.mem, self.rows, self.cols = tile, mem, rows, cols
        self.row_stride, self.dtype = row_stride, dtype
        # The batch dims' sizes and strides (elements), in the map's order (innermost first).
        self.batches, self.batch_strides = tuple(batches), tuple(batch_strides)


class _NamedBarrier:
    """A named barrier of every block inside warp roles: arrivals of the current phase, phases
    completed, and per group the latest moment a member arrived."""

    def __init__(self, nblocks: int):
        self.arrived = np.zeros(nblocks, dtype=np.int64)
        self.completed = np.zeros(nblocks, dtype=np.int64)
        self.moments = np.zeros((nblocks, _GROUPS), dtype=np.int64)


# Groups of work whose ordering the slot checks follow: the asynchronous copies, then each warp
# role (or the whole block when there are none).
_COPIES_GROUP = 0
_GROUPS = 8


class _Roles:
    """Turn-taking state of concurrently running warp roles (see Interpreter._run_roles)."""

    def __init__(self, n: int):
        self.n = n
        self.cv = threading.Condition()
        self.local = threading.local()
        self.turn = 0
        self.done = [False] * n
        self.blocked_at = [None] * n   # mbarrier version a blocked role last saw
        self.version = 0               # bumped whenever an mbarrier phase completes
        self.error = None

    def next_turn(self, me: int) -> int:
        for k in range(1, self.n + 1):
            j = (me + k) % self.n
            if not self.done[j]:
                return j
        return me


_THREAD_LOOPS = frozenset(("TIDx", "TIDy", "TIDz", "BIDx", "BIDy", "BIDz"))
_COPIES = (LoadStoreOp, BroadcastOp, ExpandOp, SqueezeOp, ReshapeOp, FullOp)


class Interpreter:
    """Run `kernel` on CPU tensors. `bindings`: the kernel fusion's symbolic extents -> ints.
    `check_alignment`: check vector and copy alignment; `check_output_writes`: check that the
    kernel writes each output element exactly once; `max_threads`, `max_bytes`: the limits
    above which it refuses (see the module docstring)."""

    def __init__(self, kernel: K.Kernel, bindings: dict, check_alignment: bool = True,
                 max_threads: int = 1 << 20, max_bytes: int = 2 << 30,
                 check_output_writes: bool = True):
        self.k = kernel
        self.bindings = dict(bindings)
        self.check_alignment = check_alignment
        self.check_output_writes = check_output_writes
        self.max_threads = max_threads
        self.max_bytes = max_bytes
        self.mems: dict = {}
        self._writes_cache = None
        self._handlers = {}

    # Write counts ----------------------------------------------------------------------------
    @property
    def writes(self) -> dict:
        """(global buffer name, element offset) -> number of writes, for every element written."""
        if self._writes_cache is None:
            out: dict = {}
            for m in self.mems.values():
                if m.counts is None:
                    continue
                nz = np.flatnonzero(m.counts)
                name = m.buf.name
                for off, c in zip(nz.tolist(), m.counts[nz].tolist()):
                    out[(name, off)] = out.get((name, off), 0) + c
            self._writes_cache = out
        return self._writes_cache

    # Storage ---------------------------------------------------------------------------------
    def _account(self, nbytes: int, what: str) -> None:
        self._bytes += nbytes
        if self._bytes > self.max_bytes:
            raise InterpreterError(
                f"{what} would take the interpreter's storage to {self._bytes / 2 ** 30:.2f} GiB, "
                f"over its limit of {self.max_bytes / 2 ** 30:.2f} GiB ({self.nthreads} threads: "
                f"grid {self.grid}, block {self.block}); interpret a smaller problem or raise "
                "Interpreter(max_bytes=...)")

    def _new_mem(self, buf, kind, n, written: bool, fill=0, row=None, limit=None) -> _Mem:
        dt = _storage_dtype(buf.dtype)
        self._account(n * (np.dtype(dt).itemsize + (0 if written else 1)),
                      f"{kind} buffer {buf.name} ({n} elements)")
        vals = np.zeros(n, dtype=dt) if fill == 0 else np.full(n, fill, dtype=dt)
        m = _Mem(buf, kind, vals, None if written else np.zeros(n, dtype=bool),
                 n if row is None else row, n if limit is None else limit)
        self.mems[id(buf)] = m
        return m

    def _mem(self, ctx: _Ctx, buf: K.Buffer) -> _Mem:
        m = self.mems.get(id(buf))
        if m is not None and m.buf is buf:
            if m.kind == "local" and not m.all_allocated and not m.allocated[ctx.tids].all():
                raise InterpreterError(f"register buffer {buf.name} is used before its Allocate")
            return m
        if buf.memory == "shared":
            size = self._uniform_size(buf, ctx)
            m = self._new_mem(buf, "shared", self.nblocks * size, written=False, row=size,
                              limit=size)
            if self.cp_kernel:
                m.owner = np.full(self.nblocks * size, -1, dtype=np.int64)
                m.reader = np.full(self.nblocks * size, -1, dtype=np.int64)
                m.inflight = np.full(self.nblocks * size, -1, dtype=np.int64)
            if id(buf) in self.slot_buffers:
                m.last_read = np.zeros((_GROUPS, self.nblocks * size), dtype=np.int64)
                m.landed = np.zeros(self.nblocks * size, dtype=np.int64)
            return m
        if buf.memory == "local":
            raise InterpreterError(f"register buffer {buf.name} is used before its Allocate")
        raise InterpreterError(f"global buffer {buf.name} is not a parameter of the kernel")

    def _size(self, buf, ctx):
        if not isinstance(buf.size, K.KExpr):
            return int(buf.size)
        return ctx.ev(buf.size)

    def _uniform_size(self, buf, ctx) -> int:
        size = self._size(buf, ctx)
        if type(size) is _ND:
            size = int(size.max()) if len(size) else 0
        return int(size)

    # Addresses -------------------------------------------------------------------------------
    def _where_tid(self, tid: int) -> str:
        """A thread's indices, for messages about a thread outside any statement's set."""
        tib, b = tid % self.tpb, tid // self.tpb
        bx, by, bz = self.block
        gx, gy, _ = self.grid
        vals = {"threadIdx.x": tib % bx, "threadIdx.y": (tib // bx) % by,
                "threadIdx.z": tib // (bx * by), "blockIdx.x": b % gx,
                "blockIdx.y": (b // gx) % gy, "blockIdx.z": b // (gx * gy)}
        return ", ".join(f"{k}={v}" for k, v in vals.items())

    @staticmethod
    def _where(ctx: _Ctx, i: int) -> str:
        """Variables of thread `i` of `ctx` (parameters named T... and bools left out)."""
        chain = []
        e = ctx.env
        while isinstance(e, _Env):
            chain.append(e)
            e = e.parent
        names: dict = {}
        for env in reversed(chain):
            for k in env:
                names.setdefault(k)
        parts = []
        for k in names:
            if k.startswith("T"):
                continue
            v = ctx.env[k]
            if type(v) is _ND:
                v = v[i]
            v = _py(v)
            if isinstance(v, bool):
                continue
            parts.append(f"{k}={v}")
        return ", ".join(parts)

    def _locate(self, ctx: _Ctx, ti: K.TensorIndex, what: str, lanes, align=None):
        """(memory, flat address of element 0 of each thread's access), with the bounds and
        alignment checks of `lanes` elements (an int, or one count per thread)."""
        m, idx = self._check(ctx, ti, what, lanes, align)
        addr = ctx.base(m.kind, m.row) + idx
        if type(addr) is not _ND:
            addr = np.full(ctx.n, addr, dtype=np.int64)
        return m, addr

    def _check(self, ctx: _Ctx, ti: K.TensorIndex, what: str, lanes, align=None):
        """(memory, index of element 0 of each thread's access: a number or an array), with the
        bounds checks of `lanes` elements (an int, or one count per thread) and the alignment
        check of a vector access: its first element's address (from the data pointer, for
        inputs) a multiple of `align` elements (default `lanes`; 1: no check, for copies whose
        callers check their own rule)."""
        align = lanes if align is None else align
        m = self._mem(ctx, ti.buffer)
        idx = ctx.ev(ti.index)
        if type(idx) is _ND:
            if idx.dtype.kind not in "iu":
                if idx.dtype != np.bool_:
                    raise InterpreterError(f"{what} {ti!r}: index {idx!r} is not an integer")
                idx = idx.astype(np.int64)
            lo = idx.min()
            hi = (idx + lanes).max() if type(lanes) is _ND else idx.max() + lanes
        else:
            if not isinstance(idx, (int, np.integer)):
                raise InterpreterError(f"{what} {ti!r}: index {idx!r} is not an integer")
            lo = idx
            hi = idx + lanes if type(lanes) is not _ND else (idx + lanes).max()
        limit = m.limit
        outside = lo < 0 or hi > limit
        vector = self.check_alignment and (type(align) is _ND or align > 1)
        if vector:
            mis = (idx + m.align0) % align
            misaligned = mis.any() if type(mis) is _ND else mis != 0
        if outside or (vector and misaligned):
            # The first thread with a problem, as if the threads ran one after another.
            out = np.broadcast_to((np.asarray(idx) < 0) | (np.asarray(idx + lanes) > limit),
                                  (ctx.n,))
            bad = (out | np.broadcast_to(np.asarray((idx + m.align0) % align) != 0, (ctx.n,))
                   if vector else out)
            i = int(np.argmax(bad))
            v = _py(idx[i] if type(idx) is _ND else idx)
            n = _py(lanes[i] if type(lanes) is _ND else lanes)
            if out[i]:
                raise InterpreterError(
                    f"{what} {ti!r}: elements [{v}, {v + n}) outside [0, {limit}) of "
                    f"{ti.buffer.name} ({ti.buffer.memory}) at {self._where(ctx, i)}")
            a = _py(align[i] if type(align) is _ND else align)
            where = f" (the data pointer is {m.align0} elements past 16 bytes)" if m.align0 else ""
            raise InterpreterError(
                f"{what} {ti!r}: vector access of {n} at element {v}{where} is not aligned to "
                f"{a} elements at {self._where(ctx, i)}")
        return m, idx

    # Reads and writes ------------------------------------------------------------------------
    def _read(self, ctx: _Ctx, operand, nread: int = 1, what: str = "read of"):
        """(values, poison mask or None) of `nread` lanes of `operand` for every thread:
        arrays [threads] (nread == 1) or [threads, nread]; a fusion scalar is a number."""
        if isinstance(operand, K.ScalarValue):
            return self._scalar(operand.scalar), None
        if not isinstance(operand, K.TensorIndex):
            raise InterpreterError(f"cannot read {operand!r}")
        m, idx = self._check(ctx, operand, what, max(operand.vector, nread, 1))
        if m.busy is not None:
            self._check_not_busy(ctx, m, operand, what)
        if m.kind == "local" and ctx.full and type(idx) is not _ND:
            # Every thread, one element (or vector) of its row: a column of the rows.
            col = idx if nread == 1 else slice(idx, idx + nread)
            vals = m.vals.reshape(-1, m.row)[:, col]
            w = m.written.reshape(-1, m.row)[:, col]
            return vals, (None if w.all() else ~w)
        addr = ctx.base(m.kind, m.row) + idx
        if type(addr) is not _ND:
            addr = np.full(ctx.n, addr, dtype=np.int64)
        if nread > 1:
            addr = addr[:, None] + _lanes(nread)
        vals = m.vals[addr]
        poison = None
        if m.written is not None:
            w = m.written[addr]
            if not w.all():
                poison = ~w
        if m.owner is not None:
            self._track_read(ctx, m, operand, addr)
        if m.landed is not None:
            self._slot_read(ctx, m, operand, addr)
        return vals, poison

    # Slots of asynchronous copies: who has seen what ------------------------------------------
    def _group(self) -> int:
        """The group of the running statement: its warp role (1, 2, ...) or the block (1)."""
        roles = self._roles
        return 1 if roles is None else 1 + roles.local.idx

    def _now(self) -> int:
        self.moment += 1
        return self.moment

    def _slot_read(self, ctx, m: _Mem, operand, addr, record: bool = True) -> None:
        """RAW: each element's latest copy was made visible to the reading thread (it waited on
        the barrier phase the copy completed). Then (`record`) the read is recorded for the WAR
        check."""
        seen = self.seen[ctx.tids, _COPIES_GROUP]
        landed = m.landed[addr]
        bad = landed > (seen if addr.ndim == 1 else seen[:, None])
        if bad.any():
            k = int(np.argmax(bad.ravel()))
            i = k if addr.ndim == 1 else k // addr.shape[1]
            e = int(addr.ravel()[k]) % m.row
            raise InterpreterError(
                f"read of {operand!r} (element {e} of circular buffer {m.buf.name}) before a "
                f"wait on the barrier phase its copy completes (a missing wait or a wrong "
                f"parity) at {self._where(ctx, i)}")
        if record:
            m.last_read[self._group(), addr.ravel()] = self._now()

    def _slot_copy(self, ctx, i: int, m: _Mem, lo: int, n: int, what) -> None:
        """WAR: a copy by thread i of `ctx` into elements [lo, lo + n) of slot memory m follows
        every read of them, by any group, that a barrier made visible to the thread."""
        if m.landed is None:
            return
        tid = int(ctx.tids[i])
        reads = m.last_read[:, lo:lo + n].max(axis=1)
        late = reads > self.seen[tid]
        if late.any():
            g = int(np.argmax(late))
            who = "the block" if self._roles is None else f"warp role {g - 1}"
            raise InterpreterError(
                f"{what} into {m.buf.name} elements [{lo % m.row}, {lo % m.row + n}) overwrites "
                f"data {who} read with no barrier between that read and the copy's issue (a "
                f"missing release or block barrier) at {self._where(ctx, i)}")
        m.landed[lo:lo + n] = self._now()

    def _see(self, tids, moments) -> None:
        """Threads `tids` now see each group's work up to `moments` ([groups] or per thread)."""
        if self.seen is not None:
            self.seen[tids] = np.maximum(self.seen[tids], moments)

    def _track_read(self, ctx, m: _Mem, operand, addr) -> None:
        """cp.async visibility: a landed copy is the copying thread's until a block barrier;
        remember who read what since the last barrier."""
        tid = ctx.tids if addr.ndim == 1 else ctx.tids[:, None]
        owner = m.owner[addr]
        bad = (owner >= 0) & (owner != tid)
        if bad.any():
            k = int(np.argmax(bad.ravel()))
            i = k if addr.ndim == 1 else k // addr.shape[1]
            e = int(addr.ravel()[k]) % m.row
            raise InterpreterError(
                f"read of {operand!r} (element {e}) that another thread copied with cp.async, "
                f"with no block barrier since its wait, at {self._where(ctx, i)}")
        r = m.reader[addr]
        new = np.where((r == -1) | (r == tid), tid, -2).ravel()
        flat = addr.ravel()
        if len(flat) > 1 and not (flat[1:] > flat[:-1]).all():
            order = np.argsort(flat, kind="stable")
            s = flat[order]
            same = s[1:] == s[:-1]
            dup = np.zeros(len(flat), dtype=bool)
            dup[order[1:][same]] = True
            dup[order[:-1][same]] = True
            new[dup] = -2             # read by several threads in this statement
        m.reader[flat] = new

    def _write(self, ctx: _Ctx, ti: K.TensorIndex, vals, poison, nwrite: int = 1,
               what: str = "write of", exact: bool = False) -> None:
        """Store `vals` (see _read); `exact`: they are values of the buffer's dtype already."""
        m, idx = self._check(ctx, ti, what, max(ti.vector, nwrite, 1))
        if m.busy is not None:
            self._check_not_busy(ctx, m, ti, what)
        if poison is not None and m.kind != "local":
            i = int(np.argmax(poison.reshape(ctx.n, -1).any(axis=1)))
            raise InterpreterError(f"a value computed from unwritten registers is stored to "
                                   f"{ti!r} at {self._where(ctx, i)}")
        if m.kind == "local" and ctx.full and type(idx) is not _ND:
            col = idx if nwrite == 1 else slice(idx, idx + nwrite)
            m.vals.reshape(-1, m.row)[:, col] = vals if exact else _round_array(m.buf.dtype, vals)
            m.written.reshape(-1, m.row)[:, col] = True if poison is None else ~poison
            return
        addr = ctx.base(m.kind, m.row) + idx
        if type(addr) is not _ND:
            addr = np.full(ctx.n, addr, dtype=np.int64)
        if nwrite > 1:
            addr = addr[:, None] + _lanes(nwrite)
        self._store(m, addr, vals, poison, exact)
        if m.counts is not None:
            self._count(m, addr)

    def _store(self, m: _Mem, addr, vals, poison, exact: bool = False) -> None:
        """Store (rounding to the buffer's dtype); of several threads storing one element, the
        later thread wins."""
        vals = np.asarray(vals) if exact else _round_array(m.buf.dtype, vals)
        if vals.base is not None and np.may_share_memory(vals, m.vals):
            vals = vals.copy()                     # a view of the rows being written
        if vals.shape != addr.shape:
            vals = np.broadcast_to(vals, addr.shape)
        if m.kind != "local":                      # rows of registers never collide
            flat = addr.ravel()
            if len(flat) > 1 and not (flat[1:] > flat[:-1]).all():
                order = np.argsort(flat, kind="stable")
                s = flat[order]
                last = np.ones(len(s), dtype=bool)
                last[:-1] = s[1:] != s[:-1]
                keep = order[last]
                addr = flat[keep]
                vals = vals.ravel()[keep]
                if poison is not None:
                    poison = poison.ravel()[keep]
        m.vals[addr] = vals
        if m.written is not None:
            m.written[addr] = True if poison is None else ~poison

    def _count(self, m: _Mem, addr) -> None:
        self._writes_cache = None
        flat = addr.ravel()
        if len(flat) > 1 and not (flat[1:] > flat[:-1]).all():
            np.add.at(m.counts, flat, 1)
        else:
            m.counts[flat] += 1

    def _scalar(self, s):
        hit = self._scalars.get(id(s))
        if hit is not None and hit[0] is s:
            return hit[1]
        v = self._scalar_value(s)
        self._scalars[id(s)] = (s, v)
        return v

    def _scalar_value(self, s):
        if s.value is not None:
            return s.value
        if s in self.scalar_env:
            return self.scalar_env[s]
        d = s.definition
        with np.errstate(all="ignore"):
            # Rounded to the scalar's dtype, as the generated code converts it (a cast to an
            # integer truncates, to bf16 rounds) before any reader converts it again.
            if isinstance(d, UnaryOp):
                return round_to(s.dtype, _py(_UNARY[d.op](self._scalar(d.inputs[0]))))
            if isinstance(d, BinaryOp):
                return round_to(s.dtype, _py(_binary(d, self._scalar(d.inputs[0]),
                                                     self._scalar(d.inputs[1]))))
        return S.evaluate(s, self.scalar_env)

    # Running ---------------------------------------------------------------------------------
    def run(self, inputs: list) -> list:
        with np.errstate(all="ignore"):
            return self._run(inputs)

    def _run(self, inputs: list) -> list:
        from .inputs import output_strides
        k = self.k
        fusion = k.fusion
        self.scalar_env = dict(self.bindings)
        for v, x in zip(fusion.inputs, inputs):
            if not isinstance(v, TensorView):
                self.scalar_env[v] = x
        self._scalars: dict = {}
        self.mems = {}
        self._writes_cache = None
        self._bytes = 0
        self.tensor_maps = {}
        self.mbarriers: dict = {}
        self._roles = None
        self.cp_kernel = any(isinstance(x, K.CpAsyncCopy) for x in K.walk(k.body))
        self.slot_buffers = {id(x.dst.buffer) for x in K.walk(k.body)
                             if isinstance(x, (K.BulkLoad, K.TensorMapLoad))}
        self.named_barriers: dict = {}
        self.moment = 0
        self._cp_batches: list = []
        self._index_record = None
        self._quotient_flags: dict = {}   # CheckedQuotients flag -> per-thread bools
        self._acc_mems: list = []      # accumulators of wgmma (their busy marks)
        # Split-K (SplitKReduce): (slot, split) -> the stored partial, and arrivals per slot.
        self._split_partials: dict = {}
        self._split_arrivals: dict = {}
        self._wgmma_reads: list = []   # operand reads of wgmmas not waited for yet

        grid = [max(1, int(S.evaluate(g, dict(self.bindings)))) for g in k.launch.grid]
        block = [max(1, int(S.evaluate(b, dict(self.bindings)))) for b in k.launch.block]
        try:
            check_launch_limits(grid, block)
        except LaunchLimitError as e:
            raise InterpreterError(f"{k.name} launches {e}") from None
        self.grid, self.block = grid, block
        self.tpb = block[0] * block[1] * block[2]
        self.nblocks = grid[0] * grid[1] * grid[2]
        n = self.nthreads = self.nblocks * self.tpb
        if n > self.max_threads:
            raise InterpreterError(
                f"{n} threads is too many to interpret (grid {grid}, block {block}): the "
                f"interpreter runs at most {self.max_threads} (Interpreter(max_threads=...)); "
                "interpret a smaller problem")

        env0: dict = {}
        zeroed_outputs = set(getattr(k.ctx, "zeroed_outputs", ()))
        out_sizes = [[int(S.evaluate(i.maybe_expanded_extent,
                                     dict(self.bindings)))
                      for i in o.domain.logical_no_reductions] for o in fusion.outputs]
        out_mem = {}
        input_mems: dict = {}
        tile_maps: list = []
        for p in k.params:
            src = p.source
            if src[0] == "input":
                x = inputs[src[1]]
                flat = _storage_of(x)
                m = _Mem(p.buffer, "global", flat, None, len(flat), len(flat))
                m.align0 = (x.data_ptr() % 16) // max(x.element_size(), 1)
                self._account(flat.nbytes, f"input {p.buffer.name}")
                m.counts = np.zeros(len(flat), dtype=np.int32)
                self.mems[id(p.buffer)] = m
                input_mems[src[1]] = m
            elif src[0] == "output":
                o = fusion.outputs[src[1]]
                sizes = out_sizes[src[1]]
                strides = output_strides(o, sizes)
                span = 1 + sum((s - 1) * st for s, st in zip(sizes, strides) if s > 0)
                span = span if all(sizes) else 0
                # An output the kernel adds into (a scatter's) is zeroed by the executor first.
                zeroed = src[1] in zeroed_outputs
                m = self._new_mem(p.buffer, "global", span, written=True,
                                  fill=math.nan if o.dtype.is_floating and not zeroed else 0)
                m.counts = np.zeros(span, dtype=np.int32)
                out_mem[src[1]] = (m, sizes, strides, o.dtype)
            elif src[0] == "stride":
                _, role, kk, d = src
                if role == "input":
                    env0[p.name] = int(inputs[kk].stride(d))
                else:
                    env0[p.name] = output_strides(fusion.outputs[kk], out_sizes[kk])[d]
            elif src[0] == "extent":
                env0[p.name] = int(S.evaluate(src[1], dict(self.bindings)))
            elif src[0] == "scalar":
                env0[p.name] = inputs[src[1]]
            elif src[0] == "tmap":
                if isinstance(src[1], K.TileBoxMap):
                    tile_maps.append((p.name, src[1]))     # after the outputs exist
                else:
                    self.tensor_maps[p.name] = self._tensor_map(inputs[src[1].input], src[1])
            elif src[0] == "workspace":
                kind = dict((b.name, kd) for b, kd in k.workspaces).get(p.buffer.name)
                size = 0
                if kind in ("intermediate", "split_k_partials", "split_k_counters"):
                    # A global tensor between loop nests; split-K's partials and counters.
                    size = int(eval_expr(p.buffer.size, dict(env0, **{
                        e.name: v for e, v in self._extent_vars().items()})))
                if kind == "index_error":       # zeroed by the executor (index_check.py)
                    self._index_record = self._new_mem(p.buffer, "global",
                                                       INDEX_ERROR_ELEMENTS, written=True)
                    continue
                if kind == "index_report":      # the host's copy: the run raises instead
                    self._new_mem(p.buffer, "global", INDEX_ERROR_ELEMENTS, written=True)
                    continue
                m = self._new_mem(p.buffer, "global", size, written=False)
                m.counts = np.zeros(size, dtype=np.int32)
            else:
                raise InterpreterError(f"unknown parameter source {src}")
        for name, tile in tile_maps:
            self.tensor_maps[name] = self._tile_map(tile, inputs, input_mems, out_mem)

        # Thread indices in launch order (blockIdx z-major, threadIdx.x fastest); a dim of
        # extent 1 is the number 0.
        tid = np.arange(n, dtype=np.int64)
        tib, blk = tid % self.tpb, tid // self.tpb

        def dim(a, div, ext):
            return (a // div) % ext if ext > 1 else 0
        env0.update({"threadIdx.x": dim(tib, 1, block[0]),
                     "threadIdx.y": dim(tib, block[0], block[1]),
                     "threadIdx.z": dim(tib, block[0] * block[1], block[2]),
                     "blockIdx.x": dim(blk, 1, grid[0]),
                     "blockIdx.y": dim(blk, grid[0], grid[1]),
                     "blockIdx.z": dim(blk, grid[0] * grid[1], grid[2]),
                     "blockDim.x": block[0], "gridDim.x": grid[0], "pf_grid_last": False})
        self.root = _Ctx(tid, _env({}, None), self.tpb, full=True)
        self.root.env.update(env0)
        self.grid_reductions_run = 0
        self.root._blk = blk
        self.cp_commits = np.zeros(n, dtype=np.int64) if self.cp_kernel else None
        self.wgmma_commits = np.zeros(n, dtype=np.int64)
        # Per thread and group: the latest moment of that group's work visible to the thread.
        self.seen = np.zeros((n, _GROUPS), dtype=np.int64) if self.slot_buffers else None

        self._body(k.body, self.root)

        for m in self._acc_mems:
            if (m.busy >= 0).any():
                tid = int(np.argmax(m.busy >= 0))
                raise InterpreterError(f"the kernel ends with a wgmma into {m.buf.name} never "
                                       f"waited for (thread {self._where_tid(tid)})")
        if self._split_partials or any(self._split_arrivals.values()):
            left = sorted(self._split_partials) or sorted(
                (s, c) for s, c in self._split_arrivals.items() if c)
            raise InterpreterError(f"the kernel ends with split-K partials never summed "
                                   f"((slot, split) or (slot, arrivals): {left[:4]})")
        for b in self._cp_batches:
            if len(b["tids"]):
                raise InterpreterError(f"the kernel ends with cp.async copies never waited for "
                                       f"(thread {self._where_tid(int(b['tids'][0]))})")
        if self._index_record is not None:
            # As the executor after a launch: an index a gather found out of range raises.
            raise_if_failed(self._index_record.vals, k.ctx.index_checks,
                            lambda n: S.evaluate(n, dict(self.bindings)))
        if self.check_output_writes:
            for j in range(len(fusion.outputs)):
                if j not in zeroed_outputs:
                    self._check_written_once(j, *out_mem[j][:3])
                elif out_mem[j][0].counts.any():
                    # Added into (a scatter's atomics), never stored to: a store would race
                    # with the adds of other threads.
                    raise InterpreterError(f"output {j}, which the kernel adds into, is also "
                                           "stored to")
        outs = []
        for j in range(len(fusion.outputs)):
            m, sizes, strides, dt = out_mem[j]
            # Converted first, then viewed at the output's strides: an expanded output keeps
            # its stride-0 dims (a .to() of the strided view would make it dense).
            flat = torch.from_numpy(m.vals).to(to_torch(dt))
            outs.append(flat.as_strided(sizes, strides) if m.vals.size
                        else torch.zeros(sizes, dtype=flat.dtype))
        return outs

    def _check_written_once(self, j: int, m: _Mem, sizes, strides) -> None:
        """Each element of output j in memory (an expanded dim holds one for all) written by
        exactly one thread, once: a second write of the same value hides a kernel that maps two
        iterations onto one element (and wastes the bandwidth), one of another value is a race,
        and an element never written is garbage on the GPU."""
        counts = m.counts
        bad = np.flatnonzero(counts != 1)
        if not len(bad):
            return
        off = int(bad[0])
        c = int(counts[off])
        # The element's logical index: peel dims off the offset, largest stride first.
        index = [0] * len(sizes)
        rest = off
        for d in sorted((d for d in range(len(sizes)) if strides[d] and sizes[d] > 1),
                        key=lambda d: -strides[d]):
            index[d], rest = divmod(rest, strides[d])
        more = int((counts > 1).sum())
        never = int((counts == 0).sum())
        what = f"written {c} times" if c else "never written"
        raise InterpreterError(
            f"output {j} ({m.buf.name}) element {tuple(index)} (offset {off}) is {what} by the "
            f"kernel; each output element must be written exactly once ({more} of its "
            f"{len(counts)} elements are written more than once, {never} never)")

    def _extent_vars(self) -> dict:
        """Kernel variables of the symbolic extents (K.Var -> value)."""
        names = getattr(self.k.ctx, "names", {}) or {}
        out = {}
        for s, var in names.items():
            if isinstance(var, K.Var) and s in self.bindings:
                out[var] = self.bindings[s]
        return out

    def _body(self, stmts, ctx: _Ctx) -> None:
        if not ctx.n:
            return
        handlers = self._handlers
        for s in stmts:
            h = handlers.get(type(s))
            if h is None:
                h = getattr(self, "_" + type(s).__name__, None)
                if h is None:
                    raise InterpreterError(f"the interpreter cannot run {type(s).__name__} "
                                           f"statements ({s!r})")
                handlers[type(s)] = h
            h(s, ctx)

    # Control flow ----------------------------------------------------------------------------
    def _ForLoop(self, s: K.ForLoop, ctx: _Ctx):
        if s.parallel in _THREAD_LOOPS:
            self._body(s.body, ctx)
            return
        name = s.var.name
        if s.parallel == "GridStride":
            start, step = ctx.env["blockIdx.x"], ctx.env["gridDim.x"]
        else:
            start, step = ctx.ev(s.start), ctx.ev(s.step)
        stop = ctx.ev(s.stop)
        if type(start) is not _ND and type(step) is not _ND and type(stop) is not _ND:
            start, step, stop = int(start), int(step), int(stop)
            if step <= 0 and start < stop:
                raise InterpreterError(f"loop {name} steps by {step}")
            for v in range(start, stop, step):
                c = ctx.child()
                c.env[name] = v
                self._body(s.body, c)
            return
        start, step, stop = ctx.arr(start), ctx.arr(step), ctx.arr(stop)
        if ((step <= 0) & (start < stop)).any():
            raise InterpreterError(f"loop {name} steps by {int(step.min())}")
        it = 0
        while True:
            v = start + it * step
            active = v < stop
            if active.all():
                c = ctx.child()
                c.env[name] = v
            elif active.any():
                c = ctx.subset(active)
                c.env[name] = v[active]
            else:
                break
            self._body(s.body, c)
            it += 1

    def _CheckedQuotients(self, s: K.CheckedQuotients, ctx: _Ctx):
        """lower/shared_divisor.py. The fast copy's quotients are computed as IEEE division,
        which is what the device's are wherever they pass their check
        (tools/check_shared_divisor.py); each clears its thread's flag by that check, and the
        threads whose flag was cleared run the exact copy."""
        ok = np.ones(int(ctx.tids.max()) + 1, dtype=bool)
        self._quotient_flags[s.flag] = ok
        self._body(s.fast, ctx)
        del self._quotient_flags[s.flag]
        again = ~ok[ctx.tids]
        if again.any():
            # The exact copy writes again what the fast copy wrote, and nothing else: each
            # output element still counts as written once.
            counts = {k: m.counts.copy() for k, m in self.mems.items() if m.counts is not None}
            self._body(s.exact, ctx.subset(again))
            for k, before in counts.items():
                m = self.mems[k]
                new = np.flatnonzero((m.counts > before) & (before == 0))
                if len(new):
                    raise InterpreterError(
                        f"the exact copy of checked quotients {s.flag} writes {m.buf.name} at "
                        f"offset {int(new[0])}, which its fast copy did not write")
                m.counts[:] = before

    def _IfThenElse(self, s, ctx: _Ctx):
        cond = ctx.ev(s.cond)
        if type(cond) is _ND:
            if cond.dtype != np.bool_:
                cond = cond != 0
            yes, no = ctx.subset(cond), ctx.subset(~cond)
        else:
            empty = ctx.take(np.zeros(0, dtype=np.int64))
            yes, no = (ctx, empty) if cond else (empty, ctx)
        self._body(s.then_body, yes)
        self._body(s.else_body, no)

    def _RoleSplit(self, s: K.RoleSplit, ctx: _Ctx):
        rest, groups = ctx, []
        empty = ctx.take(np.zeros(0, dtype=np.int64))
        for rb in s.roles:
            if rb.cond is None:
                mine, rest = rest, empty
            else:
                cond = rest.ev(rb.cond)
                if type(cond) is _ND:
                    cond = cond if cond.dtype == np.bool_ else cond != 0
                    mine, rest = rest.subset(cond), rest.subset(~cond)
                else:
                    mine, rest = (rest, empty) if cond else (empty, rest)
            groups.append((rb.body, mine))
        if len(groups) + 1 > _GROUPS:
            raise InterpreterError(f"{len(groups)} warp roles: the interpreter follows at most "
                                   f"{_GROUPS - 1}")
        self._run_roles(groups)

    # Warp roles: the roles run as cooperating groups (each in lockstep). A group runs until an mbarrier wait it cannot pass, then hands over; when
    # neither can move, the kernel would hang, and the interpreter says so.
    def _run_roles(self, groups) -> None:
        roles = _Roles(len(groups))
        self._roles = roles

        def run(idx, body, ctx):
            roles.local.idx = idx
            with roles.cv:
                while roles.turn != idx:
                    roles.cv.wait()
            try:
                with np.errstate(all="ignore"):
                    self._body(body, ctx)
            except BaseException as e:      # reported by the main thread
                roles.error = roles.error or e
            finally:
                with roles.cv:
                    roles.done[idx] = True
                    roles.turn = roles.next_turn(idx)
                    roles.cv.notify_all()
        workers = [threading.Thread(target=run, args=(k, b, c)) for k, (b, c) in enumerate(groups)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        self._roles = None
        if roles.error is not None:
            raise roles.error

    def _wait_until(self, ready, what) -> None:
        """Block until `ready()`; `what()` describes the wait for the error if it never is."""
        roles = self._roles
        if roles is None:
            if not ready():
                raise InterpreterError(what())
            return
        me = roles.local.idx
        while not ready():
            with roles.cv:
                others = [k for k in range(roles.n) if k != me and not roles.done[k]]
                stuck = all(roles.blocked_at[k] == roles.version for k in others)
                if roles.error is not None or stuck:
                    err = InterpreterError("deadlock: " + what())
                    roles.error = roles.error or err
                    raise err
                roles.blocked_at[me] = roles.version
                roles.turn = roles.next_turn(me)
                roles.cv.notify_all()
                while roles.turn != me:
                    roles.cv.wait()
                roles.blocked_at[me] = None
                if roles.error is not None:
                    raise roles.error

    # Simple statements -----------------------------------------------------------------------
    def _SetMaxNReg(self, s, ctx):
        pass

    def _Comment(self, s, ctx):
        pass

    def _FenceMBarrierInit(self, s, ctx):
        pass

    def _ScalarDef(self, s, ctx: _Ctx):
        ctx.env[s.var.name] = ctx.ev(s.value)

    def _Allocate(self, s, ctx: _Ctx):
        b = s.buffer
        if b.memory != "local":
            return
        size = self._size(b, ctx)
        if type(size) is _ND:
            if (size != size[0]).any():
                raise InterpreterError(f"register buffer {b.name} has sizes {np.unique(size)} in "
                                       "different threads")
            size = size[0]
        size = int(size)
        m = self.mems.get(id(b))
        if m is None or m.buf is not b:
            m = self._new_mem(b, "local", self.nthreads * max(size, 1), written=False,
                              row=max(size, 1), limit=size)
            m.allocated = np.zeros(self.nthreads, dtype=bool)
            m.all_allocated = False
        elif size != m.limit:
            raise InterpreterError(f"register buffer {b.name} allocated with {size} elements, "
                                   f"earlier with {m.limit}")
        rows = m.written.reshape(self.nthreads, m.row)
        if ctx.full:
            rows[:] = False
        else:
            rows[ctx.tids] = False
        if not m.all_allocated:
            m.allocated[ctx.tids] = True
            m.all_allocated = bool(m.allocated.all())

    def _InitValue(self, s, ctx: _Ctx):
        v = s.value
        val = self._scalar(v.scalar) if isinstance(v, K.ScalarValue) else v
        m = self._mem(ctx, s.out)
        val = _round_array(s.out.dtype, val)
        if m.kind == "global":
            m.vals[:] = val
            if m.written is not None:
                m.written[:] = True
            return
        rows = ctx.tids if m.kind == "local" else np.unique(ctx.blk)
        m.vals.reshape(-1, m.row)[rows] = val
        m.written.reshape(-1, m.row)[rows] = True

    def _TensorOp(self, s: K.TensorOp, ctx: _Ctx):
        pred = ctx.ev(s.predicate)
        if type(pred) is _ND:
            if not pred.all():
                ctx = ctx.subset(pred)
                if not ctx.n:
                    return
        elif not pred:
            return
        e = s.expr
        if s.vector > 1 and isinstance(e, WindowOp):
            self._window(ctx, s, s.vector)
            return
        if s.vector > 1 and isinstance(e, GatherOp):
            self._gather(ctx, s, s.vector)
            return
        if s.vector > 1 and isinstance(e, RandOp):
            self._write(ctx, s.out, self._random(ctx, s, s.vector), None, s.vector)
            return
        if s.vector > 1:
            if not isinstance(e, LoadStoreOp):
                raise InterpreterError(f"vector op {type(e).__name__} is not a copy")
            vals, poison = self._read(ctx, s.ins[0], s.vector)
            self._write(ctx, s.out, vals, poison, s.vector, exact=self._exact_copy(s))
            return
        if isinstance(e, IotaOp):
            self._write(ctx, s.out, self._iota(ctx, s), None)
            return
        if isinstance(e, WindowOp):
            self._window(ctx, s)
            return
        if isinstance(e, GatherOp):
            self._gather(ctx, s)
            return
        if isinstance(e, IndexCheckOp):
            self._check_index(ctx, s)
            return
        if isinstance(e, ScatterOp):
            self._scatter(ctx, s)
            return
        if isinstance(e, RandOp):
            self._write(ctx, s.out, self._random(ctx, s), None)
            return
        if s.carry is not None:
            self._scan(ctx, s)
            return
        ins = [self._read(ctx, x) for x in s.ins]
        if s.accumulate:
            acc, acc_poison = self._read(ctx, s.out)
            bad = _or_masks(acc_poison, ins[0][1])
            if bad is not None:
                i = int(np.argmax(bad))
                raise InterpreterError(f"{s.out!r} accumulates a value computed from unwritten "
                                       f"registers at {self._where(ctx, i)}")
            value, poison = _REDUCE[e.op.value](acc, ins[0][0]), None
        else:
            poison = None
            for _, p in ins:
                poison = _or_masks(poison, p)
            value = self._compute(e, [v for v, _ in ins])
            if s.quotient_flag is not None:
                ok = self._quotient_flags[s.quotient_flag]
                ok[ctx.tids] &= ctx.arr(_shared_divisor_check(ins[0][0], ins[1][0]), bool)
        self._write(ctx, s.out, value, poison, exact=self._exact_copy(s))

    def _LseFoldLanes(self, s: K.LseFoldLanes, ctx: _Ctx) -> None:
        """The running key combined with a vector's lanes at once (lower/lse_lanes.py;
        lse_key.fold_lanes, the device's lse_fold_lanes with exact exps)."""
        acc, acc_poison = self._read(ctx, s.acc)
        lanes = [self._read(ctx, x) for x in s.lanes]
        bad = acc_poison
        for _, p in lanes:
            bad = _or_masks(bad, p)
        if bad is not None:
            i = int(np.argmax(bad))
            raise InterpreterError(f"{s.out!r} folds lanes computed from unwritten registers "
                                   f"at {self._where(ctx, i)}")
        values = np.stack([np.broadcast_to(np.asarray(v, dtype=np.float32), np.shape(acc))
                           for v, _ in lanes], axis=-1)
        key = lse_key.fold_lanes(torch.as_tensor(np.asarray(acc, dtype=np.int64)),
                                 torch.from_numpy(np.ascontiguousarray(values))).numpy()
        self._write(ctx, s.out, key.item() if np.ndim(acc) == 0 else key, None)

    def _scan(self, ctx: _Ctx, s: K.TensorOp) -> None:
        """A scan step (`carry = op(carry, in); out = carry`) or its fixup (`out = op(carry,
        in)`): lower/scans.py. The carry is rounded to its dtype at each step, as on the GPU."""
        combine = _SCAN[s.expr.op]
        carry, carry_poison = self._read(ctx, s.carry)
        val, poison = self._read(ctx, s.ins[0])
        if s.scan_fixup:
            self._write(ctx, s.out, combine(carry, val), _or_masks(carry_poison, poison))
            return
        bad = _or_masks(carry_poison, poison)
        if bad is not None:
            i = int(np.argmax(bad))
            raise InterpreterError(f"scan carry {s.carry!r} takes a value computed from "
                                   f"unwritten registers at {self._where(ctx, i)}")
        self._write(ctx, s.carry, combine(carry, val), None)
        carry, _ = self._read(ctx, s.carry)
        self._write(ctx, s.out, np.array(carry, copy=True), None, exact=True)

    def _window(self, ctx: _Ctx, s: K.TensorOp, lanes: int = 1) -> None:
        """A window's read (of `lanes` elements) where its condition holds, its fill where not
        (no read there: the index may be outside the source)."""
        src, cond, fill = s.ins
        ok = ctx.ev(cond)
        if type(ok) is not _ND:
            ok = np.full(ctx.n, bool(ok))
        fill = self._scalar(fill.scalar)
        if ok.any():
            inside = ctx.subset(ok)
            vals, poison = self._read(inside, src, lanes)
            self._write(inside, s.out, vals, poison, lanes, exact=True)
        if not ok.all():
            n = int((~ok).sum())
            self._write(ctx.subset(~ok), s.out,
                        np.full(n if lanes == 1 else (n, lanes), fill), None, lanes)

    def _gather(self, ctx: _Ctx, s: K.TensorOp, lanes: int = 1) -> None:
        """A gather's read (lower/index._gather_read) as the generated code does it: the source
        at index * stride where 0 <= index < extent (`lanes` elements from there); 0 and a
        report in the index record where not (the first failing thread, in launch order,
        claims it)."""
        src, index, stride, extent, record, _, check = s.ins       # no host to report to
        idx, ok = self._checked_index(ctx, s, index, extent, record, check)
        if ok.any():
            inside = ctx.subset(ok)
            inside.env[K.GATHER_INDEX] = idx[ok]
            vals, poison = self._read(inside, K.gathered_at(src, stride), lanes)
            self._write(inside, s.out, vals, poison, lanes, exact=True)
        if not ok.all():
            n = int((~ok).sum())
            self._write(ctx.subset(~ok), s.out,
                        np.zeros(n if lanes == 1 else (n, lanes)), None, lanes)

    def _checked_index(self, ctx: _Ctx, s: K.TensorOp, index, extent, record, check):
        """(each thread's index as int64, whether it is in [0, extent)), the first failing
        thread (in launch order) reporting its value in the index record, as
        pf::report_index_error does."""
        idx, poison = self._read(ctx, index)
        if poison is not None and poison.any():
            i = int(np.argmax(poison))
            raise InterpreterError(f"{s.out!r}: the index {index!r} is read from unwritten "
                                   f"registers at {self._where(ctx, i)}")
        idx = ctx.arr(idx).astype(np.int64)
        ok = (idx >= 0) & (idx < int(ctx.ev(extent)))
        if not ok.all():
            rec = self._mems_record(record)
            if rec[0] == 0:
                rec[0], rec[1] = int(ctx.ev(check)) + 1, int(idx[~ok][0])
        return idx, ok

    def _check_index(self, ctx: _Ctx, s: K.TensorOp) -> None:
        """An index check (lower/index.py): out = index, an index outside [0, extent) reported
        in the index record."""
        index, extent, record, _, check = s.ins
        idx, _ = self._checked_index(ctx, s, index, extent, record, check)
        self._write(ctx, s.out, idx, None, exact=True)

    def _scatter(self, ctx: _Ctx, s: K.TensorOp) -> None:
        """A scatter's atomic add (lower/index._scatter_write): the value added into out at
        index * stride where 0 <= index < extent, a report in the index record where not. The
        adds land one after another in launch order, each rounded to out's dtype as a GPU's
        atomic add rounds it (float sums on a GPU come in any order). They are counted as no
        write: the executor zeroes the output before the launch (`zeroed_outputs`)."""
        src, index, stride, extent, record, _, check = s.ins
        idx, ok = self._checked_index(ctx, s, index, extent, record, check)
        if not ok.any():
            return
        inside = ctx.subset(ok)
        inside.env[K.GATHER_INDEX] = idx[ok]
        vals, poison = self._read(inside, src)
        if poison is not None and poison.any():
            i = int(np.argmax(poison))
            raise InterpreterError(f"{s.out!r}: adds a value computed from unwritten registers "
                                   f"at {self._where(inside, i)}")
        m, addr = self._locate(inside, K.gathered_at(s.out, stride), "atomic add to", 1)
        if m.kind != "global":
            raise InterpreterError(f"{s.out!r}: an atomic add to {m.kind} memory")
        vals = np.broadcast_to(np.asarray(vals), addr.shape)
        dt = m.buf.dtype
        if dt.is_floating:
            # float32 (float64) adds in order, each rounded, as the GPU's red.add rounds.
            acc = m.vals.astype(np.float32 if dt.size == 4 else np.float64)
            np.add.at(acc, addr, vals.astype(acc.dtype))
            m.vals[:] = acc
        else:
            acc = m.vals.astype(np.int64)
            np.add.at(acc, addr, vals.astype(np.int64))
            m.vals[:] = _round_array(dt, acc)

    def _random(self, ctx: _Ctx, s: K.TensorOp, lanes: int = 1):
        """The op's stream (runtime/philox.py) at each thread's row-major index (ins: seed,
        offset, the two parameters, the index expression; with `lanes`, that many consecutive
        indices from it), rounded to out's dtype."""
        from .philox import draw
        e = s.expr
        seed, offset, a, b = (self._scalar(x.scalar) for x in s.ins[:4])
        index = np.asarray(ctx.arr(ctx.ev(s.ins[4])), dtype=np.int64)
        if lanes > 1:
            index = index[:, None] + np.arange(lanes)
        dt = e.outputs[0].dtype
        values = draw(e.dist, dt.value[0], index, int(seed), int(offset), e.stream, float(a),
                      float(b))
        return _round_array(dt, values)

    def _mems_record(self, record: K.TensorIndex) -> np.ndarray:
        m = self.mems.get(id(record.buffer))
        if m is None:
            raise InterpreterError(f"{record!r}: no index record among the kernel's workspaces")
        return m.vals

    def _iota(self, ctx: _Ctx, s: K.TensorOp):
        """start + index * step for every thread (ins: start, step, the index expression), in
        float64 or int64, then rounded to the compute type the generated code uses."""
        dt = s.expr.outputs[0].dtype
        wide = np.float64 if dt.is_floating else np.int64
        start, step = (wide(self._scalar(x.scalar)) for x in s.ins[:2])
        index = np.asarray(ctx.ev(s.ins[2]), dtype=wide)
        return _converted(compute_type(dt), index * step + start)

    @staticmethod
    def _exact_copy(s: K.TensorOp) -> bool:
        """A copy between buffers of one dtype: its values need no rounding."""
        e, src = s.expr, s.ins[0] if s.ins else None
        return (not s.accumulate and isinstance(src, K.TensorIndex)
                and src.buffer.dtype == s.out.buffer.dtype
                and (isinstance(e, _COPIES) or (isinstance(e, UnaryOp) and
                                                e.op in (UnaryOpType.Set, UnaryOpType.Cast))))

    def _compute(self, e, ins):
        if isinstance(e, BinaryOp):
            return _binary(e, ins[0], ins[1])
        if isinstance(e, UnaryOp):
            return _UNARY[e.op](ins[0])
        if isinstance(e, WhereOp):
            return np.where(ins[0], ins[1], ins[2])
        if isinstance(e, _COPIES):
            return ins[0]
        if isinstance(e, (MatmulOp, LinearOp)):
            # A matmul's element in a fused epilogue (lower/matmul.py): the fp32 accumulator
            # (plus a linear's bias), rounded to the op's dtype where it is stored.
            return ins[0] if len(ins) == 1 else ins[0] + ins[1]
        raise InterpreterError(f"no rule for {type(e).__name__}")

    # Barriers and reductions -----------------------------------------------------------------
    def _block_tuple(self, b: int) -> tuple:
        gx, gy, _ = self.grid
        return (b % gx, (b // gx) % gy, b // (gx * gy))

    def _check_whole_grid(self, s, ctx: _Ctx):
        if getattr(s, "barrier", None) is not None:
            # A named barrier's threads in every block (a warp-specialized kernel's compute
            # warp groups): each block sends exactly those.
            self._check_whole_blocks(s, ctx)
            reached = len(np.unique(ctx.blk))
            if reached != self.nblocks:
                raise InterpreterError(f"{type(s).__name__} reached by {reached} of "
                                       f"{self.nblocks} blocks")
            return
        if ctx.n != self.nthreads:
            raise InterpreterError(f"{type(s).__name__} reached by {ctx.n} of "
                                   f"{self.nthreads} threads")

    def _check_whole_blocks(self, s, ctx: _Ctx):
        """Every thread of each block that reaches a block-wide step reaches it (blocks of a
        persistent grid may run different numbers of iterations); with a named barrier, its
        thread count."""
        per_block = self.tpb
        if getattr(s, "barrier", None) is not None:
            per_block = s.barrier[1]
        count = np.bincount(ctx.blk, minlength=self.nblocks)
        bad = (count != 0) & (count != per_block)
        if bad.any():
            b = int(np.argmax(bad))
            raise InterpreterError(f"{type(s).__name__} reached by {count[b]} of {per_block} "
                                   f"threads of block {self._block_tuple(b)}")

    def _GridSync(self, s, ctx):
        self._check_whole_grid(s, ctx)     # lockstep: every block is already here

    def _named_barrier(self, s, ctx: _Ctx, wait: bool) -> None:
        """bar.sync (wait) or bar.arrive of the threads of `ctx` on named barrier s.barrier_id
        of their blocks, among warp roles: a phase completes when its count of threads arrived;
        bar.sync waits for that and then sees what the arrivals before it did."""
        per_block = ctx.ev(s.count)
        per_block = int(per_block[0]) if type(per_block) is _ND else int(per_block)
        nb = self.named_barriers.get(s.barrier_id)
        if nb is None:
            nb = self.named_barriers[s.barrier_id] = _NamedBarrier(self.nblocks)
        counts = np.bincount(ctx.blk, minlength=self.nblocks)
        blocks = np.flatnonzero(counts)
        nb.arrived[blocks] += counts[blocks]
        nb.moments[blocks, self._group()] = self._now()
        over = nb.arrived[blocks] > per_block
        if over.any():
            b = int(blocks[np.argmax(over)])
            raise InterpreterError(f"named barrier {s.barrier_id} reached by {nb.arrived[b]} "
                                   f"threads of block {self._block_tuple(b)}, more than its "
                                   f"count {per_block}")
        target = nb.completed[blocks] + 1
        done = nb.arrived[blocks] == per_block
        if done.any():
            nb.completed[blocks[done]] += 1
            nb.arrived[blocks[done]] = 0
            self._roles.version += 1
        if not wait:
            return

        def what():
            b = int(blocks[np.argmax(nb.completed[blocks] < target)])
            return (f"named barrier {s.barrier_id} of block {self._block_tuple(b)} waits for "
                    f"{per_block} threads, {nb.arrived[b]} arrived, and no role can move")
        self._wait_until(lambda: bool(np.all(nb.completed[blocks] >= target)), what)
        self._see(ctx.tids, nb.moments[ctx.blk])

    def _NamedBarrierArrive(self, s, ctx: _Ctx):
        if self._roles is None:
            raise InterpreterError(f"bar.arrive on named barrier {s.barrier_id} outside warp "
                                   "roles: no other threads could complete it")
        self._named_barrier(s, ctx, wait=False)

    def _BlockSync(self, s, ctx: _Ctx):
        if s.barrier_id is not None and self._roles is not None:
            self._named_barrier(s, ctx, wait=True)
            self._publish_cp_async(ctx)
            return
        # __syncthreads waits for every thread of the block, a named barrier for its count:
        # reached by fewer, it hangs.
        per_block = self.tpb if s.count is None else ctx.ev(s.count)
        if type(per_block) is _ND:
            per_block = int(per_block[0])
        count = np.bincount(ctx.blk, minlength=self.nblocks)
        bad = (count != 0) & (count != per_block)
        if bad.any():
            b = int(np.argmax(bad))
            what = "__syncthreads" if s.barrier_id is None else f"named barrier {s.barrier_id}"
            raise InterpreterError(f"{what} reached by {count[b]} of {per_block} threads of "
                                   f"block {self._block_tuple(b)}")
        # The threads see each other's work before the barrier (one group: the block's).
        if self.seen is not None:
            self.seen[ctx.tids, self._group()] = self._now()
        self._publish_cp_async(ctx)

    def _publish_cp_async(self, ctx: _Ctx) -> None:
        # A barrier publishes the cp.async data its threads' waits completed to the block.
        # (Block reductions are not counted: some synchronize with shuffles only.)
        if not self.cp_kernel:
            return
        blocks = np.unique(ctx.blk)
        for m in self.mems.values():
            if m.owner is None:
                continue
            for table in (m.owner, m.reader):
                rows = table.reshape(self.nblocks, m.row)
                if len(blocks) == self.nblocks:
                    rows[:] = -1
                else:
                    rows[blocks] = -1

    def _thread_dim(self, ctx: _Ctx, d: str) -> np.ndarray:
        return ctx.arr(ctx.env[f"threadIdx.{d}"], np.int64)

    def _block_dim(self, ctx: _Ctx, d: str) -> np.ndarray:
        return ctx.arr(ctx.env[f"blockIdx.{d}"], np.int64)

    @staticmethod
    def _segments(key: np.ndarray):
        """(order, starts) grouping equal keys, each group in thread order."""
        if len(key) > 1 and not (key[1:] >= key[:-1]).all():
            order = np.argsort(key, kind="stable")
        else:
            order = None
        k = key if order is None else key[order]
        starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
        return order, starts

    def _reduce_groups(self, op, vals, poison, key):
        """Reduce `vals` ([threads] or [threads, lanes]) over threads of equal `key`, in thread
        order: (values per group, poison per group or None, order, starts)."""
        order, starts = self._segments(key)
        v = vals if order is None else vals[order]
        v = _as_number(v) if op == "sum" else v
        res = _REDUCEAT[op](v, starts, axis=0)
        pres = None
        if poison is not None:
            p = poison if order is None else poison[order]
            pres = np.logical_or.reduceat(p, starts, axis=0)
        return res, pres, order, starts

    def _BlockReduce(self, s: K.BlockReduce, ctx: _Ctx):
        self._check_whole_blocks(s, ctx)
        dims = set(s.dims)
        key = ctx.blk.copy()
        for d, ext in zip("xyz", self.block):
            if d not in dims:
                key = key * ext + self._thread_dim(ctx, d)
        for ti in s.values:
            lanes = max(ti.vector, 1)
            vals, poison = self._read(ctx, ti, lanes)
            res, pres, order, starts = self._reduce_groups(s.op, vals, poison, key)
            group = np.zeros(ctx.n, dtype=np.int64)
            group[starts[1:]] = 1
            group = np.cumsum(group)
            if order is not None:
                g = np.empty_like(group)
                g[order] = group
                group = g
            m, addr = self._locate(ctx, ti, "block reduction of", lanes)
            if lanes > 1:
                addr = addr[:, None] + _lanes(lanes)
            self._store(m, addr, res[group], None if pres is None else pres[group])

    def _BlockScan(self, s: K.BlockScan, ctx: _Ctx):
        """block_exclusive_scan_x: each thread's carry becomes op of the carries of the threads
        of its row (same block, y and z) with a lower threadIdx.x, in x order; with a cluster,
        op of the row totals of the lower-ranked CTAs in front (cluster_exclusive_scan_row);
        chained, of the blocks before along blockIdx.y (chained_exclusive_scan_row).
        Every thread of the block (and of the cluster; chained, of the grid) must arrive."""
        self._check_whole_blocks(s, ctx)
        if self.block[0] % 32:
            raise InterpreterError(f"block scan over a block x of {self.block[0]} threads (a "
                                   "multiple of 32 is needed)")
        vals, poison = self._read(ctx, s.carry)
        if poison is not None and np.asarray(poison).any():
            i = int(np.argmax(poison))
            raise InterpreterError(f"block scan of {s.carry!r}, computed from unwritten "
                                   f"registers at {self._where(ctx, i)}")
        vals = np.array(vals, copy=True)
        tx = self._thread_dim(ctx, "x")
        key = ctx.blk.copy()
        for d, ext in zip("yz", self.block[1:]):
            key = key * ext + self._thread_dim(ctx, d)
        rows, row = np.unique(key, return_inverse=True)
        ident = _SCAN_IDENTITY[s.op]
        table = np.full((len(rows), self.block[0]), ident, dtype=vals.dtype)
        table[row, tx] = vals
        excl, totals = _exclusive_scan(s.op, table)
        res = excl[row, tx]
        if s.cluster is not None:
            res = _SCAN[s.op](self._cluster_prefix(s, ctx, totals[row]), res)
        elif s.chain is not None:
            res = _SCAN[s.op](self._chain_prefix(s, ctx, totals[row]), res)
        m, addr = self._locate(ctx, s.carry, "block scan of", 1)
        self._store(m, addr, res, None)

    def _BlockTopK(self, s: K.BlockTopK, ctx: _Ctx):
        """block_topk_x: of each row of the block (same y and z), the k largest (smallest)
        valid elements of its threads' chunks (thread x's register e is row element
        x * chunk_size + e, valid below the extent) in order, equal values by index, NaN above
        every number (arg_key.topk_in_order's order); result j to register j / stride of
        thread j % stride. A row whose valid elements are all unwritten (a row past the
        tensor's end, whose loads were predicated off) gets unwritten results; one partly
        unwritten is an error. Stride 0: every thread gets every result. Every thread of the
        block must arrive."""
        self._check_whole_blocks(s, ctx)
        if self.block[0] % 32:
            raise InterpreterError(f"block top-k over a block x of {self.block[0]} threads (a "
                                   "multiple of 32 is needed)")
        c = s.chunk_size
        vals, poison = self._read(ctx, K.TensorIndex(s.chunk, K.Const(0)), c, "block top-k of")
        vals = np.asarray(vals).reshape(ctx.n, c)
        n = int(ctx.ev(s.extent))
        tx = self._thread_dim(ctx, "x")
        pos = tx[:, None] * c + np.arange(c)
        valid = pos < n
        key = ctx.blk.copy()
        for d, ext in zip("yz", self.block[1:]):
            key = key * ext + self._thread_dim(ctx, d)
        rows, row = np.unique(key, return_inverse=True)
        unwritten = np.zeros((ctx.n, c), dtype=bool) if poison is None else \
            np.asarray(poison).reshape(ctx.n, c)
        bad = unwritten & valid
        row_unwritten = np.ones(len(rows), dtype=bool)
        np.logical_and.at(row_unwritten, row, ~(valid & ~unwritten).any(axis=1))
        partly = bad.any(axis=1) & ~row_unwritten[row]
        if partly.any():
            i = int(np.argmax(partly))
            raise InterpreterError(f"block top-k of {s.chunk.name}, computed from unwritten "
                                   f"registers at {self._where(ctx, i)}")
        floating = s.chunk.dtype.is_floating
        width = self.block[0] * c
        # Elements past the row: below every value (largest), or NaN after every value in a
        # stable ascending sort (smallest); their positions come after every valid one.
        fill = (-math.inf if s.largest else math.nan) if floating else \
            (-2 ** 62 if s.largest else 2 ** 62)
        table = np.full((len(rows), width), fill, dtype=np.float64 if floating else np.int64)
        ok = valid & ~unwritten
        table[row[:, None].repeat(c, 1)[ok], pos[ok]] = vals[ok]
        top_v, top_i = (t.numpy() for t in topk_in_order(torch.from_numpy(table), s.k, 1,
                                                           s.largest))
        if floating:     # the kernel decodes values from their keys: NaN as the canonical NaN
            top_v = np.where(np.isnan(top_v), np.nan, top_v)
        for q in range(s.values.size.value):
            j = q * s.stride + tx if s.stride else np.full_like(tx, q)
            has = ((tx < s.stride) if s.stride else True) & (j < s.k) & ~row_unwritten[row]
            jj = np.minimum(j, s.k - 1)
            for buf, res in ((s.values, top_v), (s.indices, top_i)):
                self._write(ctx, K.TensorIndex(buf, K.Const(q)), res[row, jj], ~has,
                            what="block top-k result write of")

    def _chain_prefix(self, s: K.BlockScan, ctx: _Ctx, totals):
        """Per thread: op of its row's totals in the blocks before its own along blockIdx.y
        (same blockIdx.x and z, same threadIdx.y and z), in y order. Every block of the grid
        must arrive (on a GPU a block whose predecessor never publishes waits forever)."""
        self._check_whole_grid(s, ctx)
        bx, by, bz = (self._block_dim(ctx, d) for d in "xyz")
        gy = self.grid[1]
        row = (bz * self.grid[0] + bx) * self.block[1] * self.block[2] + (
            self._thread_dim(ctx, "z") * self.block[1] + self._thread_dim(ctx, "y"))
        nrows = self.grid[0] * self.grid[2] * self.block[1] * self.block[2]
        table = np.full((nrows, gy), _SCAN_IDENTITY[s.op], dtype=totals.dtype)
        table[row, by] = totals
        return _exclusive_scan(s.op, table)[0][row, by]

    def _cluster_prefix(self, s: K.BlockScan, ctx: _Ctx, totals):
        """Per thread: op of its row's totals in the CTAs of its cluster of lower rank."""
        dim, size = s.cluster
        dims = self.k.launch.cluster
        if dims is None or dims["xyz".index(dim)] != size or self.block[2] != 1:
            raise InterpreterError(f"cluster scan over {size} CTAs along {dim} in a launch "
                                   f"with cluster {dims} and block {self.block}")
        per_cluster = dims[0] * dims[1] * dims[2]
        bx, by, bz = (self._block_dim(ctx, d) for d in "xyz")
        ncl = [-(-g // c) for g, c in zip(self.grid, dims)]
        cluster = (bx // dims[0]) + ncl[0] * ((by // dims[1]) + ncl[1] * (bz // dims[2]))
        rank = (bx % dims[0]) + dims[0] * ((by % dims[1]) + dims[1] * (bz % dims[2]))
        reached = np.zeros((ncl[0] * ncl[1] * ncl[2], per_cluster), dtype=bool)
        reached[cluster, rank] = True
        counts = reached[np.unique(cluster)].sum(axis=1)
        if (counts != per_cluster).any():
            raise InterpreterError(f"cluster scan reached by {counts.min()} of {per_cluster} "
                                   "CTAs of a cluster")
        row = cluster * self.block[1] + self._thread_dim(ctx, "y")
        ident = _SCAN_IDENTITY[s.op]
        table = np.full((len(reached) * self.block[1], per_cluster), ident, dtype=totals.dtype)
        table[row, rank] = totals
        return _exclusive_scan(s.op, table)[0][row, rank]

    def _ClusterReduce(self, s: K.ClusterReduce, ctx: _Ctx):
        """cluster_allreduce_row: thread x == 0 of each row of every CTA of a cluster publishes
        its value; every thread of the row gets the values reduced in rank order. Every thread
        of every CTA of the cluster must arrive (the cluster barrier inside)."""
        self._check_whole_blocks(s, ctx)
        dims = self.k.launch.cluster
        if dims is None or dims["xyz".index(s.dim)] != s.size or self.block[2] != 1:
            raise InterpreterError(f"cluster reduction over {s.size} CTAs along {s.dim} in a "
                                   f"launch with cluster {dims} and block {self.block}")
        per_cluster = dims[0] * dims[1] * dims[2]
        bx, by, bz = (self._block_dim(ctx, d) for d in "xyz")
        ncl = [-(-g // c) for g, c in zip(self.grid, dims)]
        cluster = (bx // dims[0]) + ncl[0] * ((by // dims[1]) + ncl[1] * (bz // dims[2]))
        rank = (bx % dims[0]) + dims[0] * ((by % dims[1]) + dims[1] * (bz % dims[2]))
        members = np.zeros((ncl[0] * ncl[1] * ncl[2], per_cluster), dtype=bool)
        members[cluster, rank] = True
        reached = np.unique(cluster)
        counts = members[reached].sum(axis=1)
        if (counts != per_cluster).any():
            j = int(np.argmax(counts != per_cluster))
            c = int(reached[j])
            where = (c % ncl[0], (c // ncl[0]) % ncl[1], c // (ncl[0] * ncl[1]))
            raise InterpreterError(f"cluster reduction reached by {counts[j]} of "
                                   f"{per_cluster} CTAs of cluster {where}")
        ti = s.values[0]
        ty = self._thread_dim(ctx, "y")
        row = cluster * self.block[1] + ty
        pub = self._thread_dim(ctx, "x") == 0
        pctx = ctx.subset(pub)
        vals, poison = self._read(pctx, ti)
        nrows = len(members) * self.block[1]
        table = np.zeros((nrows, per_cluster), dtype=np.asarray(vals).dtype)
        ptable = np.zeros((nrows, per_cluster), dtype=bool)
        table[row[pub], rank[pub]] = vals
        if poison is not None:
            ptable[row[pub], rank[pub]] = poison
        op = _REDUCE[s.op]
        res = table[:, 0]
        for r in range(1, per_cluster):
            res = op(res, table[:, r])
        pres = ptable.any(axis=1)
        m, addr = self._locate(ctx, ti, "cluster reduction of", 1)
        self._store(m, addr, res[row], pres[row] if pres.any() else None)

    def _GridReduce(self, s: K.GridReduce, ctx: _Ctx):
        self._check_whole_grid(s, ctx)
        red_t = set(s.thread_dims)
        red_b = set(s.dims)
        writer = np.ones(ctx.n, dtype=bool)
        for d in red_t:
            writer &= self._thread_dim(ctx, d) == 0
        # Group: kept block coords, then kept thread coords; within a group, the reduced block
        # coords in order (z-major).
        key = np.zeros(ctx.n, dtype=np.int64)
        for d, ext in zip("xyz", self.grid):
            if d not in red_b:
                key = key * ext + self._block_dim(ctx, d)
        kept_block = key
        for d, ext in zip("xyz", self.block):
            if d not in red_t:
                key = key * ext + self._thread_dim(ctx, d)
        red_index = np.zeros(ctx.n, dtype=np.int64)
        for d in sorted(red_b, reverse=True):
            red_index = red_index * self.grid["xyz".index(d)] + self._block_dim(ctx, d)
        w = np.flatnonzero(writer)
        wctx = ctx.take(w)
        nred = 1
        for d in red_b:
            nred *= self.grid["xyz".index(d)]
        nrt = 1                 # threads sharing one slot: the reduced thread dims
        for d in red_t:
            nrt *= self.block["xyz".index(d)]
        nkept = int(kept_block.max()) + 1 if ctx.n else 0
        top = np.full(nkept, -1, dtype=np.int64)
        np.maximum.at(top, kept_block[w], red_index[w])
        # The block that arrives last: any of the group's, as on a GPU. A different one for each
        # grid reduction of the launch (the last block first, then the one before it, ...), so
        # that code relying on one block being last for two of them fails here too.
        k = self.grid_reductions_run
        self.grid_reductions_run += 1
        is_last = red_index == (top[kept_block] - k) % (top[kept_block] + 1)
        if s.follows_last_block:
            # The block that was last for the first grid reduction over these dims.
            is_last = np.broadcast_to(np.asarray(ctx.env["pf_grid_last"], dtype=bool), (ctx.n,))
        # The partials of one slot (kept block and thread coords) as a [slots, nred] table.
        order = np.argsort(key[w] * nred + red_index[w], kind="stable")
        slot_keys = key[w][order][::nred]
        if len(order) != len(slot_keys) * nred:
            raise InterpreterError(f"grid reduction: {len(order)} partials for "
                                   f"{len(slot_keys)} slots of {nred} blocks")
        lctx = ctx.subset(is_last)
        slot_of = np.searchsorted(slot_keys, key[is_last])
        op = _REDUCE[s.op]
        for ti in s.values:
            lanes = max(ti.vector, 1)
            vals, poison = self._read(wctx, ti, lanes)
            v = vals[order]
            v = (_as_number(v) if s.op == "sum" else v).reshape(
                (len(slot_keys), nred) + v.shape[1:])
            # As the last block's threads combine them (codegen/cuda.py _GridReduce): thread j
            # of a slot the partials j, j + nrt, ... in block order, then the threads' values
            # in thread order (the interpreter's block reduction).
            res = None
            for j in range(min(nrt, nred)):
                part = v[:, j]
                for r in range(j + nrt, nred, nrt):
                    part = op(part, v[:, r])
                res = part if res is None else op(res, part)
            pres = None
            if poison is not None:
                pres = poison[order].reshape((len(slot_keys), nred) + poison.shape[1:]).any(axis=1)
            m, addr = self._locate(lctx, ti, "grid reduction of", lanes)
            if lanes > 1:
                addr = addr[:, None] + _lanes(lanes)
            self._store(m, addr, res[slot_of], None if pres is None else pres[slot_of])
        # pf_grid_last: this block is the last of its kept coordinates' blocks.
        self._set_kernel_var(ctx, "pf_grid_last", is_last)

    def _set_kernel_var(self, ctx: _Ctx, name: str, values) -> None:
        """Set a kernel-scope variable (declared at the top of the kernel) for ctx's threads:
        in the whole grid's variables, and forgotten by the scopes in between."""
        root = self.root.env
        full = root[name]
        if type(full) is not _ND:
            full = np.full(self.nthreads, full, dtype=np.asarray(values).dtype)
            root[name] = full
        full[ctx.tids] = values
        e = ctx.env
        while e is not root and isinstance(e, _Env):
            e.pop(name, None)
            e = e.parent

    # mbarriers and bulk copies (lockstep model: a copy lands when it is issued) --------------
    def _cluster_x(self, what: str) -> int:
        """The CTAs of the launch's thread-block cluster, which must span blockIdx.x alone."""
        dims = self.k.launch.cluster
        if not dims or dims[1] != 1 or dims[2] != 1 or self.grid[0] % dims[0]:
            raise InterpreterError(f"{what} in a launch of grid {self.grid} with clusters "
                                   f"{dims} (modelled: clusters along x that tile the grid)")
        return dims[0]

    def _cluster_block(self, blk, rank, what: str):
        """The linear block index of CTA `rank` of the cluster of each block in `blk`."""
        size = self._cluster_x(what)
        bad = (rank < 0) | (rank >= size)
        if (bad.any() if type(bad) is _ND else bad):
            raise InterpreterError(f"{what}: CTA rank outside the cluster of {size}")
        return blk - (blk % self.grid[0]) % size + rank

    def _mbar(self, ctx: _Ctx, ref: K.MBarrierRef, blk=None):
        """(the barriers, flat index of each thread's barrier), checked; `blk`: the block of
        each thread's barrier (its own by default; a peer of its cluster)."""
        bars = self.mbarriers.get(ref.bars)
        blk = ctx.blk if blk is None else blk
        if bars is None or not bars.allocated[blk].all():
            raise InterpreterError(f"mbarrier {ref!r} used before its allocation")
        k = ctx.ev(ref.index)
        bad = (k < 0) | (k >= bars.count)
        if (bad.any() if type(bad) is _ND else bad):
            i = int(np.argmax(bad)) if type(bad) is _ND else 0
            kk = _py(k[i] if type(k) is _ND else k)
            raise InterpreterError(f"mbarrier index {kk} outside [0, {bars.count}) of "
                                   f"{ref.bars.name}")
        flat = blk * bars.count + k
        live = bars.state[flat] == 1
        if not live.all():
            i = int(np.argmin(live))
            kk = _py(k[i] if type(k) is _ND else k)
            raise InterpreterError(f"mbarrier {ref.bars.name}[{kk}] used while not initialized "
                                   f"at {self._where(ctx, i)}")
        return bars, flat

    def _complete(self, bars: _Bars, b: int) -> None:
        if bars.arrived[b] == bars.arrivals[b] and bars.tx[b] == 0:
            bars.phase[b] += 1
            bars.arrived[b] = 0
            if self._roles is not None:
                self._roles.version += 1

    def _MBarrierAlloc(self, s, ctx: _Ctx):
        bars = self.mbarriers.get(s.bars)
        if bars is None:
            bars = self.mbarriers[s.bars] = _Bars(self.nblocks, s.bars.count)
        bars.allocated[ctx.blk] = True

    def _MBarrierInit(self, s, ctx: _Ctx):
        bars = self.mbarriers.get(s.bar.bars)
        if bars is None or not bars.allocated[ctx.blk].all():
            raise InterpreterError(f"mbarrier {s.bar!r} initialized before its allocation")
        k = ctx.ev(s.bar.index)
        if ((k < 0) | (k >= bars.count)).any() if type(k) is _ND else not 0 <= k < bars.count:
            raise InterpreterError(f"mbarrier index {k} outside [0, {bars.count}) of "
                                   f"{s.bar.bars.name}")
        flat = ctx.blk * bars.count + k
        bars.arrivals[flat] = ctx.ev(s.arrivals)
        bars.arrived[flat] = 0
        bars.tx[flat] = 0
        bars.phase[flat] = 0
        bars.state[flat] = 1

    def _MBarrierArrive(self, s, ctx: _Ctx):
        peer = None
        if s.cta is not None:
            rank = ctx.ev(s.cta)
            peer = self._cluster_block(ctx.blk, rank, f"arrival on {s.bar!r} of a peer CTA")
        bars, flat = self._mbar(ctx, s.bar, peer)
        if type(flat) is not _ND:
            flat = np.full(ctx.n, flat, dtype=np.int64)
        bars.arrival_moments[flat, self._group()] = self._now()
        uniq, counts = np.unique(flat, return_counts=True)
        for b, c in zip(uniq.tolist(), counts.tolist()):
            # c arrivals one after another: each phase completes when its count is reached
            # with no transaction bytes pending.
            while c > 0:
                if bars.arrived[b] + 1 > bars.arrivals[b] or (
                        bars.tx[b] != 0 and bars.arrived[b] + c > bars.arrivals[b]):
                    raise InterpreterError(f"{s.bar!r}: more arrivals than its count "
                                           f"{bars.arrivals[b]}")
                if bars.tx[b] != 0:
                    bars.arrived[b] += c
                    break
                take = min(c, int(bars.arrivals[b] - bars.arrived[b]))
                bars.arrived[b] += take
                c -= take
                self._complete(bars, b)

    def _MBarrierWait(self, s, ctx: _Ctx):
        bars, flat = self._mbar(ctx, s.bar)
        parity = ctx.ev(s.parity)

        def ready():
            # The phase of parity P has completed when the completed count's parity differs.
            return bool(np.all(bars.phase[flat] % 2 != parity))
        # (what a completed phase makes visible: its arrivals' and copies' moments)

        def what():
            waiting = bars.phase[flat] % 2 == parity
            i = int(np.argmax(waiting))
            b = int(flat[i])
            p = _py(parity[i] if type(parity) is _ND else parity)
            return (f"wait on {s.bar!r} parity {p} would never return (phases completed: "
                    f"{bars.phase[b]}, arrivals {bars.arrived[b]}/{bars.arrivals[b]}, pending "
                    f"bytes {bars.tx[b]}) at {self._where(ctx, i)}")
        self._wait_until(ready, what)
        self._see(ctx.tids, bars.arrival_moments[flat])

    def _ClusterSync(self, s, ctx: _Ctx):
        """Every thread of every CTA of each cluster reached, or the barrier hangs; then each
        sees the others' work (as a block barrier, over the cluster)."""
        count = np.bincount(ctx.blk, minlength=self.nblocks)
        # Each block's cluster, by its first block: a cluster some of whose threads arrived
        # waits for all of its blocks.
        first = self._cluster_block(_lanes(self.nblocks), 0, "a cluster barrier")
        bad = ((count != 0) & (count != self.tpb)) | (
            np.isin(first, first[count != 0]) & (count == 0))
        if bad.any():
            b = int(np.argmax(bad))
            raise InterpreterError(f"cluster barrier reached by {count[b]} of {self.tpb} threads "
                                   f"of block {self._block_tuple(b)}")
        if self.seen is not None:
            self.seen[ctx.tids, self._group()] = self._now()
        self._publish_cp_async(ctx)

    def _MBarrierInval(self, s, ctx: _Ctx):
        bars, flat = self._mbar(ctx, s.bar)
        bars.state[flat] = 2

    def _issuers(self, s, ctx: _Ctx):
        pred = ctx.ev(s.predicate)
        if type(pred) is _ND:
            return ctx.subset(pred)
        return ctx if pred else ctx.take(np.zeros(0, dtype=np.int64))

    def _BulkLoad(self, s, ctx: _Ctx):
        ctx = self._issuers(s, ctx)
        if not ctx.n:
            return
        bars, flat = self._mbar(ctx, s.bar)
        nbytes = ctx.arr(ctx.ev(s.bytes), np.int64)
        size = s.dst.buffer.dtype.size
        bad = (nbytes % 16 != 0) | (nbytes % size != 0)
        if bad.any():
            raise InterpreterError(f"bulk copy of {int(nbytes[np.argmax(bad)])} bytes is not a "
                                   "multiple of 16")
        n = nbytes // size
        src, sa = self._locate(ctx, s.src, "bulk copy source", n, align=1)
        dst, da = self._locate(ctx, s.dst, "bulk copy destination", n, align=1)
        i, j = sa - ctx.base(src.kind, src.row), da - ctx.base(dst.kind, dst.row)
        bad = (((i + src.align0) * size) % 16 != 0) | (((j + dst.align0) * size) % 16 != 0)
        if bad.any():
            q = int(np.argmax(bad))
            raise InterpreterError(f"bulk copy {s.src!r} -> {s.dst!r}: element offsets {i[q]}, "
                                   f"{j[q]} are not 16-byte aligned")
        for q in range(ctx.n):
            b, cnt = int(flat[q]), int(n[q])
            bars.tx[b] += nbytes[q]
            a0, d0 = int(sa[q]), int(da[q])
            self._slot_copy(ctx, q, dst, d0, cnt, f"bulk copy {s.dst!r}")
            bars.arrival_moments[b, _COPIES_GROUP] = self.moment
            dst.vals[d0:d0 + cnt] = src.vals[a0:a0 + cnt]
            if dst.written is not None:
                dst.written[d0:d0 + cnt] = (True if src.written is None
                                            else src.written[a0:a0 + cnt])
            bars.tx[b] -= nbytes[q]
            self._complete(bars, b)

    @staticmethod
    def _tensor_map(x, row_map):
        """(map, rows, row stride) of a RowBoxMap over input `x`, refused as the executor's
        encoder would refuse it."""
        from .tensor_map import row_box_problems
        from ..schedule.tma_rules import merged_rows
        bad = row_box_problems(x, row_map)
        if bad:
            raise InterpreterError(f"tensor map {row_map} over {tuple(x.shape)}: {bad}")
        rows, row_stride = merged_rows(list(x.shape), list(x.stride()))
        return row_map, rows, row_stride

    def _TensorMapLoad(self, s, ctx: _Ctx):
        ctx = self._issuers(s, ctx)
        if not ctx.n:
            return
        if isinstance(s.map, K.TileBoxMap):
            self._tile_load(s, ctx)
            return
        if s.multicast != 1:
            raise InterpreterError(f"a multicast copy of a row box ({s.map}) is not modelled")
        entry = self.tensor_maps.get(s.tmap.name)
        if not isinstance(entry, tuple):
            raise InterpreterError(f"{s.tmap!r} describes {getattr(entry, 'map', entry)}, the "
                                   f"copy says {s.map}")
        row_map, rows, row_stride = entry
        if s.map != row_map or s.source.memory != "global":
            raise InterpreterError(f"{s.tmap!r} describes {row_map}, the copy says {s.map}")
        bars, flat = self._mbar(ctx, s.bar)
        inner, pieces, box_rows = row_map.box
        box = inner * pieces * box_rows
        size = s.dst.buffer.dtype.size
        nbytes = ctx.arr(ctx.ev(s.bytes), np.int64)
        wrong = nbytes != box * size
        if wrong.any():
            raise InterpreterError(f"tensor-map copy expects {int(nbytes[np.argmax(wrong)])} "
                                   f"bytes for a box of {box * size}")
        c0, c1, c2 = (ctx.arr(ctx.ev(c), np.int64) for c in s.coords)
        dst, da = self._locate(ctx, s.dst, "tensor-map destination", box, align=1)
        j = da - ctx.base(dst.kind, dst.row)
        if ((j * size) % 128 != 0).any():
            q = int(np.argmax((j * size) % 128 != 0))
            raise InterpreterError(f"tensor-map destination {s.dst!r} at element {j[q]} is not "
                                   "128-byte aligned")
        src = self.mems[id(s.source)]
        r = _lanes(box_rows)[:, None, None]
        b = _lanes(pieces)[None, :, None]
        a = _lanes(inner)[None, None, :]
        for q in range(ctx.n):
            bq = int(flat[q])
            bars.tx[bq] += nbytes[q]
            row, piece, col = c2[q] + r, c1[q] + b, c0[q] + a
            inside = (row < rows) & (piece < pieces) & (col < inner)
            off = np.where(inside, row * row_stride + piece * inner + col, 0)
            d0 = int(da[q])
            self._slot_copy(ctx, q, dst, d0, box, f"tensor-map copy {s.dst!r}")
            bars.arrival_moments[bq, _COPIES_GROUP] = self.moment
            dst.vals[d0:d0 + box] = np.where(inside, src.vals[off], 0).ravel()
            if dst.written is not None:
                ok = True if src.written is None else (src.written[off] | ~inside).ravel()
                dst.written[d0:d0 + box] = ok
            bars.tx[bq] -= nbytes[q]
            self._complete(bars, bq)

    # Tile tensor maps, wgmma, stmatrix (Hopper matmuls) ---------------------------------------
    def _tile_map(self, tile: K.TileBoxMap, inputs, input_mems, out_mem) -> "_TileView":
        """The view of a TileBoxMap over its tensor of this launch, refused as the executor's
        executor would refuse it (runtime/tensor_map.tile_box_problems; an output: the rules
        its allocation keeps, tensor_map.tile_layout_problems) and where the node's
        model does not hold (the inner dim not of stride 1, other dims not of size 1, a
        128-byte swizzle over rows of other than 128 bytes)."""
        fusion = self.k.fusion
        if tile.role == "input":
            x = inputs[tile.index] if 0 <= tile.index < len(inputs) else None
            if not isinstance(x, torch.Tensor) or tile.index not in input_mems:
                raise InterpreterError(f"tensor map {tile}: input {tile.index} is not a tensor "
                                       "with a pointer parameter")
            sizes, strides = list(x.shape), list(x.stride())
            ptr, eb, dtype = x.data_ptr(), x.element_size(), fusion.inputs[tile.index].dtype
            mem = input_mems[tile.index]
        elif tile.role == "output":
            if tile.index not in out_mem:
                raise InterpreterError(f"tensor map {tile}: output {tile.index} has no pointer "
                                       "parameter")
            mem, sizes, strides, dtype = out_mem[tile.index]
            ptr, eb = 0, dtype.size        # the executor allocates outputs aligned
        else:
            raise InterpreterError(f"tensor map {tile}: role {tile.role!r} is neither input "
                                   "nor output")
        where = f"{tile.role} {tile.index} (sizes {tuple(sizes)}, strides {tuple(strides)})"
        rank = len(sizes)
        mapped = (tile.inner, tile.outer) + tile.batch
        if not (all(0 <= d < rank for d in mapped) and len(set(mapped)) == len(mapped)):
            raise InterpreterError(f"tensor map {tile} over {where}: dims {mapped} are not "
                                   "dims of the tensor")
        problems = [f"dim {d} has size {n}: the map views one matrix (other dims of size 1)"
                    for d, n in enumerate(sizes) if d not in mapped and n != 1]
        cols, rows = sizes[tile.inner], sizes[tile.outer]
        if cols > 1 and strides[tile.inner] != 1:
            problems.append(f"the inner dim {tile.inner} has stride {strides[tile.inner]}, not 1")
        # One row has no row stride: the encoder gives it a legal one (runtime/tensor_map
        # encode_tile_box), as the executor's rules (check_tile_box) exempt it.
        row_stride = strides[tile.outer] if rows > 1 else -(-cols * eb // 16) * 16 // eb
        if tile.role == "input":
            from .tensor_map import tile_box_problems
            problems += tile_box_problems(x, tile)
        else:       # the executor's allocation (executor._plan_for checks the same)
            from .tensor_map import ALLOCATION_ALIGN, tile_layout_problems
            problems += tile_layout_problems(sizes, strides, ALLOCATION_ALIGN, eb, tile)
        if tile.swizzle != 128:
            problems.append(f"swizzle {tile.swizzle}: only the 128-byte swizzle is modelled")
        elif tile.box_cols * eb != 128:
            problems.append(f"a 128-byte-swizzled box needs rows of 128 bytes, not "
                            f"{tile.box_cols} x {eb}")
        if problems:
            raise InterpreterError(f"tensor map {tile} over {where}: " + "; ".join(problems))
        inner_first = tile.batch[::-1]
        return _TileView(tile, mem, rows, cols, row_stride, dtype,
                         [sizes[d] for d in inner_first], [strides[d] for d in inner_first])

    def _tile_entry(self, s, buffer: K.Buffer) -> "_TileView":
        view = self.tensor_maps.get(s.tmap.name)
        if not isinstance(view, _TileView) or view.map != s.map:
            raise InterpreterError(f"{s.tmap!r} describes {getattr(view, 'map', view)}, the "
                                   f"copy says {s.map}")
        if self.mems.get(id(buffer)) is not view.mem:
            raise InterpreterError(f"the copy's global buffer {buffer.name} is not the tensor "
                                   f"its map describes ({view.map.role} {view.map.index})")
        want = 2 + len(view.map.batch)
        if len(s.coords) != want:
            raise InterpreterError(f"a tile tensor-map copy of {view.map} has {want} "
                                   f"coordinates, not {len(s.coords)}")
        return view

    def _atom_aligned(self, ctx: _Ctx, ti: K.TensorIndex, elems, eb: int, what: str) -> None:
        """A 128-byte-swizzled box starts on a 1024-byte boundary of shared memory (its offset
        in the buffer, plus the buffer's offset in the dynamic array where launch_config laid
        it out)."""
        start = self.k.smem_offsets.get(ti.buffer.name, 0) + elems * eb
        bad = np.asarray(start % K.SWIZZLE_ATOM_BYTES != 0)
        if bad.any():
            q = int(np.argmax(np.broadcast_to(bad, (ctx.n,))))
            e = _py(elems[q] if type(elems) is _ND else elems)
            raise InterpreterError(
                f"{what} {ti!r} at element {e} of {ti.buffer.name} (byte "
                f"{_py(start[q] if type(start) is _ND else start)} of shared memory) is not "
                f"{K.SWIZZLE_ATOM_BYTES}-byte aligned, as a 128-byte-swizzled box must be, at "
                f"{self._where(ctx, q)}")

    @staticmethod
    def _box_layout(tile: K.TileBoxMap, eb: int) -> np.ndarray:
        """Element (r, c) of a box (row-major, flattened): its element offset in shared memory
        from the box start, under the swizzle."""
        flat = _lanes(tile.box_rows * tile.box_cols)
        return K.swizzled_byte(flat * eb, tile.swizzle) // eb

    def _box_coords(self, ctx: _Ctx, s, view):
        c0, c1 = (ctx.arr(ctx.ev(c), np.int64) for c in s.coords[:2])
        r = _lanes(view.map.box_rows)[:, None]
        c = _lanes(view.map.box_cols)[None, :]
        return c0, c1, r, c

    def _box_batch(self, ctx: _Ctx, s, view) -> tuple:
        """(the element offset of each issuing thread's matrix, whether its batch coordinates
        are inside the tensor): coordinates 2.. against the batch dims (none for a 2D map)."""
        offset = np.zeros(ctx.n, dtype=np.int64)
        inside = np.ones(ctx.n, dtype=bool)
        for c, size, stride in zip(s.coords[2:], view.batches, view.batch_strides):
            cb = ctx.arr(ctx.ev(c), np.int64)
            offset = offset + cb * stride
            inside = inside & (0 <= cb) & (cb < size)
        return offset, inside

    def _tile_load(self, s, ctx: _Ctx) -> None:
        """TensorMapLoad of a TileBoxMap: element (r, c) of the box at coords (column c0, row
        c1) is the tensor's (c1 + r, c0 + c), 0 outside it, at the swizzled offset."""
        view = self._tile_entry(s, s.source)
        t = view.map
        if not isinstance(s.bar, K.MBarrierRef):
            raise InterpreterError(f"tensor-map copy into {s.dst!r} has no mbarrier ({s.bar!r})")
        bars, flat = self._mbar(ctx, s.bar)
        eb = view.dtype.size
        if s.dst.buffer.dtype != view.dtype:
            raise InterpreterError(f"tensor-map copy of {view.dtype} elements into {s.dst!r} of "
                                   f"{s.dst.buffer.dtype}")
        box = t.box_rows * t.box_cols
        nbytes = ctx.arr(ctx.ev(s.bytes), np.int64)
        wrong = nbytes != box * eb
        if wrong.any():
            raise InterpreterError(f"tensor-map copy expects {int(nbytes[np.argmax(wrong)])} "
                                   f"bytes for a box of {box * eb}")
        c0, c1, r, c = self._box_coords(ctx, s, view)
        cb, cin = self._box_batch(ctx, s, view)
        dst, da = self._locate(ctx, s.dst, "tensor-map destination", box, align=1)
        j = da - ctx.base(dst.kind, dst.row)
        self._atom_aligned(ctx, s.dst, j, eb, "tensor-map destination")
        layout = self._box_layout(t, eb)
        src = view.mem
        # A multicast box lands in every CTA of the issuer's cluster, at the same offset of its
        # row of the shared buffer, on its barrier at the same index; the issuer expects the
        # bytes of every CTA's share (each CTA of the cluster multicasts one of the same size).
        cast = s.multicast
        if cast != 1 and cast != self._cluster_x("a multicast tensor-map copy"):
            raise InterpreterError(f"a copy multicast to {cast} CTAs in clusters of "
                                   f"{self.k.launch.cluster}")
        blk = ctx.blk if type(ctx.blk) is _ND else np.full(ctx.n, ctx.blk, dtype=np.int64)
        in_row = j if type(j) is _ND else np.full(ctx.n, j, dtype=np.int64)
        for q in range(ctx.n):
            bq = int(flat[q])
            bars.tx[bq] += nbytes[q] * cast
            row, col = c1[q] + r, c0[q] + c
            inside = ((row >= 0) & (row < view.rows) & (col >= 0) & (col < view.cols)
                      & cin[q]).ravel()
            off = np.where(inside, (row * view.row_stride + col
                                    + cb[q]).ravel(), 0)
            b0 = int(blk[q])
            targets = [b0] if cast == 1 else [
                int(self._cluster_block(b0, rank, "a multicast tensor-map copy"))
                for rank in range(cast)]
            for b in targets:
                d0 = int(da[q]) if b == b0 else b * dst.row + int(in_row[q])
                bb = bq - b0 * bars.count + b * bars.count
                if bars.state[bb] != 1:
                    raise InterpreterError(f"a multicast copy completes on {s.bar!r} of block "
                                           f"{self._block_tuple(b)}, which is not initialized")
                self._slot_copy(ctx, q, dst, d0, box, f"tensor-map copy {s.dst!r}")
                bars.arrival_moments[bb, _COPIES_GROUP] = self.moment
                at = d0 + layout
                dst.vals[at] = np.where(inside, src.vals[off], 0)
                if dst.written is not None:
                    dst.written[at] = (True if src.written is None
                                       else (src.written[off] | ~inside))
                bars.tx[bb] -= nbytes[q]
                self._complete(bars, bb)

    def _TensorMapStore(self, s, ctx: _Ctx):
        """The box read from shared memory (swizzled as a load lays it out) and its elements
        inside the tensor written, counted as stores are, at issue (see the module docstring)."""
        ctx = self._issuers(s, ctx)
        if not ctx.n:
            return
        view = self._tile_entry(s, s.target)
        t = view.map
        eb = view.dtype.size
        if s.src.buffer.dtype != view.dtype or s.src.buffer.memory != "shared":
            raise InterpreterError(f"tensor-map store of {s.src!r} ({s.src.buffer.memory} "
                                   f"{s.src.buffer.dtype}) into a tensor of {view.dtype}")
        box = t.box_rows * t.box_cols
        c0, c1, r, c = self._box_coords(ctx, s, view)
        cb, cin = self._box_batch(ctx, s, view)
        sm, sa = self._locate(ctx, s.src, "tensor-map store source", box, align=1)
        self._atom_aligned(ctx, s.src, sa - ctx.base(sm.kind, sm.row), eb,
                           "tensor-map store source")
        layout = self._box_layout(t, eb)
        out = view.mem
        for q in range(ctx.n):
            row, col = c1[q] + r, c0[q] + c
            inside = ((row >= 0) & (row < view.rows) & (col >= 0) & (col < view.cols)
                      & cin[q]).ravel()
            at = int(sa[q]) + layout[inside]
            if sm.written is not None and not sm.written[at].all():
                k = int(np.flatnonzero(inside)[np.argmin(sm.written[at])])
                raise InterpreterError(
                    f"tensor-map store of {s.src!r} reads box element ({k // t.box_cols}, "
                    f"{k % t.box_cols}), which was never written (an unwritten value stored to "
                    f"global memory) at {self._where(ctx, q)}")
            one = ctx.take(np.array([q]))
            if sm.landed is not None:
                # Checked as a read (a copy's data waited for), not recorded for a later copy
                # into the box: the issuing thread's bulk wait (read) orders that copy after
                # this read, which the model does not check (as for a generic write over it).
                self._slot_read(one, sm, s.src, at[None, :], record=False)
            if sm.owner is not None:
                self._track_read(one, sm, s.src, at[None, :])
            goff = (row * view.row_stride + col + cb[q]).ravel()[inside]
            self._store(out, goff, sm.vals[at], None)
            if out.counts is not None:
                self._count(out, goff)

    # Bulk groups, proxy fences and wgmma groups: copies land and wgmma computes at issue.
    def _BulkCommit(self, s, ctx):
        pass

    def _BulkWait(self, s, ctx):
        pass

    def _FenceProxyAsync(self, s, ctx):
        pass

    def _AccumulatorFence(self, s, ctx):
        pass

    def _collective(self, s, ctx: _Ctx, size: int) -> np.ndarray:
        """Positions in ctx of the threads of each warp group (size 128) or warp (32) reaching
        `s`, [groups, size] (groups of consecutive linear thread ids in the block); every group
        must be whole."""
        tib = ctx.tids % self.tpb
        per_block = -(-self.tpb // size)
        key = ctx.blk * per_block + tib // size
        _, start, counts = np.unique(key, return_index=True, return_counts=True)
        whole = counts == size
        if not whole.all():
            g = int(np.argmin(whole))
            unit = "warp group" if size == 128 else "warp"
            raise InterpreterError(
                f"{type(s).__name__} is reached by {int(counts[g])} of the {size} threads of "
                f"a {unit} (block of {self.tpb} threads; the {unit} of thread "
                f"{self._where(ctx, int(start[g]))}): every thread of the {unit} must reach it")
        return np.arange(ctx.n).reshape(-1, size)

    def _WgmmaFence(self, s, ctx: _Ctx):
        self._collective(s, ctx, 128)

    def _WgmmaCommit(self, s, ctx: _Ctx):
        self._collective(s, ctx, 128)
        self.wgmma_commits[ctx.tids] += 1

    def _WgmmaWait(self, s, ctx: _Ctx):
        """The wgmmas of the committed groups older than the `pending` most recent complete:
        their accumulators may be read again, and their operands' reads end here (a copy that
        overwrote an operand before this wait was a race)."""
        self._collective(s, ctx, 128)
        target = np.full(self.nthreads, -1, dtype=np.int64)
        target[ctx.tids] = self.wgmma_commits[ctx.tids] - s.pending
        for m in self._acc_mems:
            done = (m.busy >= 0) & (m.busy < target)
            m.busy[done] = -1
        kept = []
        for rec in self._wgmma_reads:
            lead = rec["tids"][:, 0]
            done = rec["group"] < target[lead]
            if done.any():
                for m, addr in rec["reads"]:
                    a = addr[done]
                    if m.landed is not None:
                        late = m.landed[a] > rec["moment"]
                        if late.any():
                            e = int(a.ravel()[np.argmax(late.ravel())]) % m.row
                            raise InterpreterError(
                                f"a copy overwrote element {e} of {m.buf.name} while a wgmma "
                                f"reading it was in flight (a release before the "
                                f"wgmma.wait_group that completes it)")
                        m.last_read[rec["role"], a.ravel()] = self._now()
                rest = ~done
                if not rest.any():
                    continue
                rec = dict(rec, tids=rec["tids"][rest], group=rec["group"][rest],
                           reads=[(m, addr[rest]) for m, addr in rec["reads"]])
            kept.append(rec)
        self._wgmma_reads = kept

    def _check_not_busy(self, ctx: _Ctx, m: _Mem, ti, what: str) -> None:
        busy = m.busy[ctx.tids] >= 0
        if busy.any():
            i = int(np.argmax(busy))
            raise InterpreterError(
                f"{what} {ti!r}: accumulator {m.buf.name} of a wgmma that no wgmma.wait_group "
                f"has completed (a missing or short WgmmaWait) at {self._where(ctx, i)}")

    def _wgmma_operand(self, ctx: _Ctx, s: K.Wgmma, ti: K.TensorIndex, rows: int, groups):
        """Values [groups, rows, 16] of a wgmma operand (rows of 16 K elements, K-major,
        128-byte-swizzled: row r, element k at swizzled byte start + (r / 8) 1024 + (r % 8) 128
        + 2 k; MN-major: row r, element k at start + (r / 64) chunk + (k / 8) 1024 + (k % 8) 128
        + 2 (r % 64), chunk B's b_chunk_bytes, A's K.A_MN_CHUNK_BYTES), checked; and their flat
        addresses."""
        is_a = ti is s.a
        mn_major = (s.a_major if is_a else s.b_major) == "MN"
        chunk_bytes = K.A_MN_CHUNK_BYTES if is_a else s.b_chunk_bytes
        name = "A" if is_a else "B"
        if not isinstance(ti, K.TensorIndex) or ti.buffer.memory != "shared":
            raise InterpreterError(f"wgmma operand {name} {ti!r} is not in shared memory")
        m = self._mem(ctx, ti.buffer)
        if ti.buffer.dtype != s.dtype:
            raise InterpreterError(f"wgmma operand {name} {ti!r} holds {ti.buffer.dtype}, the "
                                   f"wgmma multiplies {s.dtype}")
        idx = ctx.arr(ctx.ev(ti.index), np.int64)
        if idx.dtype.kind not in "iu":
            raise InterpreterError(f"wgmma operand {name} {ti!r}: index is not an integer")
        per = idx[groups]
        uneven = (per != per[:, :1]).any(axis=1)
        if uneven.any():
            g = int(np.argmax(uneven))
            q = int(groups[g][np.argmax(per[g] != per[g, 0])])
            raise InterpreterError(
                f"wgmma operand {name} {ti!r} is not uniform over the warp group: element "
                f"{int(per[g, 0])} for its first thread, {int(idx[q])} at {self._where(ctx, q)}")
        eb = s.dtype.size
        base = self.k.smem_offsets.get(ti.buffer.name, 0)
        start = per[:, 0] * eb
        if mn_major:
            # The K offset is whole rows of the box: 16 K rows (2048 bytes) per K step.
            bad = ((base + start) % K.SWIZZLE_ATOM_BYTES != 0) | (start < 0)
        else:
            bad = (((base + start) % K.SWIZZLE_ATOM_BYTES) >= 128) | (start % 32 != 0) | \
                (start < 0)
        if base % K.SWIZZLE_ATOM_BYTES or bad.any():
            g = int(np.argmax(bad))
            raise InterpreterError(
                f"wgmma operand {name} {ti!r} starts at element {int(per[g, 0])} of "
                f"{ti.buffer.name} (byte {base + int(start[g])} of shared memory): a "
                f"128-byte-swizzled operand starts on a {K.SWIZZLE_ATOM_BYTES}-byte boundary "
                f"plus a K offset of 0, 32, 64 or 96 bytes, at "
                f"{self._where(ctx, int(groups[g, 0]))}")
        r = _lanes(rows)[:, None]
        k = _lanes(16)[None, :]
        if mn_major:
            if chunk_bytes <= 0 or chunk_bytes % K.SWIZZLE_ATOM_BYTES:
                raise InterpreterError(f"wgmma MN-major {name}: chunks {chunk_bytes} bytes apart, "
                                       f"not a positive multiple of {K.SWIZZLE_ATOM_BYTES}")
            byte = start[:, None, None] + (r // 64) * chunk_bytes + (k // 8) * 1024 + \
                (k % 8) * 128 + eb * (r % 64)
        else:
            byte = start[:, None, None] + (r // 8) * 1024 + (r % 8) * 128 + eb * k
        elem = K.swizzled_byte(byte, s.swizzle) // eb
        if elem.max() >= m.limit:
            g = int(np.argmax((elem >= m.limit).reshape(len(groups), -1).any(axis=1)))
            raise InterpreterError(
                f"wgmma operand {name} {ti!r}: {rows} rows from element {int(per[g, 0])} reach "
                f"element {int(elem[g].max())}, outside [0, {m.limit}) of {ti.buffer.name}")
        addr = (ctx.blk[groups[:, 0]] * m.row)[:, None, None] + elem
        if m.written is not None and not m.written[addr].all():
            g, rr, kk = np.unravel_index(int(np.argmin(m.written[addr])), addr.shape)
            raise InterpreterError(
                f"wgmma operand {name} {ti!r} reads its row {rr}, K element {kk} (element "
                f"{int(elem[g, rr, kk])} of {ti.buffer.name}), which was never written, at "
                f"{self._where(ctx, int(groups[g, 0]))}")
        if m.landed is not None:
            seen = self.seen[ctx.tids[groups], _COPIES_GROUP].min(axis=1)
            late = m.landed[addr] > seen[:, None, None]
            if late.any():
                g = int(np.argmax(late.reshape(len(groups), -1).any(axis=1)))
                raise InterpreterError(
                    f"wgmma operand {name} {ti!r} reads circular buffer {ti.buffer.name} before "
                    f"every thread of the warp group waited on the barrier phase its copy "
                    f"completes (a missing wait or a wrong parity) at "
                    f"{self._where(ctx, int(groups[g, 0]))}")
            m.last_read[self._group(), addr.ravel()] = self._now()
        return m.vals[addr], (m, addr)

    def _Wgmma(self, s: K.Wgmma, ctx: _Ctx):
        """D = A @ B^T of each warp group, in float64, added to (scale_d) or replacing the
        accumulators, rounded to float32 and scattered over the fragment (see K.Wgmma)."""
        groups = self._collective(s, ctx, 128)
        n = s.n
        if s.dtype not in (DataType.BFloat16, DataType.Half):
            raise InterpreterError(f"wgmma of {s.dtype}: bf16 or fp16 operands only")
        if n % 8 or not 8 <= n <= 256:
            raise InterpreterError(f"wgmma m64n{n}k16: n is a multiple of 8 in 8..256")
        if s.swizzle != 128:
            raise InterpreterError(f"wgmma operands with swizzle {s.swizzle}: only the 128-byte "
                                   "swizzle is modelled")
        acc = self._mem(ctx, s.acc)
        if acc.kind != "local" or s.acc.dtype != DataType.Float or acc.limit != n // 2:
            raise InterpreterError(f"wgmma accumulator {s.acc.name} is {acc.kind} "
                                   f"{s.acc.dtype}[{acc.limit}], not float registers [{n // 2}]")
        a, a_at = self._wgmma_operand(ctx, s, s.a, 64, groups)
        b, b_at = self._wgmma_operand(ctx, s, s.b, n, groups)
        d = np.einsum("grk,gck->grc", _round_array(s.dtype, a), _round_array(s.dtype, b))
        t = _lanes(128)[:, None]
        i = _lanes(n // 2)[None, :]
        w, lane = t // 32, t % 32
        frag = d[:, 16 * w + lane // 4 + 8 * ((i >> 1) & 1),
                 8 * (i >> 2) + 2 * (lane % 4) + (i & 1)]
        scale = ctx.arr(ctx.ev(s.scale_d))
        per = scale[groups]
        uneven = (per != per[:, :1]).any(axis=1)
        if uneven.any():
            g = int(np.argmax(uneven))
            raise InterpreterError(f"wgmma scale_d {s.scale_d!r} is not uniform over the warp "
                                   f"group at {self._where(ctx, int(groups[g, 0]))}")
        keep = per[:, 0].astype(bool)[:, None, None]
        tids = ctx.tids[groups]
        regs = acc.vals.reshape(-1, acc.row)
        written = acc.written.reshape(-1, acc.row)
        old = regs[tids, :n // 2]
        unwritten = keep & ~written[tids, :n // 2]
        if unwritten.any():
            g, tt, ii = np.unravel_index(int(np.argmax(unwritten)), unwritten.shape)
            raise InterpreterError(
                f"wgmma accumulates into {s.acc.name}[{ii}], which was never written (scale_d "
                f"{s.scale_d!r} is true) at {self._where(ctx, int(groups[g, tt]))}")
        regs[tids, :n // 2] = _round_array(DataType.Float, np.where(keep, old, 0.0) + frag)
        written[tids, :n // 2] = True
        if acc.busy is None:
            acc.busy = np.full(self.nthreads, -1, dtype=np.int64)
            self._acc_mems.append(acc)
        acc.busy[ctx.tids] = self.wgmma_commits[ctx.tids]
        self._wgmma_reads.append({"tids": tids, "group": self.wgmma_commits[tids[:, 0]],
                                  "reads": [a_at, b_at], "moment": self.moment,
                                  "role": self._group()})

    def _SplitKReduce(self, s: K.SplitKReduce, ctx: _Ctx):
        """Split-K (K.SplitKReduce): each warp group reaching it stores the registers of its
        valid rows as partial `split` of `slot`; its arrival at the slot's counter is counted
        in block order (on a GPU any order), and the one that makes `splits` arrivals is the
        last: it sums the slot's partials in split order (float32 adds from 0) into its
        registers (those of invalid rows: 0). `last` is set in every thread. Stream-K:
        `arrivals` (per slot) in place of `splits`; a warp group whose `whole` is true stores
        nothing and is last; split 0 of a slot is the last, and sums (its own registers first)
        once the others have stored theirs."""
        groups = self._collective(s, ctx, 128)
        stream = s.whole is not None
        values = {}
        for name in ("slot", "split") + (() if stream else ("frag_row",)):
            values[name] = ctx.arr(ctx.ev(getattr(s, name)), np.int64).astype(np.int64)
        for name, e in (("arrivals", K.Const(s.splits) if s.arrivals is None else s.arrivals),
                        ("whole", K.Const(0) if s.whole is None else s.whole)):
            values[name] = ctx.arr(ctx.ev(e), np.int64).astype(np.int64)
        for name in ("slot", "split", "arrivals", "whole"):
            per = values[name][groups]
            if (per != per[:, :1]).any():
                g = int(np.argmax((per != per[:, :1]).any(axis=1)))
                raise InterpreterError(f"split-K {name} {getattr(s, name)!r} is not uniform over "
                                       f"the warp group at {self._where(ctx, int(groups[g, 0]))}")
        slot, split = values["slot"][groups[:, 0]], values["split"][groups[:, 0]]
        arrivals, whole = values["arrivals"][groups[:, 0]], values["whole"][groups[:, 0]] != 0
        part = s.registers * 128
        room = self._mem(ctx, s.partials).limit, self._mem(ctx, s.counters).limit
        bad = ~whole & ((split < 0) | (split >= arrivals) | (arrivals > s.splits) | (slot < 0)
                        | (slot >= room[1]) | ((slot * s.splits + split + 1) * part > room[0]))
        if bad.any():
            g = int(np.argmax(bad))
            raise InterpreterError(
                f"split-K partial {int(split[g])} of slot {int(slot[g])} ({s.splits} splits of "
                f"{part} floats) is outside the workspaces ({room[0]} floats, {room[1]} "
                f"counters) at {self._where(ctx, int(groups[g, 0]))}")
        # [threads, registers] of every slice, and which hold a valid row (stream-K's partials
        # hold every register: rows past the matrix too).
        vals, poison, valid = [], [], []
        for sl, acc in enumerate(s.accs):
            n = acc.size.value
            v, p = self._read(ctx, K.TensorIndex(acc, K.Const(0)), n, "split-K partial of")
            vals.append(np.asarray(v, dtype=np.float64).reshape(ctx.n, n))
            poison.append(np.zeros((ctx.n, n), dtype=bool) if p is None
                          else np.asarray(p).reshape(ctx.n, n))
            if stream:
                valid.append(np.ones((ctx.n, n), dtype=bool))
                continue
            row = values["frag_row"][:, None] + 8 * ((_lanes(n)[None, :] >> 1) & 1)
            valid.append(row < ctx.arr(ctx.ev(s.rows[sl]), np.int64)[:, None])
        vals, poison, valid = (np.concatenate(x, axis=1) for x in (vals, poison, valid))
        last = np.zeros(ctx.n, dtype=bool)
        # Stream-K: the later runs of a tile store first, then each tile's split 0 (which waits
        # for them on a GPU) adds them to its own registers.
        order = (sorted(range(len(groups)), key=lambda g: split[g] == 0) if stream
                 else range(len(groups)))
        for g in order:
            at = groups[g]
            if whole[g]:
                last[at] = True
                continue
            key = (int(slot[g]), int(split[g]))
            count = int(arrivals[g])
            if stream and key[1] == 0:
                if self._split_arrivals.get(key[0], 0) != count - 1:
                    raise InterpreterError(
                        f"stream-K: split 0 of slot {key[0]} waits for {count - 1} partials, "
                        f"{self._split_arrivals.get(key[0], 0)} stored by then (the CTAs run in "
                        f"lockstep here) at {self._where(ctx, int(groups[g, 0]))}")
                self._split_arrivals[key[0]] = 0
                self._split_partials[key] = (vals[at], poison[at] & valid[at], valid[at])
            else:
                if key in self._split_partials:
                    raise InterpreterError(f"split-K partial {key[1]} of slot {key[0]} stored "
                                           f"twice before its sum at "
                                           f"{self._where(ctx, int(groups[g, 0]))}")
                self._split_partials[key] = (vals[at], poison[at] & valid[at], valid[at])
                arrived = self._split_arrivals.get(key[0], 0) + 1
                if stream:
                    self._split_arrivals[key[0]] = arrived
                    continue
                self._split_arrivals[key[0]] = arrived % count
                if arrived < count:
                    continue
            total = np.zeros((128, vals.shape[1]), dtype=np.float64)
            bad_bits = np.zeros_like(valid[at])
            for j in range(count):
                got = self._split_partials.pop((key[0], j), None)
                if got is None:
                    raise InterpreterError(f"split-K: slot {key[0]} has {count} arrivals but "
                                           f"no partial {j}")
                total = _round_array(DataType.Float, total + np.where(got[2], got[0], 0.0))
                bad_bits |= got[1]
            last[at] = True
            lctx = ctx.take(at)
            off = 0
            for acc in s.accs:
                n = acc.size.value
                m, addr = self._locate(lctx, K.TensorIndex(acc, K.Const(0)), "split-K sum into", n)
                self._store(m, addr[:, None] + _lanes(n), np.where(valid[at][:, off:off + n],
                                                                   total[:, off:off + n], 0.0),
                            bad_bits[:, off:off + n] if bad_bits[:, off:off + n].any() else None)
                off += n
        ctx.env[s.last.name] = last

    def _stmatrix_value(self, ctx: _Ctx, v):
        if isinstance(v, (K.TensorIndex, K.ScalarValue)):
            vals, poison = self._read(ctx, v)
        else:
            vals, poison = ctx.ev(v), None
        vals = np.broadcast_to(np.asarray(vals, dtype=np.float64), (ctx.n,))
        return vals, (np.zeros(ctx.n, dtype=bool) if poison is None
                      else np.broadcast_to(poison, (ctx.n,)))

    def _RegisterCopy(self, s: K.RegisterCopy, ctx: _Ctx):
        """dst = src (rounded to dst's dtype; the copies lowering makes widen exactly)."""
        if s.dst.buffer.memory != "local":
            raise InterpreterError(f"register copy into {s.dst!r} ({s.dst.buffer.memory})")
        vals, poison = self._read(ctx, s.src)
        self._write(ctx, s.dst, vals, poison)

    def _StSharedPair(self, s: K.StSharedPair, ctx: _Ctx):
        """dst, dst + 1 = the two values (rounded to the buffer's dtype), 8-byte aligned."""
        if s.dst.buffer.memory != "shared" or s.dst.buffer.dtype.size != 4 or len(s.values) != 2:
            raise InterpreterError(f"shared pair store of {len(s.values)} values into {s.dst!r} "
                                   f"({s.dst.buffer.memory} {s.dst.buffer.dtype})")
        m, addr = self._locate(ctx, s.dst, "shared pair store", 2, align=2)
        read = [self._stmatrix_value(ctx, v) for v in s.values]
        vals = np.stack([v for v, _ in read], axis=1)
        poison = np.stack([p for _, p in read], axis=1)
        self._store(m, addr[:, None] + _lanes(2), vals, poison if poison.any() else None)

    def _StMatrix(self, s: K.StMatrix, ctx: _Ctx):
        """stmatrix.m8n8.x4 of each warp: lane l's pair k lands in row l / 4 of matrix k, at
        columns 2 (l % 4) + {0, 1} from the row address lane 8 k + l / 4 gives."""
        warps = self._collective(s, ctx, 32)
        if s.dtype.size != 2 or len(s.values) != 8:
            raise InterpreterError(f"stmatrix of {len(s.values)} {s.dtype} values: 8 16-bit "
                                   "values per lane")
        if s.dst.buffer.memory != "shared" or s.dst.buffer.dtype != s.dtype:
            raise InterpreterError(f"stmatrix destination {s.dst!r} is not shared memory of "
                                   f"{s.dtype}")
        m, addr = self._matrix_addresses(ctx, s.dst, warps, "stmatrix")
        read = [self._stmatrix_value(ctx, v) for v in s.values]
        vals = np.stack([v for v, _ in read], axis=1)            # [threads, 8]
        poison = np.stack([p for _, p in read], axis=1)
        if poison.any():
            q, j = divmod(int(np.argmax(poison)), 8)
            raise InterpreterError(f"stmatrix stores value {j} ({s.values[j]!r}), computed from "
                                   f"unwritten registers, at {self._where(ctx, q)}")
        self._store(m, addr, vals[warps].reshape(-1, 8), None)

    def _matrix_addresses(self, ctx: _Ctx, at: K.TensorIndex, warps, what: str):
        """(memory, [threads, 8] element addresses) of an stmatrix / ldmatrix .x4 whose lanes
        give row addresses `at`: lane l's pair k is row l / 4 of matrix k, columns
        2 (l % 4) + {0, 1} from the row address lane 8 k + l / 4 gives (16-byte aligned)."""
        m, idx = self._check(ctx, at, f"{what} row address", 8, align=1)
        idx = ctx.arr(idx, np.int64)
        byte = self.k.smem_offsets.get(at.buffer.name, 0) + idx * 2
        if (byte % 16 != 0).any():
            q = int(np.argmax(byte % 16 != 0))
            raise InterpreterError(f"{what} row address {at!r} (element {int(idx[q])}) is not "
                                   f"16-byte aligned at {self._where(ctx, q)}")
        lane = _lanes(32)[:, None]
        k = _lanes(4)[None, :]
        rows = idx[warps][:, 8 * k + lane // 4]                  # [warps, 32, 4]
        col = rows + 2 * (lane % 4)
        pairs = np.stack([col, col + 1], axis=-1).reshape(len(warps), 32, 8)
        return m, ((ctx.blk[warps] * m.row)[:, :, None] + pairs).reshape(-1, 8)

    def _LdMatrix(self, s: K.LdMatrix, ctx: _Ctx):
        """ldmatrix.m8n8.x4 of each warp (StMatrix's inverse): lane l's pair k is row l / 4 of
        matrix k, columns 2 (l % 4) + {0, 1} from the row address lane 8 k + l / 4 gives; a
        read of shared memory as any other (unwritten elements poison the registers, a copy's
        data must have been waited for)."""
        warps = self._collective(s, ctx, 32)
        if s.src.buffer.memory != "shared" or s.src.buffer.dtype.size != 2 \
                or s.out.dtype != s.src.buffer.dtype or s.out.memory != "local":
            raise InterpreterError(f"ldmatrix of {s.src!r} into {s.out.name}: 16-bit shared "
                                   "memory into registers of its dtype")
        m, addr = self._matrix_addresses(ctx, s.src, warps, "ldmatrix")
        vals = m.vals[addr]
        poison = None if m.written is None else ~m.written[addr]
        if m.landed is not None:
            self._slot_read(ctx, m, s.src, addr)      # (warps: every thread of ctx, in order)
        self._write(ctx, K.TensorIndex(s.out, K.Const(0)), vals, poison, nwrite=8, exact=True)

    # cp.async (asynchronous per thread): a copy reads its source when issued, but its data
    # lands only at the wait_group that completes its group; until then the destination reads
    # as unwritten. Landed data is visible to the issuing thread alone until a block barrier,
    # so a missing or short wait, or a missing barrier before another thread reads, fails a
    # test. Copies in flight are kept in batches (one per statement executed): the threads,
    # their group numbers (the thread's commits so far), destinations and values.
    def _CpAsyncCopy(self, s, ctx: _Ctx):
        size = s.dst.buffer.dtype.size
        if s.bytes not in (4, 8, 16) or s.bytes % size:
            raise InterpreterError(f"cp.async of {s.bytes} bytes of {size}-byte elements")
        ctx = self._issuers(s, ctx)
        if not ctx.n:
            return
        n = s.bytes // size
        src, sa = self._locate(ctx, s.src, "cp.async source", n, align=1)
        dst, da = self._locate(ctx, s.dst, "cp.async destination", n, align=1)
        i, j = sa - ctx.base(src.kind, src.row), da - ctx.base(dst.kind, dst.row)
        if self.check_alignment:
            bad = ((((i + src.align0) * size) % s.bytes != 0)
                   | (((j + dst.align0) * size) % s.bytes != 0))
            if bad.any():
                q = int(np.argmax(bad))
                raise InterpreterError(
                    f"cp.async {s.src!r} -> {s.dst!r}: element offsets {i[q]}, {j[q]} are not "
                    f"{s.bytes}-byte aligned at {self._where(ctx, q)}")
        lanes = _lanes(n)
        daddr = da[:, None] + lanes
        tid = ctx.tids[:, None]
        if dst.inflight is None:
            raise InterpreterError(f"cp.async into {s.dst!r}, which is not shared memory")
        reader = dst.reader[daddr]
        bad_reader = (reader != -1) & (reader != tid)
        bad_flight = dst.inflight[daddr] != -1
        flat = daddr.ravel()
        if len(flat) > 1 and not (flat[1:] > flat[:-1]).all():     # copies into one element
            order = np.argsort(flat, kind="stable")
            srt = flat[order]
            later = np.zeros(len(flat), dtype=bool)
            later[order[1:][srt[1:] == srt[:-1]]] = True
            bad_flight = bad_flight | later.reshape(daddr.shape)
        bad = bad_reader | bad_flight
        if bad.any():
            k = int(np.argmax(bad.ravel()))
            q, lane = divmod(k, n)
            e = int(j[q]) + lane
            if bad_reader.ravel()[k]:
                r = int(reader.ravel()[k])
                who = "several threads" if r == -2 else "thread " + ", ".join(
                    self._where_tid(r).split(", ")[:2])
                raise InterpreterError(f"cp.async into {s.dst!r} (element {e}), which {who} "
                                       f"read with no block barrier since, at "
                                       f"{self._where(ctx, q)}")
            raise InterpreterError(f"cp.async into {s.dst!r} (element {e}) while an earlier "
                                   f"copy into it is in flight at {self._where(ctx, q)}")
        dst.inflight[flat] = np.broadcast_to(tid, daddr.shape).ravel()
        saddr = sa[:, None] + lanes
        values = _round_array(s.dst.buffer.dtype, src.vals[saddr])
        poison = None if src.written is None else ~src.written[saddr]
        dst.written[flat] = False
        self._cp_batches.append({"tids": ctx.tids, "groups": self.cp_commits[ctx.tids],
                                 "mem": dst, "addr": daddr, "values": values, "poison": poison})

    def _CpAsyncCommit(self, s, ctx: _Ctx):
        self.cp_commits[ctx.tids] += 1

    def _CpAsyncWait(self, s, ctx: _Ctx):
        # Each waiting thread lands its groups older than its `pending` most recent ones.
        target = np.full(self.nthreads, -1, dtype=np.int64)
        target[ctx.tids] = self.cp_commits[ctx.tids] - s.pending
        kept = []
        for b in self._cp_batches:
            land = b["groups"] < target[b["tids"]]
            if land.any():
                m, addr = b["mem"], b["addr"][land]
                flat = addr.ravel()
                m.vals[flat] = b["values"][land].ravel()
                m.written[flat] = True if b["poison"] is None else ~b["poison"][land].ravel()
                m.owner[flat] = np.broadcast_to(b["tids"][land][:, None], addr.shape).ravel()
                m.inflight[flat] = -1
                stay = ~land
                if not stay.any():
                    continue
                b = {key: (v[stay] if type(v) is _ND else v) for key, v in b.items()}
            kept.append(b)
        self._cp_batches = kept


def _storage_of(x: torch.Tensor) -> np.ndarray:
    """A flat array holding `x` at its strides (broadcast dims of stride 0 included): float64
    for floating tensors, int64 for integers, bool for bools; elements between NaN (0)."""
    if x.dtype.is_floating_point:
        dt, fill = np.float64, math.nan
    elif x.dtype == torch.bool:
        dt, fill = np.bool_, False
    else:
        dt, fill = np.int64, 0
    if x.numel() == 0:
        return np.zeros(0, dtype=dt)
    span = 1 + sum((s - 1) * abs(st) for s, st in zip(x.shape, x.stride()))
    flat = np.full(span, fill, dtype=dt)
    src = x.detach().to(torch.float64 if dt is np.float64 else
                        torch.bool if dt is np.bool_ else torch.int64).numpy()
    item = flat.itemsize
    view = np.lib.stride_tricks.as_strided(flat, x.shape, [st * item for st in x.stride()])
    view[...] = src          # stride-0 dims write one element repeatedly with the same value
    return flat


def interpret(kernel, bindings, inputs, **kw) -> tuple[list, Interpreter]:
    it = Interpreter(kernel, bindings, **kw)
    return it.run(inputs), it
