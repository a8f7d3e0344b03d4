"""The kernel-IR interpreter itself (runtime/interpreter.py), run vectorized over the threads:
NaN through maximum / minimum and max / min reductions as the generated code computes them,
exact integer data, the vectorized rounding, the fusions the timings record (tools/
interpreter_timings.py, bench/results/2026-11-23-interpreter-timings.md) against the float64
reference, unwritten registers reaching memory (POISON), several threads storing one element
(unchecked: the last wins; checked: an output element written twice or never fails),
a cp.async copy over one in flight, a warp-specialized producer copying short rows, barriers
some threads skip, and the size limits. The lowering tests (tests/lower) are its main test
bed."""
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lower"))
from kir_testing import (Interpreter, InterpreterError, compile_clean, interpret,  # noqa: E402
                         lowered_inner_persistent, ops, schedule_and_lower)
from pyfuser import DataType, FusionDefinition, catalogue  # noqa: E402
from pyfuser.ir.exprs import UnaryOp  # noqa: E402
from pyfuser.kir import nodes as K  # noqa: E402
from pyfuser.runtime.inputs import check_inputs  # noqa: E402
from pyfuser.runtime.interpreter import _integer_pow, _round_array, round_to  # noqa: E402
from pyfuser.runtime.reference import evaluate  # noqa: E402

INTERPRET = {"enable": ["interpret"]}


def _interpreted(fd, inputs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # no fallback to the reference
        outs = fd.execute(inputs, options=INTERPRET)
    assert (fd.last_run.kind, fd.last_run.backend) == ("kernels", "interpreter")
    return outs


def _reference64(fd, inputs):
    return evaluate(fd.fusion, inputs, promote_to_double=True,
                    extent_bindings=check_inputs(fd.fusion, inputs))


def _parent_body(body, stmt):
    """The statement list holding `stmt`."""
    if any(s is stmt for s in body):
        return body
    for s in body:
        for sub in ((s.body,) if isinstance(s, K.ForLoop) else
                    (s.then_body, s.else_body) if isinstance(s, K.IfThenElse) else ()):
            found = _parent_body(sub, stmt)
            if found is not None:
                return found
    return None


# NaN, as pf::maximum / pf::minimum (max.NaN) and pf::OpMax / OpMin compute it ------------------
def test_maximum_and_minimum_propagate_nan_from_either_operand():
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=DataType.Float)
        b = fd.define_tensor([-1, -1], dtype=DataType.Float)
        fd.add_output(fd.ops.maximum(a, b))
        fd.add_output(fd.ops.minimum(a, b))
    x, y = torch.randn(4, 32), torch.randn(4, 32)
    x[0, 3] = y[1, 5] = x[2, 7] = y[2, 7] = math.nan
    mx, mn = _interpreted(fd, [x, y])
    torch.testing.assert_close(mx, torch.maximum(x, y), equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(mn, torch.minimum(x, y), equal_nan=True, rtol=0, atol=0)
    assert mx[1, 5].isnan() and mn[0, 3].isnan()


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_and_min_reductions_propagate_nan(op):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        fd.add_output(getattr(fd.ops, op)(x, [1]))
    x = torch.randn(6, 1024)
    for row, col in [(0, 0), (1, 1), (2, 517), (3, 1023)]:   # first, within, across threads, last
        x[row, col] = math.nan
    (out,) = _interpreted(fd, [x])
    expected = x.amax(1) if op == "max" else x.amin(1)
    torch.testing.assert_close(out, expected, equal_nan=True, rtol=0, atol=0)
    assert out[:4].isnan().all() and not out[4:].isnan().any()


# Data types -----------------------------------------------------------------------------------
def test_integer_data_stays_exact_int64():
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1], dtype=DataType.Int)
        b = fd.define_tensor([-1], dtype=DataType.Int)
        fd.add_output(fd.ops.add(a, b))
    x = torch.tensor([2 ** 60 + 1, -5, 7, 2 ** 53 + 1] * 8)
    y = torch.tensor([3, 2 ** 61 + 3, -9, 1] * 8)
    (out,) = _interpreted(fd, [x, y])
    assert out.dtype == torch.int64 and torch.equal(out, x + y)


def test_vectorized_rounding_matches_torch_and_the_scalar_form():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=g, dtype=torch.float64) * 3
    # bf16 ties (the dropped half is exactly 0x8000), both parities, and the special values
    ties = torch.tensor([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -(1.0 + 2 ** -8), 65504.0,
                         3.4e38, -3.4e38, math.inf, -math.inf, math.nan, 0.0, -0.0, 1e-40],
                        dtype=torch.float64)
    x = torch.cat([x, ties])
    for dt, t in [(DataType.BFloat16, torch.bfloat16), (DataType.Half, torch.float16),
                  (DataType.Float, torch.float32)]:
        with np.errstate(over="ignore"):                # 3.4e38 overflows fp16
            got = torch.from_numpy(_round_array(dt, x.numpy()))
        want = x.to(torch.float32).to(t).double() if t is torch.bfloat16 else x.to(t).double()
        torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)
        scalar = [round_to(dt, float(v)) for v in x]
        torch.testing.assert_close(got, torch.tensor(scalar, dtype=torch.float64),
                                   equal_nan=True, rtol=0, atol=0)
    # A float stored to an integer buffer truncates; NaN gives 0, out of range saturates.
    ints = _round_array(DataType.Int32, np.array([2.7, -2.7, math.nan, 1e12, -1e12]))
    assert ints.tolist() == [2, -2, 0, 2 ** 31 - 1, -2 ** 31]


def test_16_bit_rounding_goes_through_float32_as_torch_and_pf_cast():
    # pf::cast (types.cuh) converts double and int64 to fp16 / bf16 through float32, as torch's
    # c10::Half(float) / c10::BFloat16(float) do: values just above a 16-bit tie that float32
    # rounds onto the tie, which then rounds to even (directly rounded, they would round up).
    doubles = np.array([1 + 2 ** -11 + 2 ** -40, 1 + 2 ** -8 + 2 ** -40])
    ints = np.array([4096 + 2 + 1, 2 ** 30 + 2 ** 22 + 1, 2 ** 62 + 2 ** 54 + 1], dtype=np.int64)
    for dt, t in [(DataType.Half, torch.float16), (DataType.BFloat16, torch.bfloat16)]:
        for x in (doubles, ints):
            with np.errstate(over="ignore"):
                got = _round_array(dt, x)
            want = torch.from_numpy(x).to(t).double().numpy()
            assert got.tolist() == want.tolist(), (dt, x, got, want)
            assert [round_to(dt, v) for v in x.tolist()] == want.tolist()
    assert _round_array(DataType.Half, doubles[:1]).tolist() == [1.0]
    assert _round_array(DataType.BFloat16, doubles[1:]).tolist() == [1.0]


@pytest.mark.parametrize("bits", [32, 64])
def test_integer_pow_is_torch_integer_pow(bits):
    # Exact (no float64 power: 3**39 is not a double), wrapping like the multiply, and a negative
    # exponent gives 1 / x truncated, as torch.pow of integer tensors.
    dt = {32: DataType.Int32, 64: DataType.Int}[bits]
    tt = {32: torch.int32, 64: torch.int64}[bits]
    base = np.array([-3, -2, -1, 0, 1, 2, 3, 7, 70000, 2 ** 31 - 1], dtype=np.int64)
    for e in (-3, -2, -1, 0, 1, 2, 3, 5, 39, 63):
        got = _round_array(dt, _integer_pow(base, np.full_like(base, e)))
        want = torch.pow(torch.from_numpy(base).to(tt), torch.full((len(base),), e, dtype=tt))
        assert got.tolist() == want.tolist(), e
    assert _integer_pow(3, 39) == 3 ** 39 and _integer_pow(-1, -3) == -1


UNARY = ["neg", "abs", "relu", "exp", "exp2", "log", "sqrt", "rsqrt", "reciprocal", "tanh",
         "sigmoid", "erf", "silu"]
BINARY = ["add", "sub", "mul", "div", "pow", "maximum", "minimum"]
COMPARE = ["eq", "ne", "lt", "le", "gt", "ge"]


def _float_ops(fd):
    x = fd.define_tensor([-1, -1], dtype=DataType.Float)           # positive
    y = fd.define_tensor([-1, -1], dtype=DataType.Float)
    for name in UNARY:
        fd.add_output(getattr(fd.ops, name)(y if name in ("neg", "abs", "relu") else x))
    for name in BINARY:
        fd.add_output(getattr(fd.ops, name)(x, y if name != "pow" else x))
    for name in COMPARE:
        fd.add_output(getattr(fd.ops, name)(y, x))
    fd.add_output(fd.ops.gelu(y, approximate="none"))
    fd.add_output(fd.ops.gelu(y, approximate="tanh"))
    big = fd.ops.gt(y, 0.5)
    fd.add_output(fd.ops.where(big, x, fd.ops.mul(y, 2.0)))
    fd.add_output(fd.ops.logical_or(fd.ops.logical_not(big), fd.ops.logical_and(big, big)))


def _casts(fd):
    fd.define_tensor([-1, -1], dtype=DataType.Float)
    y = fd.define_tensor([-1, -1], dtype=DataType.Float)
    for dt in (DataType.Double, DataType.Half, DataType.BFloat16, DataType.Bool, DataType.Int32):
        fd.add_output(fd.ops.cast(fd.ops.mul(y, 1000.0), dt))      # int32: truncation


def _int_ops(fd):
    i = fd.define_tensor([-1, -1], dtype=DataType.Int)
    fd.add_output(fd.ops.add(i, fd.ops.mul(i, 3)))
    fd.add_output(fd.ops.maximum(fd.ops.neg(i), fd.ops.abs(i)))


@pytest.mark.parametrize("build", [_float_ops, _casts, _int_ops])
def test_every_op_and_dtype_matches_the_reference(build):
    """Each unary, binary and comparison op, where, the logical ops, both gelus, casts to every
    dtype and int64 arithmetic, against the reference evaluator (which computes op by op in the
    fusion's dtypes, as the kernel does). (Float and int64 outputs are separate fusions: the
    pointwise scheduler fails on their mix today.)"""
    with FusionDefinition() as fd:
        build(fd)
    g = torch.Generator().manual_seed(3)
    inputs = ([torch.randint(-2 ** 40, 2 ** 40, (5, 48), generator=g)] if build is _int_ops else
              [torch.rand(5, 48, generator=g) + 0.25, torch.randn(5, 48, generator=g)])
    outs = _interpreted(fd, inputs)
    refs = evaluate(fd.fusion, inputs, extent_bindings=check_inputs(fd.fusion, inputs))
    assert len(outs) == len(refs) == len(fd.fusion.outputs)
    for k, (o, r) in enumerate(zip(outs, refs)):
        assert o.dtype == r.dtype, (k, o.dtype, r.dtype)
        torch.testing.assert_close(o, r, rtol=0 if o.dtype == torch.int64 else None,
                                   atol=0 if o.dtype == torch.int64 else None,
                                   msg=lambda m: f"output {k}: {m}")


# The fusions of the recorded timings, against the float64 reference --------------------------
def _pointwise_8_ops():
    """The pointwise fusion of tools/interpreter_timings.py."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        y = fd.define_tensor([-1, -1], dtype=DataType.Float)
        a = fd.ops.add(x, y)
        b = fd.ops.mul(a, x)
        c = fd.ops.exp(fd.ops.neg(b))
        d = fd.ops.div(a, fd.ops.add(c, 1.0))
        fd.add_output(fd.ops.maximum(fd.ops.tanh(d), y))
    return fd


@pytest.mark.parametrize("case", ["pointwise 8 ops 128x128", "layernorm_fwd 4x1024"])
def test_timed_fusions_match_the_float64_reference(case):
    if case.startswith("pointwise"):
        g = torch.Generator().manual_seed(0)
        fd = _pointwise_8_ops()
        inputs = [torch.randn(128, 128, generator=g), torch.randn(128, 128, generator=g)]
    else:
        fd = catalogue.define("layernorm_fwd", "fp32")
        inputs = catalogue.make_inputs("layernorm_fwd", 4, 1024, "fp32", seed=0)
    for _ in range(2):                       # the second call runs the cached plan
        outs = _interpreted(fd, inputs)
        for o, r in zip(outs, _reference64(fd, inputs)):
            assert o.dtype == torch.float32
            torch.testing.assert_close(o.double(), r, rtol=1e-5, atol=1e-5)


# POISON: values computed from unwritten registers ----------------------------------------------
def _neg_kernel(M=128, N=64):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        fd.add_output(fd.ops.neg(x))
    x = torch.randn(M, N)
    st, _, _, k = schedule_and_lower(fd, [x], device="h100-4sm")
    return fd, x, st, k


def test_an_unwritten_register_reaching_global_memory_fails():
    fd, x, st, k = _neg_kernel()
    load = next(s for s in ops(k) if s.ins[0].buffer.memory == "global")
    body = _parent_body(k.body, load)
    body.remove(load)                                  # the input is never loaded
    with pytest.raises(InterpreterError, match=r"a value computed from unwritten registers is "
                                               r"stored to T\d+\[.*\]<4> at .*threadIdx.x=0, "):
        interpret(k, st.bindings, [x])


def test_an_unwritten_register_that_stays_in_registers_is_harmless():
    fd, x, st, k = _neg_kernel()
    store = next(s for s in ops(k) if s.out.buffer.memory == "global")
    body = _parent_body(k.body, store)
    scratch = K.Buffer("T_scratch", DataType.Float, "local", K.Const(1))
    never = K.Buffer("T_never", DataType.Float, "local", K.Const(1))
    j = next(i for i, s in enumerate(body) if s is store)
    neg = next(s.expr for s in ops(k) if isinstance(s.expr, UnaryOp))
    body[j:j] = [K.Allocate(never), K.Allocate(scratch),
                 K.TensorOp(neg, K.TensorIndex(scratch, K.Const(0)),
                            [K.TensorIndex(never, K.Const(0))])]
    (out,), _ = interpret(k, st.bindings, [x])
    torch.testing.assert_close(out, -x)


def test_accumulating_into_an_unwritten_register_fails():
    fd = catalogue.define("layernorm_fwd", "fp32")
    inputs = catalogue.make_inputs("layernorm_fwd", 4, 1024, "fp32", seed=0)
    st, _, _, k = schedule_and_lower(fd, inputs, device="h100-4sm")
    acc = next(s for s in ops(k) if s.accumulate)
    init = next(s for s in K.walk(k.body)
                if isinstance(s, K.InitValue) and s.out is acc.out.buffer)
    _parent_body(k.body, init).remove(init)
    with pytest.raises(InterpreterError, match=r"accumulates a value computed from unwritten "
                                               "registers"):
        interpret(k, st.bindings, inputs)


# Several threads storing one element ----------------------------------------------------------
def test_of_several_threads_storing_one_element_the_last_wins_and_every_write_counts():
    fd, x, st, k = _neg_kernel(M=100, N=64)
    store = next(s for s in ops(k) if s.out.buffer.memory == "global")
    assert store.vector == 4
    store.out.index = K.Const(0)                     # every thread stores to elements 0..3
    (out,), it = interpret(k, st.bindings, [x], check_output_writes=False)
    flat = out.reshape(-1)
    torch.testing.assert_close(flat[:4], -x.reshape(-1)[-4:])     # the last thread's vector
    assert flat[4:].isnan().all()
    buf = store.out.buffer.name
    assert it.writes == {(buf, e): x.numel() // 4 for e in range(4)}


# Each output element written exactly once ------------------------------------------------------
def test_an_output_element_written_twice_or_never_fails():
    """The store's index clamped one vector short of the end: the last thread writes the
    vector before its own (elements 1016..1019 twice), and 1020..1023 stay unwritten."""
    fd, x, st, k = _neg_kernel(M=16, N=64)
    interpret(k, st.bindings, [x])                             # as lowered: fine
    store = next(s for s in ops(k) if s.out.buffer.memory == "global")
    assert store.vector == 4
    store.out.index = K.Bin("min", store.out.index, K.Const(x.numel() - 8))
    with pytest.raises(InterpreterError, match=r"output 0 \(T\d+\) element \(15, 56\) \(offset "
                                               r"1016\) is written 2 times by the kernel; each "
                                               r"output element must be written exactly once \(4 "
                                               r"of its 1024 elements are written more than once, "
                                               r"4 never\)"):
        interpret(k, st.bindings, [x])
    # Unchecked, the last thread's vector lands over its neighbour's and the end is NaN.
    (out,), it = interpret(k, st.bindings, [x], check_output_writes=False)
    flat, xf = out.reshape(-1), x.reshape(-1)
    torch.testing.assert_close(flat[:1016], -xf[:1016])
    torch.testing.assert_close(flat[1016:1020], -xf[1020:])
    assert flat[1020:].isnan().all()


def test_an_output_element_never_written_fails():
    """The store skipped by the threads of block 0: its elements are never written."""
    fd, x, st, k = _neg_kernel(M=16, N=64)
    store = next(s for s in ops(k) if s.out.buffer.memory == "global")
    body = _parent_body(k.body, store)
    at = body.index(store)
    body[at] = K.IfThenElse(K.Bin("!=", K.Special("blockIdx.x"), K.Const(0)), [store], [])
    with pytest.raises(InterpreterError, match=r"output 0 \(T\d+\) element \(0, 0\) \(offset 0\) "
                                               r"is never written by the kernel; .* \(0 of its 1024 "
                                               r"elements are written more than once, \d+ never\)"):
        interpret(k, st.bindings, [x])


# cp.async and warp roles, broken ---------------------------------------------------------------
def test_a_cp_async_copy_over_one_still_in_flight_fails():
    fd, inputs, st, p, k = lowered_inner_persistent("rmsnorm_fwd", 40, 1004, "bf16",
                                                    "tma_inner_persistent", stages=3, grid=2)
    assert p.cp_async_inputs
    interpret(k, st.bindings, inputs)                          # as lowered: fine
    copy = next(s for s in K.walk(k.body) if isinstance(s, K.CpAsyncCopy))
    body = _parent_body(k.body, copy)
    body.insert(body.index(copy) + 1, copy)                    # the same copy issued twice
    with pytest.raises(InterpreterError, match=r"cp.async into T\d+\[.*\]<4> \(element 0\) while "
                                               "an earlier copy into it is in flight"):
        interpret(k, st.bindings, inputs)


def _ws_kernel():
    fd, inputs, st, p, k = lowered_inner_persistent("rmsnorm_fwd", 100, 64, "fp32",
                                                    "ws_inner_persistent", stages=2, grid=1,
                                                    bdimy=16)
    return inputs, st, k


def test_a_producer_copying_short_rows_is_caught():
    """Half of each row copied: the compute role reads slot elements nobody wrote."""
    inputs, st, k = _ws_kernel()
    interpret(k, st.bindings, inputs)                          # as lowered: fine
    (loop,) = [s for s in K.walk(k.body)
               if isinstance(s, K.ForLoop) and s.label == K.WS_PRODUCER_LOOP]
    copies = [s for s in K.walk(loop.body) if isinstance(s, K.BulkLoad)]
    assert [c.bytes.value for c in copies] == [64 * 4]
    for c in copies:
        c.bytes = K.Const(32 * 4)
    with pytest.raises(InterpreterError, match="unwritten registers"):
        interpret(k, st.bindings, inputs)


def test_a_block_barrier_some_threads_skip_is_caught():
    inputs, st, k = _ws_kernel()
    j = next(i for i, s in enumerate(k.body) if isinstance(s, K.BlockSync))
    compute_only = K.lt(K.Special("threadIdx.y"), 16)
    k.body[j] = K.IfThenElse(compute_only, [k.body[j]])         # the producer warps skip it
    with pytest.raises(InterpreterError, match=r"__syncthreads reached by 256 of 384 threads "
                                               r"of block \(0, 0, 0\)"):
        interpret(k, st.bindings, inputs)


def test_a_named_barrier_of_the_wrong_count_is_caught():
    inputs, st, k = _ws_kernel()
    (red,) = [s for s in K.walk(k.body) if isinstance(s, K.BlockReduce)]
    assert red.barrier == (1, 256)                              # the compute warp groups
    red.barrier = (1, 128)
    with pytest.raises(InterpreterError, match=r"BlockReduce reached by 256 of 128 threads of "
                                               r"block \(0, 0, 0\)"):
        interpret(k, st.bindings, inputs)


# Limits -----------------------------------------------------------------------------------------
def test_too_many_threads_or_too_much_storage_is_refused_clearly():
    fd, x, st, k = _neg_kernel()
    n = x.numel() // 4
    with pytest.raises(InterpreterError, match=rf"{n} threads is too many to interpret .*at most "
                                               r"1000 \(Interpreter\(max_threads=\.\.\.\)\)"):
        Interpreter(k, st.bindings, max_threads=1000).run([x])
    with pytest.raises(InterpreterError, match=r"over its limit of .* GiB .*max_bytes"):
        Interpreter(k, st.bindings, max_bytes=64 * 1024).run([x])
    assert Interpreter(k, st.bindings).max_threads >= 1 << 20


# Outputs at their strides, copies checked against their own rules, pointers as given -----------
def test_an_expanded_output_keeps_its_stride_0_dims():
    """The executor allocates an output along an expanded input's dim with stride 0; the
    interpreter's outputs must have the same strides (a conversion of the strided view made
    them dense)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float, expanded=[False, True])
        fd.add_output(fd.ops.neg(x))
    X = torch.randn(5, 1).expand(5, 7)
    (out,) = _interpreted(fd, [X])
    assert out.stride() == (1, 0) and out.dtype == torch.float32
    torch.testing.assert_close(out, -X)


def test_bulk_copies_of_rows_padded_past_the_row_length():
    """Rows of 1024 floats 1032 apart: each row starts 16-byte aligned, which is the bulk
    copy's rule; the vector rule (a 1024-element access aligned to 1024 elements) is not."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=[False, True], dtype=DataType.Float)
        e = fd.ops.exp(fd.ops.sub(x, fd.ops.max(x, [1], keepdim=True)))
        fd.add_output(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)))
    X = torch.randn(8, 1032)[:, :1024]
    (out,) = fd.execute([X], options={"enable": ["interpret", "tma_inner_persistent"]})
    assert fd.last_run.backend == "interpreter" and fd.last_run.heuristics[0].stages >= 2
    torch.testing.assert_close(out, torch.softmax(X, 1))


def test_vector_alignment_is_checked_from_the_data_pointer():
    """A kernel scheduled for 16-byte aligned inputs, given a view that starts 4 bytes past a
    16-byte boundary: its 4-wide loads would be misaligned on the GPU, and the interpreter
    says so (it used to check offsets from the view's first element only)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=DataType.Float)
        fd.add_output(fd.ops.mul(x, 2.0))
    aligned = torch.randn(256)
    st, _, params, kernel = schedule_and_lower(fd, [aligned], alignment=16)
    assert params.vector == 4 and params.vector_inputs == (0,)
    interpret(kernel, st.bindings, [aligned])
    shifted = torch.randn(257)[1:]
    assert shifted.data_ptr() % 16 == 4
    with pytest.raises(InterpreterError, match="data pointer is 1 elements past 16 bytes"):
        interpret(kernel, st.bindings, [shifted])


@pytest.mark.parametrize("op", ["max", "min"])
def test_int32_max_and_min_start_from_the_int32_bounds(op):
    """An int32 max of negative values: the reduction started from -2**63, which the kernel's
    int32 accumulator holds as 0 (C keeps the low bits), so every row of negatives gave 0 on
    the GPU. The interpreter now wraps int32 stores as C does, and the frontend starts from
    the int32 bounds."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Int32)
        fd.add_output(getattr(fd.ops, op)(x, [1]))
    X = torch.randint(-8, 0, (37, 61), dtype=torch.int32) * (1 if op == "max" else -1)
    (out,) = _interpreted(fd, [X])
    want = X.amax(1) if op == "max" else X.amin(1)
    assert out.dtype == torch.int32 and torch.equal(out, want)


def test_a_scalar_rounded_to_an_integer_dtype():
    """A 0-d value (a scalar operand's, full([..], 0.5, Int)) rounded to int64: the saturation
    assigned into a numpy scalar (TypeError out of fd.execute, fuzz 20261124:52)."""
    assert int(_round_array(DataType.Int, np.float64(2.7))) == 2
    assert int(_round_array(DataType.Int, np.float64(1e30))) == 2 ** 63 - 1
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        fd.add_output(fd.ops.mul(x, fd.ops.full([3, 5], fd.define_scalar(0.5), dtype=DataType.Int)))
    (out,) = fd.execute([torch.randn(3, 5)], options={"enable": ["interpret"]})
    assert fd.last_run.kind == "kernels" and bool((out == 0).all())


def test_shared_row_slots_are_read_within_their_rows():
    """Norm backward over rows of 5356 fp32 on the inner-outer kernel: rows copied into shared
    slots of 5356 elements, read into register tiles of 4 x 335 x 4 = 5360. The tile's last
    vector of the last slot read past the shared buffer, unguarded (reads of shared memory had
    no predicate), and the interpreter bounded a block's shared buffer by the whole grid's
    storage, so it reported an IndexError instead (fuzz 20261124:2224). Reads of shared
    memory are now guarded along the dims the buffer holds whole (index.py)."""
    from pyfuser.testing import run_and_check
    g = torch.Generator().manual_seed(0)
    M, N = 10, 5356
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        dy = fd.define_tensor([-1, -1], dtype=DataType.Float)
        w = fd.define_tensor([-1], dtype=DataType.Float)
        mean = fd.define_tensor([-1, 1], dtype=DataType.Float)
        rstd = fd.define_tensor([-1, 1], dtype=DataType.Float)
        xhat = fd.ops.mul(fd.ops.sub(x, mean), rstd)
        gw = fd.ops.mul(dy, w)
        a = fd.ops.mean(fd.ops.mul(gw, xhat), [1], keepdim=True)
        b = fd.ops.mean(gw, [1], keepdim=True)
        dx = fd.ops.mul(fd.ops.sub(fd.ops.sub(gw, b), fd.ops.mul(xhat, a)), rstd)
        fd.add_output(dx)
        fd.add_output(fd.ops.sum(fd.ops.mul(dy, xhat), [0]))
        fd.add_output(fd.ops.sum(dy, [0]))
    inputs = [torch.randn(M, N, generator=g), torch.randn(M, N, generator=g),
              torch.randn(N, generator=g), torch.randn(M, 1, generator=g),
              torch.rand(M, 1, generator=g) + 0.5]
    run_and_check(fd, inputs, scheduler="inner_outer_persistent",
                  options={"enable": ["interpret"]})


@pytest.mark.parametrize("shape, dims", [((4000, 64), [0]), ((37, 1003), [0, 1]),
                                         ((3, 200000), [1])])
@pytest.mark.parametrize("follow", [True, False], ids=["follow", "elect"])
def test_each_grid_reduction_elects_its_own_last_block(shape, dims, follow, monkeypatch):
    """On a GPU the last block to reach a grid reduction's semaphore is any block, and two grid
    reductions of one kernel may elect different ones; only the elected block holds each
    result. The interpreter elects a different block for each grid reduction of a launch, so
    a kernel that writes the first one's result where the second elected gives wrong values
    here, as it would on the GPU, not only there: two sums over blocks in one reduction kernel,
    with the second grid reduction electing its own block (`_follow_the_first_last_block` off;
    a schedule tried and reverted in 363b3a6 for this). Following the first's last block, as
    lowered now, they are right. (Grouped into one grid step, lower/grouped_reductions.py, they
    would have one last block either way: the grouping is off here.)"""
    from pyfuser.lower import reductions
    from pyfuser.testing import run_and_check
    if not follow:
        monkeypatch.setattr(reductions, "_follow_the_first_last_block", lambda kernel: None)
    x = torch.randn(shape)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.sum(t, dims))
        fd.add_output(fd.ops.sum(fd.ops.mul(t, t), dims))
    options = {"enable": ["interpret"], "disable": ["group_reductions"]}
    if follow:
        run_and_check(fd, [x], scheduler="reduction", options=options)
    else:
        with pytest.raises(AssertionError, match="relative error"):
            run_and_check(fd, [x], scheduler="reduction", options=options)
    assert fd.last_run.heuristics[0].grid_split > 1


def _gelu_exact(x, approximate):
    """gelu at 400 digits (mpmath, which torch's sympy brings): the truth both float64 forms are
    judged against."""
    import mpmath
    with mpmath.workdps(400):              # 1 + tanh(u) keeps 300 digits at x = -12
        x = mpmath.mpf(x)
        if approximate == "tanh":
            u = mpmath.sqrt(2 / mpmath.pi) * (x + mpmath.mpf("0.044715") * x ** 3)
            return float(0.5 * x * (1 + mpmath.tanh(u)))
        return float(0.5 * x * (1 + mpmath.erf(x / mpmath.sqrt(2))))


GELU_POINTS = [-12.0, -9.0, -8.0, -6.5, -5.0, -4.0, -2.5, -1.0, -1e-3, 0.0, 0.5, 3.0, 9.0]


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_both_float64_gelus_keep_the_digits_of_tiny_results(approximate):
    """The float64 reference and the interpreter compute both gelus without the cancellation of
    ATen's 1 + tanh(u) / 1 + erf(x / sqrt 2), which is 0 in float64 below x = -7.6 (tanh): GPU
    fuzz 2701:131 had the device's float32 gelu_tanh(-8) = -3.2e-21 judged wrong against that 0.
    Both within 1e-13 relative of 400-digit values from x = -12 (results down to 1e-62) up."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=DataType.Double)
        fd.add_output(fd.ops.gelu(x, approximate=approximate))
    xs = torch.tensor(GELU_POINTS, dtype=torch.float64)
    want = torch.tensor([_gelu_exact(v, approximate) for v in GELU_POINTS], dtype=torch.float64)
    aten = torch.nn.functional.gelu(xs, approximate=approximate)
    assert ((aten - want).abs()[:3] > 0.01 * want.abs()[:3]).all()   # ATen's form cancels there
    for got in (_reference64(fd, [xs])[0], _interpreted(fd, [xs])[0]):
        got = torch.as_tensor(got, dtype=torch.float64)
        torch.testing.assert_close(got, want, rtol=1e-13, atol=0)


@pytest.mark.parametrize("dt", [DataType.Float, DataType.Double])
def test_both_device_gelus_compile_without_headers(dt):
    """pf::gelu's erfcf / erfc and pf::gelu_tanh's exp (float64) come from NVRTC's built-in math,
    no CUDA header: the kernel of both gelus compiles clean for sm_90a."""
    from pyfuser.codegen.cuda import generate_cuda
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=dt)
        fd.add_output(fd.ops.gelu(x, approximate="none"))
        fd.add_output(fd.ops.gelu(x, approximate="tanh"))
    xs = torch.randn(1000, dtype=torch.float32 if dt == DataType.Float else torch.float64)
    *_, kernel = schedule_and_lower(fd, [xs])
    src = generate_cuda(kernel)
    assert "pf::gelu(" in src and "pf::gelu_tanh(" in src
    compile_clean(src)
