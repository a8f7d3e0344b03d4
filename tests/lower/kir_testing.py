"""Test utilities for lowering, codegen and scheduler tests (CPU only).

- `eval_expr(e, env)`: the value of a kernel expression (K.Var/Special names -> ints in `env`),
  with C semantics for / and % (truncation toward zero).
- `lower_upto(fusion, last)`: run the PIPELINE passes one at a time up to `last`, verifying the
  kernel IR after each (pyfuser.kir.verifier).
- `skeleton(body)`: a compact text of a kernel body's structure (loops, allocations, ops, syncs).
- `Interpreter`, `interpret`: the kernel-IR interpreter of pyfuser.runtime.interpreter,
  re-exported.
- `setup(fd, inputs, device)`: a scheduler's inputs as explain builds them: the clone, RuntimeInfo
  with InputFacts and the device table, and the bindings of the symbolic extents.

Test files import it after putting tests/lower on sys.path (pytest runs with
--import-mode=importlib, which does not).
"""
from __future__ import annotations

import torch

from pyfuser import options
from pyfuser.ir.tensor import TensorView
from pyfuser.kir import nodes as K
from pyfuser.kir.printer import kernel_str
from pyfuser.lower import verify
from pyfuser.lower import PIPELINE, pipeline_of
from pyfuser.lower.context import LoweringContext
from pyfuser.runtime.interpreter import (  # noqa: F401 - re-exported for the tests
    POISON, Interpreter, InterpreterError, compile_expr, eval_expr, expr_vars, interpret,
    py_source, round_to)


# Lowering step by step ------------------------------------------------------------------------
PASS_NAMES = [p.__name__ for p in PIPELINE]


def lower_upto(fusion, last: str | None = None, name: str = "k", index_type: str = "int",
               texts: dict | None = None) -> K.Kernel:
    """Run the fusion's passes (lower.pipeline_of: PIPELINE, or MATMUL_PIPELINE) up to and
    including pass `last` (all when None), verifying after each;
    `texts` (if given) receives the kernel IR text after each pass."""
    passes = pipeline_of(fusion)
    if last is not None and last not in [p.__name__ for p in passes]:
        raise ValueError(f"unknown pass {last!r}")
    kernel = K.Kernel(name, fusion, index_type=index_type)
    kernel.ctx = LoweringContext(fusion)
    for p in passes:
        kernel = p(kernel)
        verify(kernel, after=p.__name__)
        if texts is not None:
            texts[p.__name__] = kernel_str(kernel)
        if p.__name__ == last:
            break
    return kernel


def ops(kernel_or_body) -> list:
    body = kernel_or_body.body if isinstance(kernel_or_body, K.Kernel) else kernel_or_body
    return [s for s in K.walk(body) if isinstance(s, K.TensorOp)]


def op_writing(kernel, tv_or_name) -> K.TensorOp:
    """The (single) TensorOp whose output is tensor `tv` (fusion Val or buffer name Tn)."""
    found = []
    for s in ops(kernel):
        o = s.out
        if o is tv_or_name or (isinstance(o, K.TensorIndex) and (o.buffer.name == tv_or_name or
                                                                 o.buffer.tv is tv_or_name)):
            found.append(s)
    assert len(found) == 1, (tv_or_name, found)
    return found[0]


def enclosing(kernel, target) -> list:
    """The statements (ForLoops / IfThenElses) around `target`, outermost first."""
    def rec(body, path):
        for s in body:
            if s is target:
                return path
            if isinstance(s, K.ForLoop):
                r = rec(s.body, path + [s])
                if r is not None:
                    return r
            elif isinstance(s, K.IfThenElse):
                r = rec(s.then_body, path + [s]) or rec(s.else_body, path + [s])
                if r is not None:
                    return r
        return None
    out = rec(kernel.body, [])
    assert out is not None, f"{target!r} is not in the kernel"
    return out


def loop_points(kernel, stmt, env0: dict):
    """Every assignment of the variables of the ForLoops around `stmt` (a thread or block loop's
    variable is its threadIdx/blockIdx name), each as env0 updated: dicts for eval_expr."""
    loops = [s for s in enclosing(kernel, stmt) if isinstance(s, K.ForLoop)]

    def rec(i, env):
        if i == len(loops):
            yield dict(env)
            return
        f = loops[i]
        for v in range(eval_expr(f.start, env), eval_expr(f.stop, env)):
            env[f.var.name] = v
            yield from rec(i + 1, env)
        env.pop(f.var.name, None)
    yield from rec(0, dict(env0))


def _op_name(s: K.TensorOp) -> str:
    e = s.expr
    return getattr(getattr(e, "op", None), "value", type(e).__name__)


def _val_name(v) -> str:
    if isinstance(v, TensorView):
        return f"T{v.name}"
    if isinstance(v, K.TensorIndex):
        return v.buffer.name
    return repr(v)


def skeleton(body) -> list:
    """Structure of a kernel body as nested lists of short strings:
    'for S[9]' / 'for TIDx[4]' followed by a list of its body, 'alloc local T2[1]',
    'T3 = add(T0, T2)', 'init T2', 'block_reduce<x> T2', 'grid_reduce<y> T3', 'sync',
    'if' + [then]. Predicates and indices are left out (tests check those separately)."""
    out = []
    for s in body:
        if isinstance(s, K.ForLoop):
            kind = {"Serial": "S"}.get(s.parallel, s.parallel)
            out.append(f"for {kind}[{s.stop!r}]")
            out.append(skeleton(s.body))
        elif isinstance(s, K.IfThenElse):
            out.append("if")
            out.append(skeleton(s.then_body))
        elif isinstance(s, K.Allocate):
            out.append(f"alloc {s.buffer.memory} {s.buffer.name}[{s.buffer.size!r}]")
        elif isinstance(s, K.TensorOp):
            vec = f" <{s.vector}>" if s.vector > 1 else ""
            out.append(f"{_val_name(s.out)} = {_op_name(s)}({', '.join(_val_name(i) for i in s.ins)}){vec}")
        elif isinstance(s, K.InitValue):
            out.append(f"init {s.out.name}")
        elif isinstance(s, K.BlockReduce):
            out.append(f"block_reduce<{','.join(s.dims)}> {s.tv and 'T%s' % s.tv.name}")
        elif isinstance(s, K.GridReduce):
            out.append(f"grid_reduce<{','.join(s.dims)}> {getattr(s, 'tv', None) and 'T%s' % s.tv.name}")
        elif isinstance(s, K.BlockSync):
            out.append("sync")
        else:
            out.append(type(s).__name__)
    return out


# Scheduler setup --------------------------------------------------------------------------------
class Setup:
    """alignment: bytes for every input, a list (one per input), or None: from data_ptr()."""

    def __init__(self, fd, inputs, device="h100", alignment=None, clone=True):
        from pyfuser.runtime.device import get_device_properties
        from pyfuser.runtime.inputs import check_inputs
        from pyfuser.schedule.roles import scheduling_clone
        from pyfuser.schedule.schedulers.base import InputFacts, RuntimeInfo, facts_per_input
        self.fd = fd
        self.inputs = list(inputs)
        self.orig_bindings = check_inputs(fd.fusion, inputs)
        if clone:      # as the executor schedules it: roles separated (schedule/roles.py)
            self.fusion, mapping = scheduling_clone(fd.fusion)
            self.bindings = {mapping[id(k)]: v for k, v in self.orig_bindings.items()
                             if id(k) in mapping}
        else:
            self.fusion, self.bindings = fd.fusion, dict(self.orig_bindings)
        if alignment is None:      # as the executor sees it: from the data pointers
            from pyfuser.runtime.executor import _alignment
            aligns = [_alignment(x.data_ptr()) if isinstance(x, torch.Tensor) else None
                      for x in inputs]
        elif isinstance(alignment, (list, tuple)):
            aligns = alignment
        else:
            aligns = [alignment] * len(inputs)
        self.facts = tuple(
            InputFacts(tuple(x.shape), tuple(x.stride()), a) if isinstance(x, torch.Tensor) else None
            for x, a in zip(inputs, aligns))
        self.device = get_device_properties(device)
        self.info = RuntimeInfo(self.bindings, facts_per_input(self.fusion, self.facts),
                                self.device, options.current())


def empty_inputs(name: str, M: int, N: int, dtype="bf16") -> list:
    """Uninitialized inputs of catalogue fusion `name` for shape (M, N) (heuristics and codegen
    read only sizes and strides)."""
    from pyfuser import catalogue
    small = catalogue.make_inputs(name, 3, 5, dtype, seed=0)
    return [torch.empty([{3: M, 5: N, 1: 1}[d] for d in x.shape], dtype=x.dtype) for x in small]


def setup(fd, inputs, device="h100", alignment=None) -> Setup:
    return Setup(fd, inputs, device, alignment)


def schedule_and_lower(fd, inputs, params=None, device="h100", alignment=None, scheduler=None,
                       index_type="int", name="k"):
    """Choose (or take) a scheduler, compute (or take) its heuristic, schedule a clone and lower
    it with the verifier on. Returns (Setup, scheduler, params, kernel)."""
    from pyfuser.schedule.schedulers import registry
    st = setup(fd, inputs, device, alignment)
    if scheduler is None:
        choice = registry.choose(fd.fusion)
        assert choice.scheduler is not None, choice.reason
        scheduler = choice.scheduler
    if params is None:
        params = scheduler.compute_heuristics(st.fusion, st.info)
    scheduler.schedule(st.fusion, params)
    kernel = lower_upto(st.fusion, None, name=name, index_type=index_type)
    return st, scheduler, params, kernel


def clone_bindings(fd, mapping: dict, inputs) -> dict:
    """Symbolic extents of a clone (`f, mapping = fd.fusion.clone()`) bound for `inputs`."""
    from pyfuser.runtime.inputs import check_inputs
    b = check_inputs(fd.fusion, inputs)
    return {mapping[id(s)]: v for s, v in b.items() if id(s) in mapping}


def reference(fd, inputs) -> list:
    from pyfuser.runtime.inputs import check_inputs
    from pyfuser.runtime.reference import evaluate
    return evaluate(fd.fusion, inputs, extent_bindings=check_inputs(fd.fusion, inputs))


def forced_inner_persistent(fd, inputs, feature: str, **changes):
    """The inner persistent heuristic with `feature` (tma_inner_persistent or
    ws_inner_persistent) forced on, then `changes` applied (stages without prefetch gets
    prefetch = stages - 1). Fails if the forced variant was not possible."""
    import dataclasses

    from pyfuser.schedule.schedulers import inner_persistent as ip
    with options.override(enable=[feature]):
        st = setup(fd, inputs)
        p = ip.compute_heuristics(st.fusion, st.info)
    assert p.stages >= 2 and p.warp_specialized == (feature == "ws_inner_persistent"), p.reason
    if "stages" in changes and "prefetch" not in changes:
        changes["prefetch"] = changes["stages"] - 1
    return dataclasses.replace(p, **changes)


def lowered_inner_persistent(name, M, N, dtype, feature: str, **changes):
    """Catalogue fusion `name` on fresh inputs, lowered with the forced variant:
    (fd, inputs, Setup, params, kernel)."""
    from pyfuser import catalogue
    from pyfuser.schedule.schedulers import inner_persistent as ip
    fd = catalogue.define(name, dtype)
    inputs = catalogue.make_inputs(name, M, N, dtype, seed=1)
    params = forced_inner_persistent(fd, inputs, feature, **changes)
    st, _, params, kernel = schedule_and_lower(fd, inputs, params=params, scheduler=ip)
    return fd, inputs, st, params, kernel


def compile_clean(src: str):
    """NVRTC-compile generated CUDA for sm_90a and assert a clean ptxas report: no spills, no
    stack frame, no warning (ptxas' "setmaxnreg ignored" among them). Returns the report."""
    import pytest
    pytest.importorskip("cuda.bindings.nvrtc")
    from pyfuser.runtime.nvrtc import compile_to_cubin
    rep = compile_to_cubin(src, "k", arch="sm_90a").ptxas
    assert (rep.spill_store_bytes, rep.spill_load_bytes, rep.stack_frame_bytes) == (0, 0, 0), \
        rep.summary()
    assert rep.warnings == (), rep.warnings
    return rep


def interpret_against_float64(fd, st, kernel, inputs, context=None) -> tuple[list, Interpreter]:
    """Interpret `kernel` (lowered from fd by schedule_and_lower, `st` its setup) on `inputs`;
    every output within the issue's tolerance of the float64 reference evaluator, and each
    output element in memory (an expanded dim, stride 0, holds one for all) written exactly
    once (the interpreter checks that too; counted here as well so a test states it). Returns
    (outputs, interpreter); `context` goes into the assertion messages."""
    import math

    from pyfuser.ir.dtype import from_torch
    from pyfuser.runtime.inputs import check_inputs, output_strides
    from pyfuser.runtime.reference import evaluate
    from pyfuser.testing import TOLERANCE, rel_error
    outs, it = interpret(kernel, st.bindings, inputs)
    refs = evaluate(fd.fusion, list(inputs), promote_to_double=True,
                    extent_bindings=check_inputs(fd.fusion, inputs))
    for j, (o, r) in enumerate(zip(outs, refs)):
        err = rel_error(o, r)
        assert err <= TOLERANCE[from_torch(o.dtype)], (j, err, context)
        buf = next(q.name for q in kernel.params if q.source == ("output", j))
        counts = [n for (b, _), n in it.writes.items() if b == buf]
        strides = output_strides(fd.fusion.outputs[j], list(r.shape))
        stored = math.prod(n for n, s in zip(r.shape, strides) if s != 0)
        assert len(counts) == stored and set(counts) <= {1}, (j, sorted(set(counts)), context)
    return outs, it


def batchnorm_backward_sums(dtype=None, second_op: str = "sum"):
    """BatchNorm backward's sums over N, H, W of channels-last images, sum(dy) and
    sum(dy * (x - mean) * rstd) (`second_op` "max": that product's max, a sibling of another
    op): an outer reduction of two inputs read at every step beside two per-channel fp32
    inputs read once. `dtype` of x and dy: float32 by default."""
    from pyfuser import DataType, FusionDefinition
    dtype = DataType.Float if dtype is None else dtype
    per_channel = [True, False, True, True]
    with FusionDefinition() as fd:
        x, dy = (fd.ops.cast(fd.define_tensor([-1, -1, -1, -1], dtype=dtype,
                                              stride_order=[3, 0, 2, 1]), DataType.Float)
                 for _ in range(2))
        mean, rstd = fd.define_tensor([-1]), fd.define_tensor([-1])
        xhat = fd.ops.mul(fd.ops.sub(x, fd.ops.broadcast(mean, per_channel)),
                          fd.ops.broadcast(rstd, per_channel))
        fd.add_output(fd.ops.sum(dy, [0, 2, 3]))
        fd.add_output(getattr(fd.ops, second_op)(fd.ops.mul(dy, xhat), [0, 2, 3]))
    return fd
