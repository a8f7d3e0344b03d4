"""Scheduler kernels run by the kernel-IR interpreter on the CPU: the schedulers' choices, the
whole lowering and the index math against the reference evaluator, with every access checked
in bounds and every vector access aligned (what would be an illegal address on the GPU)."""
import warnings

import pytest
import torch

from kir_testing import (InterpreterError, empty_inputs, eval_expr, interpret, ops, reference,
                         schedule_and_lower, setup)
from pyfuser import DataType, FusionDefinition, catalogue
from pyfuser.kir import nodes as K
from pyfuser.runtime.executor import FallbackWarning
from pyfuser.schedule.schedulers import reduction, registry
from pyfuser.schedule.schedulers.reduction import ReductionParams
from pyfuser.testing import run_and_check

SCHEDULED = [n for n in catalogue.names()
             if registry.choose(catalogue.define(n, "fp32").fusion).scheduler is not None]
TOL = {"fp32": dict(rtol=1e-5, atol=1e-5), "bf16": dict(rtol=2e-2, atol=2e-2),
       "fp16": dict(rtol=2e-3, atol=2e-3)}


def _check(fd, inputs, dtype="fp32", params=None, scheduler=None, alignment=16):
    st, sch, params, k = schedule_and_lower(fd, inputs, params=params, scheduler=scheduler,
                                            alignment=alignment)
    outs, it = interpret(k, st.bindings, inputs)
    ref = reference(fd, inputs)
    for o, r in zip(outs, ref):
        torch.testing.assert_close(o.double(), r.double(), **TOL[dtype])
    # Every output element is written exactly once.
    for j, o in enumerate(fd.fusion.outputs):
        buf = next(p.name for p in k.params if p.source == ("output", j))
        counts = [c for (b, _), c in it.writes.items() if b == buf]
        assert len(counts) == ref[j].numel() and set(counts) <= {1}, (buf, params)
    return params, k, it


def test_the_catalogue_has_scheduled_pointwise_and_reduction_fusions():
    assert {"gelu_bias", "silu_mul", "row_sum", "col_sum"} <= set(SCHEDULED)


@pytest.mark.parametrize("name", SCHEDULED)
@pytest.mark.parametrize("shape", [(1, 1), (3, 37), (5, 64), (2, 1000), (7, 33)])
def test_catalogue_kernels_match_the_reference(name, shape):
    fd = catalogue.define(name, "fp32")
    inputs = catalogue.make_inputs(name, *shape, "fp32", seed=1)
    params = None
    sch = registry.choose(fd.fusion).scheduler
    if sch.NAME == "inner_outer_persistent":
        # The norm backward keeps its full persistent grid whatever M (blocks without rows
        # write zero partials); 4 blocks keep it interpretable and still leave some blocks
        # without rows for M < 4.
        import dataclasses
        st = setup(fd, inputs, alignment=16)
        params = dataclasses.replace(sch.compute_heuristics(st.fusion, st.info), grid=4)
    _check(fd, inputs, params=params, scheduler=sch if params else None)


@pytest.mark.parametrize("name", ["gelu_bias", "row_sum", "col_sum"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_half_precision_kernels(name, dtype):
    fd = catalogue.define(name, dtype)
    inputs = catalogue.make_inputs(name, 6, 48, dtype, seed=2)
    params, _, _ = _check(fd, inputs, dtype)
    assert params.vector == 8           # 16-byte accesses of 2-byte elements


# Layouts ----------------------------------------------------------------------------------------
def _from(tensors, body):
    with FusionDefinition() as fd:
        vs = [fd.from_pytorch(t) for t in tensors]
        fd.add_output(body(fd, *vs))
    return fd


@pytest.mark.parametrize("layout", ["sliced", "transposed", "expanded", "broadcast_col"])
def test_pointwise_layouts(layout):
    y = torch.randn(6, 40)
    x = {"sliced": torch.randn(6, 50)[:, 3:43], "transposed": torch.randn(40, 6).t(),
         "expanded": torch.randn(6, 1).expand(6, 40), "broadcast_col": torch.randn(6, 1)}[layout]
    fd = _from([x, y], lambda fd, a, b: fd.ops.mul(fd.ops.sigmoid(a), b))
    # The pointwise scheduler's reads (the transpose scheduler takes "transposed" by default).
    params, _, _ = _check(fd, [x, y], scheduler=registry.by_name("pointwise"))
    assert params.vector == 4
    # Only the dense input reads vectors: the slice starts 12 bytes in with rows of 50 floats,
    # the others are not unit-stride in their inner dim.
    assert params.vector_inputs == (1,)


def test_pointwise_sliced_input_with_aligned_rows_reads_vectors():
    x, y = torch.randn(6, 48)[:, 4:44], torch.randn(6, 40)
    fd = _from([x, y], lambda fd, a, b: fd.ops.mul(fd.ops.sigmoid(a), b))
    params, _, _ = _check(fd, [x, y])
    assert params.vector == 4 and params.vector_inputs == (0, 1)


def test_pointwise_output_follows_a_permuted_input():
    x = torch.randn(33, 5).t()                     # [5, 33], dim 0 innermost
    fd = _from([x], lambda fd, a: fd.ops.exp(a))
    _check(fd, [x])


@pytest.mark.parametrize("layout", ["sliced", "transposed"])
@pytest.mark.parametrize("dim", [0, 1])
def test_reduction_layouts(layout, dim):
    x = {"sliced": torch.randn(9, 70)[:, 2:66], "transposed": torch.randn(64, 9).t()}[layout]
    fd = _from([x], lambda fd, a: fd.ops.sum(a, [dim]))
    _check(fd, [x])


@pytest.mark.parametrize("dim", [0, 1])
def test_reduction_of_a_transposed_input_follows_memory_order(dim):
    # reduction.layout reads the input's allocation order: the reduction is inner when the
    # dim innermost in memory is reduced, so threads read contiguous memory.
    x = torch.randn(64, 9).t()                       # [9, 64], dim 0 innermost in memory
    fd = _from([x], lambda fd, a: fd.ops.sum(a, [dim]))
    st = setup(fd, [x])
    params = reduction.compute_heuristics(st.fusion, st.info)
    assert params.inner == (dim == 0)
    _check(fd, [x])


def test_an_output_the_fusion_also_uses_is_not_read_back():
    # y = exp(x) is an output and feeds z = 2 y: z is computed from y's registers; the kernel
    # reads no output buffer.
    x = torch.randn(5, 37)
    with FusionDefinition() as fd:
        a = fd.from_pytorch(x)
        y = fd.ops.exp(a)
        fd.add_output(y)
        fd.add_output(fd.ops.mul(y, 2.0))
    _, k, _ = _check(fd, [x])
    outputs = {p.name for p in k.params if p.source[0] == "output"}
    assert len(outputs) == 2
    assert not [i for op in ops(k) for i in op.ins
                if isinstance(i, K.TensorIndex) and i.buffer.name in outputs]


@pytest.mark.parametrize("dim", [0, 1])
def test_16_bit_sum_without_casts_matches_the_reference(dim):
    x = torch.randn(7, 45).to(torch.bfloat16)
    fd = _from([x], lambda fd, a: fd.ops.sum(a, [dim]))
    _check(fd, [x], "bf16")


@pytest.mark.parametrize("shape,dim", [([-1, 1], 1), ([1, -1], 0)])
def test_sum_over_a_size_1_dim_runs(shape, dim):
    # The frontend squeezes the size-1 dim (the reduction scheduler used to refuse to merge
    # an iteration ID with a broadcast's reduction ID).
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape)
        fd.add_output(fd.ops.sum(a, [dim]))
    x = torch.randn(*[7 if s == -1 else 1 for s in shape])
    _check(fd, [x])


def test_misaligned_input_reads_scalars():
    x = torch.randn(4, 64)
    fd = _from([x], lambda fd, a: fd.ops.sum(a, [1]))
    params, k, _ = _check(fd, [x], alignment=4)
    assert params.vector == 1 and not any(op.vector > 1 for op in ops(k))


# Forced heuristics: the split and grouping paths at sizes the interpreter can run ---------------
@pytest.mark.parametrize("params,shape", [
    (ReductionParams(True, 4, 32, 2, 2, (0,), 2), (3, 1032)),
    (ReductionParams(True, 4, 32, 2, 2, (0,), 2), (3, 1036)),  # ceilDiv(R, 2) not a multiple of 4
    (ReductionParams(True, 4, 32, 1, 1, (0,), 4), (2, 1052)),
    (ReductionParams(True, 1, 32, 2, 2, (), 4), (3, 1037)),
    (ReductionParams(True, 2, 64, 1, 4, (0,), 1), (2, 1030)),
])
def test_inner_reduction_forced_heuristics(params, shape):
    fd = catalogue.define("row_sum", "fp32")
    x = torch.randn(*shape)
    _, k, it = _check(fd, [x], params=params, scheduler=reduction)
    assert it.grid[1] == params.grid_split
    assert any(isinstance(s, K.GridReduce) for s in K.walk(k.body)) == (params.grid_split > 1)


@pytest.mark.parametrize("params,shape", [
    (ReductionParams(False, 4, 4, 16, 2, (0,), 4), (301, 24)),
    (ReductionParams(False, 1, 8, 16, 2, (), 3), (301, 23)),
    (ReductionParams(False, 2, 8, 8, 4, (0,), 2), (77, 34)),
])
def test_outer_reduction_forced_heuristics(params, shape):
    fd = catalogue.define("col_sum", "fp32")
    x = torch.randn(*shape)
    _, k, it = _check(fd, [x], params=params, scheduler=reduction)
    (br,) = [s for s in K.walk(k.body) if isinstance(s, K.BlockReduce)]
    assert br.dims == ("y",) and br.values[0].vector == params.vector   # grouped columns


def _vector_reads_at(k, env):
    """Lane-0 element of every vectorized global read, at one point of the launch."""
    out = []
    for op in ops(k):
        if op.vector > 1 and op.ins[0].buffer.memory == "global":
            out.append((op.vector, eval_expr(op.ins[0].index, env)))
    return out


@pytest.mark.parametrize("shape,dtype", [((8, 100004), "fp32"), ((4, 200008), "bf16"),
                                         ((2, 65544), "bf16"), ((1, 1 << 20), "bf16")])
def test_grid_split_inner_reduction_keeps_vectors_aligned(shape, dtype):
    """Each block of a grid-split row starts a vector: the split must not cut the row at an
    offset that is not a multiple of the vector width (a misaligned 16-byte load faults)."""
    fd = catalogue.define("row_sum", dtype)
    inputs = empty_inputs("row_sum", *shape, dtype)
    st, sch, params, k = schedule_and_lower(fd, inputs)
    assert params.vector > 1
    env = {p.name: 0 for p in k.params}
    env.update({"i0": shape[0], "i1": shape[1], "T0_s0": shape[1]})
    for y in range(params.grid_split):
        env.update({"blockIdx.x": 0, "blockIdx.y": y, "threadIdx.x": 0, "threadIdx.y": 0,
                    "threadIdx.z": 0, "blockIdx.z": 0})
        for name in {f.var.name for f in K.walk(k.body) if isinstance(f, K.ForLoop)}:
            env.setdefault(name, 0)
        for vec, idx in _vector_reads_at(k, env):
            assert idx % vec == 0, (params, y, idx)


def test_interpreter_catches_a_misaligned_vector_access():
    """The interpreter's alignment check, on a kernel whose vector read is shifted by hand."""
    fd = catalogue.define("row_sum", "fp32")
    x = torch.randn(2, 64)
    st, sch, params, k = schedule_and_lower(fd, [x])
    load = next(op for op in ops(k) if op.vector > 1)
    load.ins[0].index = K.add(load.ins[0].index, 2)
    with pytest.raises(InterpreterError, match="is not aligned to 4 elements"):
        interpret(k, st.bindings, [x])


def test_interpreter_catches_an_out_of_bounds_write():
    # gelu_bias keeps rows of whole vectors (its bias is a broadcast input): element-wise
    # accesses of rows of 7, each store guarded.
    fd = catalogue.define("gelu_bias", "fp32")
    inputs = catalogue.make_inputs("gelu_bias", 3, 7, "fp32", seed=0)
    st, sch, params, k = schedule_and_lower(fd, inputs)
    store = next(op for op in ops(k) if op.out.buffer.memory == "global")
    store.predicate = K.Const(True, "bool")        # drop the bound check
    with pytest.raises(InterpreterError, match=r"elements \[21, 22\) outside \[0, 21\) of T"):
        interpret(k, st.bindings, inputs)


def test_interpreter_catches_a_vector_past_the_end_of_a_ragged_run():
    # silu_mul's 21 elements in vectors of 4 across rows: the last vector's check dropped, its
    # 4-wide store runs past the end.
    fd = catalogue.define("silu_mul", "fp32")
    inputs = catalogue.make_inputs("silu_mul", 3, 7, "fp32", seed=0)
    st, sch, params, k = schedule_and_lower(fd, inputs)
    assert params.ragged

    def checked_store(body):
        for s in body:
            if isinstance(s, K.IfThenElse) and any(
                    isinstance(x, K.TensorOp) and x.out.buffer.memory == "global"
                    for x in s.then_body):
                return s
            for f in ("body", "then_body", "else_body"):
                found = checked_store(getattr(s, f, None) or [])
                if found is not None:
                    return found
        return None
    checked_store(k.body).cond = K.Const(True, "bool")
    with pytest.raises(InterpreterError, match=r"elements \[20, 24\) outside \[0, 21\) of T"):
        interpret(k, st.bindings, inputs)


def _weight_of_part_of_a_merged_row(x, w):
    """x [M, K, N] reduced over [K, N] (one merged row) beside w [N] used before and after
    the reduction (fuzz 20261130:4029)."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True],
                              dtype=DataType.Half)
        a = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Half)
        v4 = fd.ops.where(fd.ops.ge(a, 0.5), t0, a)
        v8 = fd.ops.tanh(fd.ops.mul(fd.ops.sum(v4, [1, 2], keepdim=True), 6.103515625e-05))
        fd.add_output(fd.ops.mul(v4, v8))
        fd.add_output(fd.ops.abs(t0))
    return fd


@pytest.mark.parametrize("K,N", [(4093, 1), (3, 128), (5, 96)])
def test_a_weight_of_part_of_a_merged_row_is_read_where_each_thread_uses_it(K, N):
    """The weight's own split of [N] is not the merged row's split of [K, N]: kept resident
    across the rows (keep_weights) or across the reduction (used on both sides), each thread
    read, at its place in the row, a register slot another thread loaded for another element
    ("accumulates a value computed from unwritten registers"). inner_persistent now reloads it
    for the uses after the reduction and keeps only weights that span the whole row; inlining
    counts a consumer's depth where its loops really are (ge(w) inside the rows that
    broadcast it)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, K, N, generator=g).half()
    w = torch.randn(N, generator=g).half()
    fd = _weight_of_part_of_a_merged_row(x, w)
    run_and_check(fd, [x, w], scheduler="inner_persistent", options={"enable": ["interpret"]})


def test_var_of_a_constant_beside_sums_of_a_permuted_input():
    """A plan whose inner_persistent segment has no tensor input (var of a fill): its
    heuristic sized the row by the widest tensor input, of none ("max() arg is an empty
    sequence", fuzz 20261130:3973); a row of fills is recomputed in the 4-byte compute type."""
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(55510, generator=g) * 1.5 + 0.5).half().as_strided(
        (2, 61, 35, 13), (61, 1, 122, 4270))
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1, -1, -1], contiguity=[True, True, True, True],
                              dtype=DataType.Half, stride_order=[1, 0, 2, 3])
        v0 = fd.ops.lt(t0, 0.5)
        v1 = fd.ops.where(v0, t0, -1.0)
        v4 = fd.ops.permute(fd.ops.cast(v1, dtype=DataType.BFloat16), [0, 1, 3, 2])
        v9 = fd.ops.le(fd.ops.full([2, 61, 13, 35], 1.0, dtype=DataType.Float), 0.5)
        v12 = fd.ops.sum(fd.ops.where(v9, v4, 2.0), [2])
        v16 = fd.ops.logical_not(fd.ops.le(fd.ops.full([2, 61, 35], 1.0, dtype=DataType.Float),
                                           0.5))
        v18 = fd.ops.var(fd.ops.cast(v16, dtype=DataType.BFloat16), [2], keepdim=True,
                         correction=1)
        fd.add_output(fd.ops.pow(v16, 3))
        fd.add_output(v18)
        fd.add_output(v12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        run_and_check(fd, [x], kernels=0, options={"enable": ["interpret"]})
    assert not fd.last_run.internal_error, fd.last_run.internal_error
    assert ("kernel", "inner_persistent") in [(s.kind, s.name) for s in fd.last_run.segments]


def test_a_normalization_of_fills_alone_runs_as_one_kernel():
    """No tensor input at all: x = full([5, 35]) normalized over its rows."""
    with FusionDefinition() as fd:
        x = fd.ops.full([5, 35], 1.5, dtype=DataType.Float)
        fd.add_output(fd.ops.sub(x, fd.ops.mean(x, [1], keepdim=True)))
    run_and_check(fd, [], scheduler="inner_persistent", options={"enable": ["interpret"]})


@pytest.mark.parametrize("expanded", [True, False])
def test_a_row_beside_an_output_broadcast_along_part_of_it_keeps_its_own_loops(expanded):
    """Fuzz 20261336:1025: var over the row [R, E] of x * w, w [M, R, 1] (expanded to E or
    not), and an output w + var, shaped like w. That output's row loop merges R with its
    broadcast dim and iterates R only; the persistent row buffers, sharing its block loop, had
    their row loops promoted to it through the permissive map (R times, not R * E: "cannot
    index T12's axis iS38{i2}"). They keep their own loops now."""
    x = torch.randn(5, 21, 97)
    w = torch.randn(5, 21, 1)
    if expanded:
        w = w.expand(5, 21, 97)
    with FusionDefinition() as fd:
        tx = fd.define_tensor([-1, -1, -1], dtype=DataType.Float)
        tw = fd.from_pytorch(w)
        v = fd.ops.var(fd.ops.mul(tx, tw), [1, 2], keepdim=True, correction=0)
        fd.add_output(fd.ops.add(tw, v))
    run_and_check(fd, [x, w], kernels=1, scheduler="inner_persistent",
                  options={"enable": ["interpret"]})


def test_a_row_sum_right_aligned_against_the_row_it_sums():
    """Fuzz 20261348:1459: where(x == 0.5, sum(broadcast(x) [1, N], [1]), -1) for x [N]: the
    sum [1] (its kept dim a broadcast) meets x right-aligned, along the N it reduced, inside the
    output's serial loops; propagation had bound that broadcast axis to TIDy ("T4 axis 2 is
    TIDy but the loop it shares with T6 is S"). A broadcast axis takes the loop it shares."""
    x = torch.randn(7).half().as_strided((4,), (2,))
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1], contiguity=[False], dtype=DataType.Half)
        v1 = fd.ops.sum(fd.ops.broadcast(t0, [True, False]), [1])
        fd.add_output(fd.ops.where(fd.ops.eq(t0, 0.5), v1, -1.0))
    run_and_check(fd, [x], kernels=1, scheduler="inner_persistent",
                  options={"enable": ["interpret"]})


def test_a_one_row_statistic_broadcast_along_the_columns_it_reduced():
    """Fuzz 20261345:1173: the mean [1] of a one-row t2 [1, N] (its row dim a broadcast) meets
    [1, N] again right-aligned, so its row dim lies along the columns it reduced, and the
    permissive map reaches both the rows' split and the columns' split from a column axis;
    parallelize_like bound the columns' split of the cast of t2 to TIDy, serial in the
    reduction ("T8 axis 4 is TIDy but the loop it shares with T42 is S"). It now takes the
    reference loop at its own position."""
    g = torch.Generator().manual_seed(0)
    t0, t2 = (torch.randn(1, 595, generator=g).bfloat16() for _ in range(2))
    t1 = torch.randint(-3, 2, (1, 595), generator=g, dtype=torch.int32)
    with FusionDefinition() as fd:
        x0 = fd.from_pytorch(t0, static_sizes=True)
        x1, x2 = fd.from_pytorch(t1), fd.from_pytorch(t2)
        v1 = fd.ops.where(fd.ops.ne(x0, 0.5), x2, x1)
        _, mean = fd.ops.var_mean(x2, [1], keepdim=False, correction=1)
        fd.add_output(fd.ops.where(fd.ops.gt(v1, 0.5), mean, fd.ops.sum(mean, [-1], keepdim=True)))
        fd.add_output(fd.ops.div(x2, fd.ops.add(fd.ops.abs(mean), 0.5)))
        fd.add_output(fd.ops.tanh(x1))
    run_and_check(fd, [t0, t1, t2], kernels=1, scheduler="inner_persistent",
                  options={"enable": ["interpret"]})


def test_two_column_sums_that_meet_after_both_leave_the_input_cache_inlined():
    """Fuzz 20261350:740: fp64 x [153, 2], a column sum of x itself and a column mean of
    gelu(x) that meet (a maximum) only once both are complete, beside a row sum. The inliner
    counted gelu(x) as a consumer needing the first sum's result per row and held x's cache
    resident across every row: a register buffer of runtime size ("T20 needs a register
    buffer of runtime size"). A consumer meets a reduction's result only before reducing over
    the same dims."""
    x = torch.randn(153, 2, dtype=torch.float64)
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Double)
        v0 = fd.ops.gelu(t0, approximate="tanh")
        v9 = fd.ops.pow(fd.ops.add(fd.ops.mul(fd.ops.sigmoid(fd.ops.mul(
            fd.ops.sum(t0, [-2]), 0.0009765625)), 1.0), 0.5), 0.5)
        v2 = fd.ops.logical_not(t0)
        fd.add_output(fd.ops.add(v2, fd.ops.sum(v2, [1], keepdim=True)))
        fd.add_output(fd.ops.maximum(v9, fd.ops.mean(v0, [0], keepdim=True)))
        fd.add_output(v0)
    run_and_check(fd, [x], kernels=1, scheduler="inner_outer_persistent",
                  options={"enable": ["interpret"]})


@pytest.mark.parametrize("plan", ["default", "inner_persistent"])
def test_a_row_cache_of_part_of_a_merged_row_is_not_kept_resident(plan, monkeypatch):
    """Fuzz 20261203:613: var_mean over all dims of cast(!b * a) for b [M (expanded), K, 1, N]
    and a [3, 1]: the row merges [K, 3, N], b's cache holds [K, N] of it. Kept resident with its
    own split like a row cache, lowering could not index it from the row's loops ("cannot index
    T23's axis iS64{i5}"). Caches of part of a merged row are now loaded where used. The
    reduction scheduler, which takes inputs of fewer dims now, makes it two full-reduction
    kernels; refused here, the plan is the pointwise and inner persistent kernels of the
    regression."""
    from pyfuser.ir.tensor import TensorView
    from pyfuser.schedule.schedulers import reduction
    if plan == "inner_persistent":
        takes = reduction.can_schedule

        def same_rank_inputs_only(f):      # the rule before inputs of fewer dims were taken
            rank = len(reduction.reduction_tensors(f)[0].domain.maybe_root) \
                if reduction.reduction_tensors(f) else None
            if any(isinstance(v, TensorView) and len(v.domain.logical) != rank
                   for v in f.inputs):
                return False, "refused by this test"
            return takes(f)
        monkeypatch.setattr(reduction, "can_schedule", same_rank_inputs_only)
    g = torch.Generator().manual_seed(0)
    a = torch.randint(0, 4, (3, 1), dtype=torch.int32, generator=g)
    b = torch.randn(251 * 32, generator=g).half().as_strided((2, 251, 1, 32), (0, 32, 7, 1))
    with FusionDefinition() as fd:
        ta = fd.from_pytorch(a, static_sizes=True)
        tb = fd.define_tensor(shape=[-1, -1, 1, -1], contiguity=[None, True, None, True],
                              dtype=DataType.Half, expanded=[True, False, False, False])
        v = fd.ops.cast(fd.ops.mul(fd.ops.logical_not(tb), ta), dtype=DataType.Float)
        var, mean = fd.ops.var_mean(v, [0, 1, 2, 3], correction=1)
        fd.add_output(mean)
        fd.add_output(var)
    run_and_check(fd, [a, b], kernels=2, options={"enable": ["interpret"]},
                  segments=(("kernel", "pointwise"), ("kernel", "inner_persistent"))
                  if plan == "inner_persistent" else (("kernel", "reduction"),) * 2)


def test_a_row_of_whole_vectors_is_guarded_once_per_vector():
    """Rows of 1000 fp32 (250 vectors of 4; the executor checks the row holds whole vectors)
    over a block whose step does not divide them: the accumulation of a vector's lanes is
    guarded by the vector's index alone (lower/indexing.py Known.bound), once around the lane
    loop (vectorize.py); the kernel still sums every element once, on the interpreter."""
    fd = catalogue.define("row_sum", "fp32")
    x = torch.randn(8, 1000)
    params = ReductionParams(True, 4, 64, 2, 2, (0,))
    st, sch, params, k = schedule_and_lower(fd, [x], params=params)
    guards = [s for s in K.walk(k.body) if isinstance(s, K.IfThenElse)
              and any(isinstance(b, K.ForLoop) and b.unroll for b in s.then_body)]
    assert guards, "the lane loop of the accumulation is not guarded once"
    for g in guards:
        (lanes,) = [b for b in g.then_body if isinstance(b, K.ForLoop)]
        assert repr(lanes.var) not in repr(g.cond), g.cond
        accs = [op for op in K.walk(lanes.body) if isinstance(op, K.TensorOp) and op.accumulate]
        assert accs and all(repr(op.predicate) == "True" for op in accs)
    _check(fd, [x], params=params)
