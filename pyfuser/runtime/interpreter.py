"""The kernel-IR interpreter: runs a lowered kernel on CPU tensors.

All threads of the grid run in lockstep, statement by statement, with checks a GPU would not
make: every access in bounds, vector accesses aligned to their width, no value computed from an
unwritten register reaching memory, writes counted per element; cp.async copies land only at the
wait_group that completes their group and stay private to the copying thread until a block
barrier (reads before, or copies over another thread's unsynchronized reads, fail). A cluster
reduction must be reached by every thread of every CTA of the cluster (its cluster barrier would
hang otherwise). Warp roles (producer / compute) run as cooperating groups that hand over at
mbarrier waits, so a wrong parity or a missing release is reported as a deadlock.

`PYFUSER_ENABLE=interpret` runs a fusion's generated kernels through it on CPU tensors (see
runtime/executor.py); tests call `interpret(kernel, bindings, inputs)` directly.
"""
from __future__ import annotations

import math
import struct
import threading

import numpy as np
import torch

from ..ir import scalar as S
from ..ir.dtype import DataType, to_torch
from ..ir.exprs import (BinaryOp, BinaryOpType, BroadcastOp, ExpandOp, FullOp, LoadStoreOp,
                        ReshapeOp, SqueezeOp, UnaryOp, UnaryOpType, WhereOp)
from ..ir.tensor import TensorView
from ..kir import nodes as K

# Expressions ------------------------------------------------------------------------------------
def _tdiv(a, b):
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _tmod(a, b):
    return a - _tdiv(a, b) * b


def _ceil(a, b):
    return -(-a // b)


_HELPERS = {"_tdiv": _tdiv, "_tmod": _tmod, "_ceil": _ceil, "min": min, "max": max}
_BIN = {"+": "({a} + {b})", "-": "({a} - {b})", "*": "({a} * {b})", "/": "_tdiv({a}, {b})",
        "%": "_tmod({a}, {b})", "ceilDiv": "_ceil({a}, {b})", "min": "min({a}, {b})",
        "max": "max({a}, {b})", "<": "({a} < {b})", "<=": "({a} <= {b})", ">": "({a} > {b})",
        ">=": "({a} >= {b})", "==": "({a} == {b})", "!=": "({a} != {b})",
        "&&": "({a} and {b})", "||": "({a} or {b})"}


def py_source(e) -> str:
    """Python source of kernel expression `e` reading variables from a dict `env`."""
    if isinstance(e, K.Const):
        return repr(e.value)
    if isinstance(e, (K.Var, K.Special)):
        return f"env[{e.name!r}]"
    if isinstance(e, K.Bin):
        return _BIN[e.op].format(a=py_source(e.a), b=py_source(e.b))
    if isinstance(e, K.Not):
        return f"(not {py_source(e.a)})"
    if isinstance(e, K.Select):
        return f"({py_source(e.a)} if {py_source(e.cond)} else {py_source(e.b)})"
    raise TypeError(f"not an index expression: {e!r} ({type(e).__name__})")


_COMPILED: dict = {}


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

# Interpreter ----------------------------------------------------------------------------------
class InterpreterError(AssertionError):
    pass


class _Poison:
    """A value computed from a register nobody wrote: harmless unless it reaches memory."""

    def __repr__(self):
        return "POISON"


POISON = _Poison()


def _round_bf16(x: float) -> float:
    if math.isnan(x) or math.isinf(x):
        return x
    bits = struct.unpack("<I", struct.pack("<f", np.float32(x)))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def round_to(dt: DataType, x):
    if x is POISON:
        return x
    with np.errstate(all="ignore"):
        if dt == DataType.Float:
            return float(np.float32(x))
        if dt == DataType.Half:
            return float(np.float16(x))
        if dt == DataType.BFloat16:
            return _round_bf16(float(x))
        if dt == DataType.Double:
            return float(x)
        if dt == DataType.Bool:
            return bool(x)
        return int(x)


def _f(fn):
    def g(x):
        with np.errstate(all="ignore"):
            return float(fn(np.float64(x)))
    return g


def _np2(fn, a, b):
    with np.errstate(all="ignore"):
        return float(fn(np.float64(a), np.float64(b)))


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


_UNARY = {
    UnaryOpType.Neg: lambda x: -x, UnaryOpType.Abs: abs, UnaryOpType.Exp: _f(np.exp),
    UnaryOpType.Exp2: _f(np.exp2), UnaryOpType.Log: _f(np.log), UnaryOpType.Sqrt: _f(np.sqrt),
    UnaryOpType.Rsqrt: _f(lambda x: 1.0 / np.sqrt(x)),
    UnaryOpType.Reciprocal: _f(lambda x: 1.0 / x), UnaryOpType.Tanh: math.tanh,
    UnaryOpType.Sigmoid: _f(lambda x: 1.0 / (1.0 + np.exp(-x))), UnaryOpType.Erf: math.erf,
    UnaryOpType.Relu: lambda x: max(x, 0.0),
    UnaryOpType.Silu: _f(lambda x: x / (1.0 + np.exp(-x))),
    UnaryOpType.GeluTanh: _gelu_tanh,
    UnaryOpType.GeluErf: lambda x: 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0))),
    UnaryOpType.Not: lambda x: not x, UnaryOpType.Cast: lambda x: x, UnaryOpType.Set: lambda x: x,
}
_BINARY = {
    BinaryOpType.Add: lambda a, b: a + b, BinaryOpType.Sub: lambda a, b: a - b,
    BinaryOpType.Mul: lambda a, b: a * b,
    BinaryOpType.Div: lambda a, b: _np2(np.divide, a, b),
    BinaryOpType.Pow: lambda a, b: _np2(np.power, a, b),
    BinaryOpType.Max: max, BinaryOpType.Min: min,
    BinaryOpType.Eq: lambda a, b: a == b, BinaryOpType.Ne: lambda a, b: a != b,
    BinaryOpType.Lt: lambda a, b: a < b, BinaryOpType.Le: lambda a, b: a <= b,
    BinaryOpType.Gt: lambda a, b: a > b, BinaryOpType.Ge: lambda a, b: a >= b,
    BinaryOpType.And: lambda a, b: bool(a) and bool(b), BinaryOpType.Or: lambda a, b: bool(a) or bool(b),
}
_REDUCE = {"sum": lambda a, b: a + b, "max": max, "min": min}


class _Thread:
    __slots__ = ("env", "locals", "block", "cp_open", "cp_groups")

    def __init__(self, env, block):
        self.env = env
        self.locals = {}
        self.block = block
        self.cp_open = []       # cp.async copies since the last commit
        self.cp_groups = []     # committed cp.async groups not yet waited for, oldest first


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


class Interpreter:
    """Run `kernel` on CPU tensors. `bindings`: the kernel fusion's symbolic extents -> ints."""

    def __init__(self, kernel: K.Kernel, bindings: dict, check_alignment: bool = True,
                 max_threads: int = 1 << 15):
        self.k = kernel
        self.bindings = dict(bindings)
        self.check_alignment = check_alignment
        self.max_threads = max_threads
        self.writes: dict = {}       # (buffer name, element offset) -> count, global buffers

    # Memory ------------------------------------------------------------------------------------
    def _mem(self, t: _Thread, buf: K.Buffer) -> list:
        if buf.memory == "global":
            return self.globals[id(buf)]
        if buf.memory == "shared":
            return self.shared.setdefault((t.block, id(buf)), [POISON] * self._size(buf, t))
        m = t.locals.get(id(buf))
        if m is None:
            raise InterpreterError(f"register buffer {buf.name} is used before its Allocate")
        return m

    def _size(self, buf, t) -> int:
        return int(eval_expr(buf.size, t.env)) if isinstance(buf.size, K.KExpr) else int(buf.size)

    def _addr(self, t, ti: K.TensorIndex, what: str, lanes: int) -> tuple[list, int]:
        mem = self._mem(t, ti.buffer)
        idx = eval_expr(ti.index, t.env)
        if not isinstance(idx, int):
            raise InterpreterError(f"{what} {ti!r}: index {idx!r} is not an integer")
        if idx < 0 or idx + lanes > len(mem):
            raise InterpreterError(
                f"{what} {ti!r}: elements [{idx}, {idx + lanes}) outside [0, {len(mem)}) of "
                f"{ti.buffer.name} ({ti.buffer.memory}) at {self._where(t)}")
        if lanes > 1 and self.check_alignment and idx % lanes:
            raise InterpreterError(
                f"{what} {ti!r}: vector access of {lanes} at element {idx} is not aligned to "
                f"{lanes} elements at {self._where(t)}")
        return mem, idx

    @staticmethod
    def _where(t) -> str:
        return ", ".join(f"{k}={v}" for k, v in t.env.items()
                         if not k.startswith("T") and not isinstance(v, bool))

    def _read(self, t, operand, lane=0):
        if isinstance(operand, K.ScalarValue):
            return self._scalar(operand.scalar)
        if isinstance(operand, K.TensorIndex):
            mem, idx = self._addr(t, operand, "read of", max(operand.vector, 1))
            if self.cp_kernel and operand.buffer.memory == "shared":
                key = (t.block, id(operand.buffer))
                owner = self.cp_owner.get(key, {}).get(idx + lane)
                if owner is not None and owner is not t:
                    raise InterpreterError(
                        f"read of {operand!r} (element {idx + lane}) that another thread copied "
                        f"with cp.async, with no block barrier since its wait, at {self._where(t)}")
                readers = self.cp_readers.setdefault(key, {})
                if readers.get(idx + lane, t) is not t:
                    readers[idx + lane] = "several threads"
                else:
                    readers[idx + lane] = t
            return mem[idx + lane]
        raise InterpreterError(f"cannot read {operand!r}")

    def _write(self, t, ti: K.TensorIndex, value, lane=0):
        mem, idx = self._addr(t, ti, "write of", max(ti.vector, 1))
        if value is POISON and ti.buffer.memory != "local":
            raise InterpreterError(f"a value computed from unwritten registers is stored to "
                                   f"{ti!r} at {self._where(t)}")
        mem[idx + lane] = round_to(ti.buffer.dtype, value)
        if ti.buffer.memory == "global":
            key = (ti.buffer.name, idx + lane)
            self.writes[key] = self.writes.get(key, 0) + 1

    def _scalar(self, s):
        if s.value is not None:
            return s.value
        if s in self.scalar_env:
            return self.scalar_env[s]
        d = s.definition
        if isinstance(d, UnaryOp):
            return _UNARY[d.op](self._scalar(d.inputs[0]))
        if isinstance(d, BinaryOp):
            return _BINARY[d.op](self._scalar(d.inputs[0]), self._scalar(d.inputs[1]))
        return S.evaluate(s, self.scalar_env)

    # Running ---------------------------------------------------------------------------------
    def run(self, inputs: list) -> list:
        from .inputs import output_strides
        k = self.k
        fusion = k.fusion
        self.scalar_env = dict(self.bindings)
        for v, x in zip(fusion.inputs, inputs):
            if not isinstance(v, TensorView):
                self.scalar_env[v] = x
        self.globals = {}
        self.shared = {}
        self.tensor_maps = {}
        # cp.async: (block, buffer) -> {element: issuing thread} for copies in flight, and for
        # copies landed but visible to their thread only (until a block barrier).
        self.cp_inflight: dict = {}
        self.cp_owner: dict = {}
        # ... and {element: reader (or "several threads")} of shared reads since the block's
        # last barrier, so that a copy over an element another thread may still read fails.
        self.cp_readers: dict = {}
        self.cp_kernel = any(isinstance(x, K.CpAsyncCopy) for x in K.walk(k.body))
        env0 = {}
        self.outputs = []
        out_sizes = [[int(S.evaluate(i.user_extent if i.is_broadcast else i.extent, dict(self.bindings)))
                      for i in o.domain.logical_no_reductions] for o in fusion.outputs]
        out_store = {}
        for p in k.params:
            src = p.source
            if src[0] == "input":
                x = inputs[src[1]]
                self.globals[id(p.buffer)] = _storage_of(x)
            elif src[0] == "output":
                o = fusion.outputs[src[1]]
                sizes = out_sizes[src[1]]
                strides = output_strides(o, sizes)
                n = 1 + sum((s - 1) * st for s, st in zip(sizes, strides) if s > 0)
                store = [math.nan] * (n if all(sizes) else 0)
                self.globals[id(p.buffer)] = store
                out_store[src[1]] = (store, sizes, strides, o.dtype)
            elif src[0] == "stride":
                _, role, kk, d = src
                if role == "input":
                    env0[p.name] = int(inputs[kk].stride(d))
                else:
                    o = fusion.outputs[kk]
                    env0[p.name] = output_strides(o, out_sizes[kk])[d]
            elif src[0] == "extent":
                env0[p.name] = int(S.evaluate(src[1], dict(self.bindings)))
            elif src[0] == "scalar":
                env0[p.name] = inputs[src[1]]
            elif src[0] == "tmap":
                self.tensor_maps[p.name] = self._tensor_map(inputs[src[1].input], src[1])
            elif src[0] == "workspace":
                kind = dict((b.name, kd) for b, kd in k.workspaces).get(p.buffer.name)
                n = 0
                if kind == "intermediate":      # a global tensor between loop nests
                    n = int(eval_expr(p.buffer.size, dict(env0, **{
                        e.name: v for e, v in self._extent_vars().items()})))
                self.globals[id(p.buffer)] = [POISON] * n
            else:
                raise InterpreterError(f"unknown parameter source {src}")
        grid = [max(1, int(S.evaluate(g, dict(self.bindings)))) for g in k.launch.grid]
        block = [max(1, int(S.evaluate(b, dict(self.bindings)))) for b in k.launch.block]
        self.grid, self.block = grid, block
        n = grid[0] * grid[1] * grid[2] * block[0] * block[1] * block[2]
        if n > self.max_threads:
            raise InterpreterError(f"{n} threads is too many to interpret (grid {grid}, block {block})")
        threads = []
        for bz in range(grid[2]):
            for by in range(grid[1]):
                for bx in range(grid[0]):
                    for tz in range(block[2]):
                        for ty in range(block[1]):
                            for tx in range(block[0]):
                                env = dict(env0)
                                env.update({"threadIdx.x": tx, "threadIdx.y": ty, "threadIdx.z": tz,
                                            "blockIdx.x": bx, "blockIdx.y": by, "blockIdx.z": bz,
                                            "blockDim.x": block[0], "gridDim.x": grid[0],
                                            "pf_grid_last": False})
                                threads.append(_Thread(env, (bx, by, bz)))
        self.all_threads = threads
        self._body(k.body, threads)
        for t in threads:
            if t.cp_open or any(t.cp_groups):
                raise InterpreterError(f"the kernel ends with cp.async copies never waited for "
                                       f"(thread {self._where(t)})")
        outs = []
        for j in range(len(fusion.outputs)):
            store, sizes, strides, dt = out_store[j]
            flat = torch.tensor(store, dtype=torch.float64) if store else torch.zeros(0, dtype=torch.float64)
            t = flat.as_strided(sizes, strides) if store else torch.zeros(sizes, dtype=torch.float64)
            outs.append(t.to(to_torch(dt)) if dt.is_floating else t)
        return outs

    def _extent_vars(self) -> dict:
        """Kernel variables of the symbolic extents (K.Var -> value)."""
        names = getattr(self.k.ctx, "names", {}) or {}
        out = {}
        for s, var in names.items():
            if isinstance(var, K.Var) and s in self.bindings:
                out[var] = self.bindings[s]
        return out

    def _GridSync(self, s, threads):
        self._check_whole_grid(s, threads)     # lockstep: every block is already here

    def _body(self, stmts, threads):
        for s in stmts:
            if not threads:
                return
            getattr(self, "_" + type(s).__name__)(s, threads)

    def _ForLoop(self, s: K.ForLoop, threads):
        if s.parallel in ("TIDx", "TIDy", "TIDz", "BIDx", "BIDy", "BIDz"):
            self._body(s.body, threads)
            return
        name = s.var.name
        if s.parallel == "GridStride":
            starts = {id(t): t.env["blockIdx.x"] for t in threads}
            step = {id(t): t.env["gridDim.x"] for t in threads}
        else:
            starts = {id(t): eval_expr(s.start, t.env) for t in threads}
            step = {id(t): eval_expr(s.step, t.env) for t in threads}
        stops = {id(t): eval_expr(s.stop, t.env) for t in threads}
        it = 0
        while True:
            active = []
            for t in threads:
                v = starts[id(t)] + it * step[id(t)]
                if v < stops[id(t)]:
                    t.env[name] = v
                    active.append(t)
            if not active:
                break
            self._body(s.body, active)
            it += 1
        for t in threads:
            t.env.pop(name, None)

    def _IfThenElse(self, s, threads):
        yes = [t for t in threads if eval_expr(s.cond, t.env)]
        no = [t for t in threads if not eval_expr(s.cond, t.env)]
        if s.roles:
            self._run_roles([(s.then_body, yes), (s.else_body, no)])
            return
        self._body(s.then_body, yes)
        self._body(s.else_body, no)

    # Warp roles: the producer and compute branches run as two cooperating groups (each in
    # lockstep). A group runs until an mbarrier wait it cannot pass, then hands over; when
    # neither can move, the kernel would hang, and the interpreter says so.
    def _run_roles(self, groups) -> None:
        roles = _Roles(len(groups))
        self._roles = roles

        def run(idx, body, threads):
            roles.local.idx = idx
            with roles.cv:
                while roles.turn != idx:
                    roles.cv.wait()
            try:
                self._body(body, threads)
            except BaseException as e:      # reported by the main thread
                roles.error = roles.error or e
            finally:
                with roles.cv:
                    roles.done[idx] = True
                    roles.turn = roles.next_turn(idx)
                    roles.cv.notify_all()
        workers = [threading.Thread(target=run, args=(k, b, t)) for k, (b, t) in enumerate(groups)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        self._roles = None
        if roles.error is not None:
            raise roles.error

    def _wait_until(self, ready, what: str) -> None:
        roles = getattr(self, "_roles", None)
        if roles is None:
            if not ready():
                raise InterpreterError(what)
            return
        me = roles.local.idx
        while not ready():
            with roles.cv:
                others = [k for k in range(roles.n) if k != me and not roles.done[k]]
                stuck = all(roles.blocked_at[k] == roles.version for k in others)
                if roles.error is not None or stuck:
                    roles.error = roles.error or InterpreterError("deadlock: " + what)
                    raise InterpreterError("deadlock: " + what)
                roles.blocked_at[me] = roles.version
                roles.turn = roles.next_turn(me)
                roles.cv.notify_all()
                while roles.turn != me:
                    roles.cv.wait()
                roles.blocked_at[me] = None
                if roles.error is not None:
                    raise roles.error

    def _SetMaxNReg(self, s, threads):
        pass

    def _Allocate(self, s, threads):
        b = s.buffer
        if b.memory == "local":
            for t in threads:
                t.locals[id(b)] = [POISON] * self._size(b, t)

    def _Comment(self, s, threads):
        pass

    def _BlockSync(self, s, threads):
        # A barrier publishes the cp.async data its threads' waits completed to the block.
        # (Block reductions are not counted: some synchronize with shuffles only.)
        if self.cp_kernel:
            blocks = {t.block for t in threads}
            for table in (self.cp_owner, self.cp_readers):
                for key in [key for key in table if key[0] in blocks]:
                    del table[key]

    def _ScalarDef(self, s, threads):
        for t in threads:
            t.env[s.var.name] = eval_expr(s.value, t.env)

    def _InitValue(self, s, threads):
        v = s.value
        val = self._scalar(v.scalar) if isinstance(v, K.ScalarValue) else v
        for t in threads:
            mem = self._mem(t, s.out)
            for j in range(len(mem)):
                mem[j] = round_to(s.out.dtype, val)

    def _TensorOp(self, s: K.TensorOp, threads):
        e = s.expr
        pred = compile_expr(s.predicate)
        for t in threads:
            if not pred(t.env):
                continue
            if s.vector > 1:
                if not isinstance(e, LoadStoreOp):
                    raise InterpreterError(f"vector op {type(e).__name__} is not a copy")
                vals = [self._read(t, s.ins[0], lane) for lane in range(s.vector)]
                for lane, v in enumerate(vals):
                    self._write(t, s.out, v, lane)
                continue
            ins = [self._read(t, x) for x in s.ins]
            if s.accumulate:
                acc = self._read(t, s.out)
                if POISON in (acc, ins[0]):
                    raise InterpreterError(f"{s.out!r} accumulates a value computed from unwritten "
                                           f"registers at {self._where(t)}")
                value = _REDUCE[e.op.value](acc, ins[0])
            elif any(x is POISON for x in ins):
                value = POISON
            else:
                value = self._compute(e, ins)
            self._write(t, s.out, value)

    def _compute(self, e, ins):
        if isinstance(e, UnaryOp):
            return _UNARY[e.op](ins[0])
        if isinstance(e, BinaryOp):
            return _BINARY[e.op](ins[0], ins[1])
        if isinstance(e, WhereOp):
            return ins[1] if ins[0] else ins[2]
        if isinstance(e, (LoadStoreOp, BroadcastOp, ExpandOp, SqueezeOp, ReshapeOp, FullOp)):
            return ins[0]
        raise InterpreterError(f"no rule for {type(e).__name__}")

    def _check_whole_grid(self, s, threads):
        if getattr(s, "barrier", None) is not None:
            # A named barrier's threads in every block (a warp-specialized kernel's compute
            # warp groups): each block sends exactly those.
            blocks = {t.block for t in self.all_threads}
            self._check_whole_blocks(s, threads)
            if {t.block for t in threads} != blocks:
                raise InterpreterError(f"{type(s).__name__} reached by "
                                       f"{len({t.block for t in threads})} of {len(blocks)} blocks")
            return
        if len(threads) != len(self.all_threads):
            raise InterpreterError(f"{type(s).__name__} reached by {len(threads)} of "
                                   f"{len(self.all_threads)} threads")

    def _check_whole_blocks(self, s, threads):
        """Every thread of each block that reaches a block-wide step reaches it (blocks of a
        persistent grid may run different numbers of iterations); with a named barrier, its
        thread count."""
        per_block = self.block[0] * self.block[1] * self.block[2]
        if getattr(s, "barrier", None) is not None:
            per_block = s.barrier[1]
        count: dict = {}
        for t in threads:
            count[t.block] = count.get(t.block, 0) + 1
        for b, c in count.items():
            if c != per_block:
                raise InterpreterError(f"{type(s).__name__} reached by {c} of {per_block} "
                                       f"threads of block {b}")

    def _BlockReduce(self, s: K.BlockReduce, threads):
        self._check_whole_blocks(s, threads)
        dims = set(s.dims)
        groups: dict = {}
        for t in threads:
            key = (t.block,) + tuple(t.env[f"threadIdx.{d}"] for d in "xyz" if d not in dims)
            groups.setdefault(key, []).append(t)
        op = _REDUCE[s.op]
        for ti in s.values:
            for grp in groups.values():
                for lane in range(max(ti.vector, 1)):
                    vals = [self._read(t, ti, lane) for t in grp]
                    if any(v is POISON for v in vals):
                        res = POISON
                    else:
                        res = vals[0]
                        for v in vals[1:]:
                            res = op(res, v)
                    for t in grp:
                        mem, idx = self._addr(t, ti, "block reduction of", max(ti.vector, 1))
                        mem[idx + lane] = round_to(ti.buffer.dtype, res)

    def _ClusterReduce(self, s: K.ClusterReduce, threads):
        """cluster_allreduce_row: thread x == 0 of each row of every CTA of a cluster publishes
        its value; every thread of the row gets the values reduced in rank order. Every thread
        of every CTA of the cluster must arrive (the cluster barrier inside)."""
        self._check_whole_blocks(s, threads)
        dims = self.k.launch.cluster
        if dims is None or dims["xyz".index(s.dim)] != s.size or self.block[2] != 1:
            raise InterpreterError(f"cluster reduction over {s.size} CTAs along {s.dim} in a "
                                   f"launch with cluster {dims} and block {self.block}")
        per_cluster = dims[0] * dims[1] * dims[2]
        ctas: dict = {}
        for t in threads:
            cluster = tuple(b // c for b, c in zip(t.block, dims))
            ctas.setdefault(cluster, set()).add(t.block)
        for cluster, members in ctas.items():
            if len(members) != per_cluster:
                raise InterpreterError(f"cluster reduction reached by {len(members)} of "
                                       f"{per_cluster} CTAs of cluster {cluster}")

        def rank(t):
            bx, by, bz = (b % c for b, c in zip(t.block, dims))
            return bx + dims[0] * (by + dims[1] * bz)
        ti = s.values[0]
        published: dict = {}
        for t in threads:
            if t.env["threadIdx.x"] == 0:
                key = (tuple(b // c for b, c in zip(t.block, dims)), t.env["threadIdx.y"])
                published.setdefault(key, {})[rank(t)] = self._read(t, ti)
        op = _REDUCE[s.op]
        for t in threads:
            vals = published[(tuple(b // c for b, c in zip(t.block, dims)), t.env["threadIdx.y"])]
            ordered = [vals[r] for r in range(per_cluster)]
            if any(v is POISON for v in ordered):
                res = POISON
            else:
                res = ordered[0]
                for v in ordered[1:]:
                    res = op(res, v)
            mem, idx = self._addr(t, ti, "cluster reduction of", 1)
            mem[idx] = round_to(ti.buffer.dtype, res)

    def _GridReduce(self, s: K.GridReduce, threads):
        self._check_whole_grid(s, threads)
        red_t = set(getattr(s, "thread_dims", ()))
        red_b = set(s.dims)
        groups: dict = {}
        for t in threads:
            if any(t.env[f"threadIdx.{d}"] != 0 for d in red_t):
                continue   # not a writer
            key = (tuple(t.env[f"blockIdx.{d}"] for d in "xyz" if d not in red_b) +
                   tuple(t.env[f"threadIdx.{d}"] for d in "xyz" if d not in red_t))
            groups.setdefault(key, []).append(t)

        def red_index(t):
            v = 0
            for d in sorted(red_b, reverse=True):
                v = v * self.grid["xyz".index(d)] + t.env[f"blockIdx.{d}"]
            return v
        op = _REDUCE[s.op]
        last = {}
        for grp in groups.values():
            grp.sort(key=red_index)
            for ti in s.values:
                for lane in range(max(ti.vector, 1)):
                    vals = [self._read(t, ti, lane) for t in grp]
                    res = POISON if any(v is POISON for v in vals) else vals[0]
                    if res is not POISON:
                        for v in vals[1:]:
                            res = op(res, v)
                    mem, idx = self._addr(grp[-1], ti, "grid reduction of", max(ti.vector, 1))
                    mem[idx + lane] = round_to(ti.buffer.dtype, res)
            last_block = grp[-1].block
            last[tuple(b for b, d in zip(last_block, "xyz") if d not in red_b)] = last_block
        for t in threads:
            kept = tuple(b for b, d in zip(t.block, "xyz") if d not in red_b)
            t.env["pf_grid_last"] = last.get(kept) == t.block

    # mbarriers and bulk copies (lockstep model: a copy lands when it is issued) --------------
    def _mbar(self, t, ref: K.MBarrierRef) -> dict:
        bars = self.mbarriers.get((t.block, id(ref.bars)))
        if bars is None:
            raise InterpreterError(f"mbarrier {ref!r} used before its allocation")
        k = eval_expr(ref.index, t.env)
        if not 0 <= k < len(bars):
            raise InterpreterError(f"mbarrier index {k} outside [0, {len(bars)}) of {ref.bars.name}")
        bar = bars[k]
        if bar is None or bar.get("invalid"):
            raise InterpreterError(f"mbarrier {ref.bars.name}[{k}] used while not initialized "
                                   f"at {self._where(t)}")
        return bar

    def _maybe_complete(self, bar) -> None:
        if bar["arrived"] == bar["count"] and bar["tx"] == 0:
            bar["phase"] += 1
            bar["arrived"] = 0
            roles = getattr(self, "_roles", None)
            if roles is not None:
                roles.version += 1

    def _MBarrierAlloc(self, s, threads):
        if not hasattr(self, "mbarriers"):
            self.mbarriers = {}
        for t in threads:
            self.mbarriers.setdefault((t.block, id(s.bars)), [None] * s.bars.count)

    def _MBarrierInit(self, s, threads):
        for t in threads:
            k = eval_expr(s.bar.index, t.env)
            self.mbarriers[(t.block, id(s.bar.bars))][k] = {
                "count": eval_expr(s.arrivals, t.env), "arrived": 0, "tx": 0, "phase": 0}

    def _FenceMBarrierInit(self, s, threads):
        pass

    def _MBarrierArrive(self, s, threads):
        for t in threads:
            bar = self._mbar(t, s.bar)
            bar["arrived"] += 1
            if bar["arrived"] > bar["count"]:
                raise InterpreterError(f"{s.bar!r}: more arrivals than its count {bar['count']}")
            self._maybe_complete(bar)

    def _MBarrierWait(self, s, threads):
        for t in threads:
            bar = self._mbar(t, s.bar)
            parity = eval_expr(s.parity, t.env)
            # The phase of parity P has completed when the completed count's parity differs.
            self._wait_until(
                lambda: bar["phase"] % 2 != parity,
                f"wait on {s.bar!r} parity {parity} would never return (phases completed: "
                f"{bar['phase']}, arrivals {bar['arrived']}/{bar['count']}, pending bytes "
                f"{bar['tx']}) at {self._where(t)}")

    def _MBarrierInval(self, s, threads):
        for t in threads:
            self._mbar(t, s.bar)["invalid"] = True

    def _BulkLoad(self, s, threads):
        pred = compile_expr(s.predicate)
        for t in threads:
            if not pred(t.env):
                continue
            bar = self._mbar(t, s.bar)
            nbytes = eval_expr(s.bytes, t.env)
            size = s.dst.buffer.dtype.size
            if nbytes % 16 or nbytes % size:
                raise InterpreterError(f"bulk copy of {nbytes} bytes is not a multiple of 16")
            n = nbytes // size
            src, i = self._addr(t, s.src, "bulk copy source", n)
            dst, j = self._addr(t, s.dst, "bulk copy destination", n)
            if (i * size) % 16 or (j * size) % 16:
                raise InterpreterError(f"bulk copy {s.src!r} -> {s.dst!r}: element offsets {i}, "
                                       f"{j} are not 16-byte aligned")
            bar["tx"] += nbytes
            dst[j:j + n] = src[i:i + n]
            bar["tx"] -= nbytes
            self._maybe_complete(bar)

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

    def _TensorMapLoad(self, s, threads):
        pred = compile_expr(s.predicate)
        for t in threads:
            if not pred(t.env):
                continue
            row_map, rows, row_stride = self.tensor_maps[s.tmap.name]
            if s.map != row_map or s.source.memory != "global":
                raise InterpreterError(f"{s.tmap!r} describes {row_map}, the copy says {s.map}")
            bar = self._mbar(t, s.bar)
            inner, pieces, box_rows = row_map.box
            size = s.dst.buffer.dtype.size
            nbytes = eval_expr(s.bytes, t.env)
            if nbytes != inner * pieces * box_rows * size:
                raise InterpreterError(f"tensor-map copy expects {nbytes} bytes for a box of "
                                       f"{inner * pieces * box_rows * size}")
            c0, c1, c2 = (eval_expr(c, t.env) for c in s.coords)
            dst, j = self._addr(t, s.dst, "tensor-map destination", inner * pieces * box_rows)
            if (j * size) % 128:
                raise InterpreterError(f"tensor-map destination {s.dst!r} at element {j} is not "
                                       "128-byte aligned")
            src = self.globals[id(s.source)]
            bar["tx"] += nbytes
            for r in range(box_rows):
                for b in range(pieces):
                    for a in range(inner):
                        row, piece, col = c2 + r, c1 + b, c0 + a
                        inside = row < rows and piece < pieces and col < inner
                        value = src[row * row_stride + piece * inner + col] if inside else 0.0
                        dst[j + (r * pieces + b) * inner + a] = value
            bar["tx"] -= nbytes
            self._maybe_complete(bar)

    # cp.async (asynchronous per thread): a copy reads its source when issued, but its data
    # lands only at the wait_group that completes its group; until then the destination reads
    # as POISON. Landed data is visible to the issuing thread alone until a block barrier, so a
    # missing or short wait, or a missing barrier before another thread reads, fails a test.
    def _CpAsyncCopy(self, s, threads):
        pred = compile_expr(s.predicate)
        size = s.dst.buffer.dtype.size
        if s.bytes not in (4, 8, 16) or s.bytes % size:
            raise InterpreterError(f"cp.async of {s.bytes} bytes of {size}-byte elements")
        n = s.bytes // size
        for t in threads:
            if not pred(t.env):
                continue
            src, i = self._addr(t, s.src, "cp.async source", n)
            dst, j = self._addr(t, s.dst, "cp.async destination", n)
            if self.check_alignment and ((i * size) % s.bytes or (j * size) % s.bytes):
                raise InterpreterError(f"cp.async {s.src!r} -> {s.dst!r}: element offsets {i}, "
                                       f"{j} are not {s.bytes}-byte aligned at {self._where(t)}")
            key = (t.block, id(s.dst.buffer))
            inflight = self.cp_inflight.setdefault(key, {})
            readers = self.cp_readers.get(key, {})
            for e in range(j, j + n):
                if readers.get(e, t) is not t:
                    who = readers[e] if isinstance(readers[e], str) else "thread " + ", ".join(
                        f"{d}={readers[e].env[d]}" for d in ("threadIdx.x", "threadIdx.y"))
                    raise InterpreterError(f"cp.async into {s.dst!r} (element {e}), which {who} "
                                           f"read with no block barrier since, at "
                                           f"{self._where(t)}")
                if e in inflight:
                    raise InterpreterError(f"cp.async into {s.dst!r} (element {e}) while an "
                                           f"earlier copy into it is in flight at "
                                           f"{self._where(t)}")
                inflight[e] = t
            values = [round_to(s.dst.buffer.dtype, v) for v in src[i:i + n]]
            dst[j:j + n] = [POISON] * n
            t.cp_open.append((dst, j, values, key))

    def _CpAsyncCommit(self, s, threads):
        for t in threads:
            t.cp_groups.append(t.cp_open)
            t.cp_open = []

    def _CpAsyncWait(self, s, threads):
        for t in threads:
            while len(t.cp_groups) > s.pending:
                for dst, j, values, key in t.cp_groups.pop(0):
                    dst[j:j + len(values)] = values
                    owner = self.cp_owner.setdefault(key, {})
                    for e in range(j, j + len(values)):
                        owner[e] = t
                        del self.cp_inflight[key][e]


def _storage_of(x: torch.Tensor) -> list:
    """A flat list holding `x` at its strides (broadcast dims of stride 0 included)."""
    if x.numel() == 0:
        return []
    span = 1 + sum((s - 1) * abs(st) for s, st in zip(x.shape, x.stride()))
    flat = torch.full((span,), math.nan, dtype=torch.float64)
    offsets = torch.zeros((), dtype=torch.long)
    for d, (size, st) in enumerate(zip(x.shape, x.stride())):
        shape = [1] * x.dim()
        shape[d] = size
        offsets = offsets + (torch.arange(size) * st).reshape(shape)
    flat[offsets.expand(x.shape).reshape(-1)] = x.to(torch.float64).reshape(-1)
    return flat.tolist()

def interpret(kernel, bindings, inputs, **kw) -> tuple[list, Interpreter]:
    it = Interpreter(kernel, bindings, **kw)
    return it.run(inputs), it

