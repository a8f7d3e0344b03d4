"""Fusions a scheduler's can_schedule used to accept and its schedule() could not run, or that
no scheduler took (fuzz triage P2, P3, P4, P9, P11, P14; tests/fuzz). Shared by the interpreter
tests (tests/schedule/test_scheduler_acceptance.py) and the GPU tests
(tests/gpu/test_scheduler_acceptance_gpu.py).

Each builder takes (dt, sizes..., device) and returns (FusionDefinition, inputs).
RUN maps the name of each fusion that now runs as one kernel to (builder, scheduler, shapes
the interpreter tests use, shapes the GPU tests use). REFUSED maps the name of each fusion no
scheduler can run to (builder, the scheduler that used to accept it, the words of its reason,
shapes).
"""
from __future__ import annotations

import torch

from pyfuser import DataType, FusionDefinition

DT = {"fp32": DataType.Float, "bf16": DataType.BFloat16, "fp16": DataType.Half}
TORCH = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
F32 = DataType.Float


def _randn(shapes, dt, device, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).to(device=device, dtype=TORCH[dt]) for s in shapes]


def _f32(fd, x, dt):
    return x if dt == "fp32" else fd.ops.cast(x, F32)


def _out(fd, y, dt):
    fd.add_output(y if dt == "fp32" else fd.ops.cast(y, DT[dt]))


# P2: normalizations over a fusion-internal permute ----------------------------------------------
# x [M, N] is contiguous; the fusion normalizes permute(x) [N, M] over its last dim, M, which is
# x's outer dim in memory: the outer persistent scheduler takes it (columns of x on chip).
# recompute_for's copy of the permute used to lose its root -> logical order (a transpose of
# the data).
def permuted_max_sub(dt, M, N, device="cpu", seed=0):
    """permute(x) - max(permute(x), 1) (illegal access: unwritten registers accumulated)."""
    with FusionDefinition("permuted_max_sub") as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        xt = _f32(fd, fd.ops.permute(x, [1, 0]), dt)
        _out(fd, fd.ops.sub(xt, fd.ops.max(xt, [1], keepdim=True)), dt)
    return fd, _randn([(M, N)], dt, device, seed)


def permuted_softmax(dt, M, N, device="cpu", seed=0):
    """softmax over the last dim of permute(x) ("rfactor ... is not a reduction axis")."""
    with FusionDefinition("permuted_softmax") as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        xt = _f32(fd, fd.ops.permute(x, [1, 0]), dt)
        e = fd.ops.exp(fd.ops.sub(xt, fd.ops.max(xt, [1], keepdim=True)))
        _out(fd, fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)), dt)
    return fd, _randn([(M, N)], dt, device, seed)


def permuted_layernorm(dt, M, N, device="cpu", seed=0):
    """LayerNorm over the last dim of permute(x) ("recompute of T#: T# comes from a
    ReductionOp")."""
    with FusionDefinition("permuted_layernorm") as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        xt = _f32(fd, fd.ops.permute(x, [1, 0]), dt)
        v, m = fd.ops.var_mean(xt, [1], correction=0, keepdim=True)
        _out(fd, fd.ops.mul(fd.ops.sub(xt, m), fd.ops.rsqrt(fd.ops.add(v, 1e-5))), dt)
    return fd, _randn([(M, N)], dt, device, seed)


def permuted_3d_softmax(dt, A, B, C, device="cpu", seed=0):
    """softmax over the last dim of permute(x, [2, 0, 1]): x's dim 1."""
    with FusionDefinition("permuted_3d_softmax") as fd:
        x = fd.define_tensor([-1, -1, -1], dtype=DT[dt])
        xt = _f32(fd, fd.ops.permute(x, [2, 0, 1]), dt)
        e = fd.ops.exp(fd.ops.sub(xt, fd.ops.max(xt, [2], keepdim=True)))
        _out(fd, fd.ops.div(e, fd.ops.sum(e, [2], keepdim=True)), dt)
    return fd, _randn([(A, B, C)], dt, device, seed)


# P2, related: kept dims that are not a plain iteration ------------------------------------------
def var_of_column_broadcast_back(dt, N, device="cpu", seed=0):
    """var over dim 0 of broadcast(x) [N, 1], added to x [N] (case 20261123:569): the kept
    size-1 dim of the variance is broadcast to x's N, the dim it reduces. ("rfactor on T#: axis
    4 out of range"; in the case itself "T# reads T#'s registers along ID (TIDx) in none of its
    TIDx loops".)"""
    with FusionDefinition("var_of_column_broadcast_back") as fd:
        x = fd.define_tensor([-1], dtype=DT[dt])
        xf = _f32(fd, x, dt)
        v = fd.ops.var(fd.ops.broadcast(xf, [False, True]), [0], correction=1)
        _out(fd, fd.ops.add(xf, v), dt)
    return fd, _randn([(N,)], dt, device, seed)


def sum_of_column_broadcast_back(dt, N, device="cpu", seed=0):
    """x + sum(broadcast(x) [N, 1], [0]), with a [1] input beside it as in case 20261123:569
    (the output took its N loops from the sum's kept size-1 dim)."""
    with FusionDefinition("sum_of_column_broadcast_back") as fd:
        x = fd.define_tensor([-1], dtype=DT[dt])
        s = fd.define_tensor([1], dtype=DT[dt])
        xf = _f32(fd, x, dt)
        t = fd.ops.sum(fd.ops.broadcast(xf, [False, True]), [0])
        _out(fd, fd.ops.where(fd.ops.ne(xf, 0.5), _f32(fd, s, dt), fd.ops.add(xf, t)), dt)
    return fd, _randn([(N,), (1,)], dt, device, seed)


def var_mean_around_a_size_1_dim(dt, A, B, D, device="cpu", seed=0):
    """var_mean over dims [1, 3] of [A, B, 1, D] (case 20261123:207): a size-1 dim between the
    reduced ones is a kept dim."""
    with FusionDefinition("var_mean_around_a_size_1_dim") as fd:
        x = fd.define_tensor([-1, -1, 1, -1], dtype=DT[dt])
        v, m = fd.ops.var_mean(_f32(fd, x, dt), [1, 3], correction=1, keepdim=True)
        _out(fd, m, dt)
        _out(fd, v, dt)
    return fd, _randn([(A, B, 1, D)], dt, device, seed)


def log_softmax_with_a_size_1_row_dim(dt, A, N, device="cpu", seed=0):
    """log-softmax over the last dim of [A, 1, N] (case 20261123:1461): x - max is used again
    after the second reduction, and its recompute reached the max's ReductionOp."""
    with FusionDefinition("log_softmax_with_a_size_1_row_dim") as fd:
        x = fd.define_tensor([-1, 1, -1], dtype=DT[dt])
        xf = _f32(fd, x, dt)
        d = fd.ops.sub(xf, fd.ops.max(xf, [2], keepdim=True))
        s = fd.ops.sum(fd.ops.exp(d), [2], keepdim=True)
        _out(fd, fd.ops.sub(d, fd.ops.log(s)), dt)
    return fd, _randn([(A, 1, N)], dt, device, seed)


# inner_outer_persistent: reductions classified by their dims, not their logical order -----------
def column_sum_of_a_permuted_view(dt, M, N, device="cpu", seed=0):
    """y = x - mean(x, 1); outputs y, sum over dim 1 of permute(y * x) [N, M] (a column
    reduction whose logical dims read [kept, reduced]) and sum(y, 0)."""
    with FusionDefinition("column_sum_of_a_permuted_view") as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        xf = _f32(fd, x, dt)
        y = fd.ops.sub(xf, fd.ops.mean(xf, [1], keepdim=True))
        _out(fd, y, dt)
        fd.add_output(fd.ops.sum(fd.ops.permute(fd.ops.mul(y, xf), [1, 0]), [1]))
        fd.add_output(fd.ops.sum(y, [0]))
    return fd, _randn([(M, N)], dt, device, seed)


def row_sum_of_a_permuted_view(dt, M, N, device="cpu", seed=0):
    """The row statistic taken over dim 0 of permute(x) [N, M] (a row reduction whose logical
    dims read [reduced, kept]), broadcast back; beside it sum(x * x, 1) and a column sum."""
    with FusionDefinition("row_sum_of_a_permuted_view") as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        xf = _f32(fd, x, dt)
        fd.add_output(fd.ops.sum(fd.ops.mul(xf, xf), [1]))
        xt = fd.ops.permute(xf, [1, 0])
        y = fd.ops.sub(xt, fd.ops.sum(xt, [0], keepdim=True))
        _out(fd, y, dt)
        fd.add_output(fd.ops.sum(y, [1]))
    return fd, _randn([(M, N)], dt, device, seed)


def row_norm_and_permuted_column_sum(dt, M, N, device="cpu", seed=0):
    """y = x - max(x, 1) and sum over dim 1 of permute(y) [N, M]: a column sum whose logical
    dims read like a row sum's, which inner_persistent took for one ("recompute of T#: T#
    comes from a ReductionOp"). An inner-outer fusion."""
    with FusionDefinition("row_norm_and_permuted_column_sum") as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        xf = _f32(fd, x, dt)
        y = fd.ops.sub(xf, fd.ops.max(xf, [1], keepdim=True))
        _out(fd, y, dt)
        fd.add_output(fd.ops.sum(fd.ops.permute(y, [1, 0]), [1]))
    return fd, _randn([(M, N)], dt, device, seed)


def row_norm_and_permuted_row_sum(dt, M, N, device="cpu", seed=0):
    """y = x - max(x, 1) and sum over dim 0 of permute(x) [N, M]: a row sum whose logical dims
    read like a column sum's, which inner_outer took for one ("rfactor on T#: axis 0 (...) is
    not a reduction axis"). An inner persistent fusion."""
    with FusionDefinition("row_norm_and_permuted_row_sum") as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        xf = _f32(fd, x, dt)
        _out(fd, fd.ops.sub(xf, fd.ops.max(xf, [1], keepdim=True)), dt)
        fd.add_output(fd.ops.sum(fd.ops.permute(xf, [1, 0]), [0]))
    return fd, _randn([(M, N)], dt, device, seed)


# Refused: what schedule() cannot do ------------------------------------------------------------
def softmax_and_permuted_sum_of_another_dim(dt, A, B, C, device="cpu", seed=0):
    """softmax over dim 2 of x [A, B, C] and a sum over the last dim of permute(x, [0, 2, 1]),
    x's dim 1: both read [kept, kept, reduced], but they reduce different dims ("rfactor on
    T#: axis 2 (...) is not a reduction axis")."""
    with FusionDefinition("softmax_and_permuted_sum_of_another_dim") as fd:
        x = fd.define_tensor([-1, -1, -1], dtype=DT[dt])
        xf = _f32(fd, x, dt)
        e = fd.ops.exp(fd.ops.sub(xf, fd.ops.max(xf, [2], keepdim=True)))
        _out(fd, fd.ops.div(e, fd.ops.sum(e, [2], keepdim=True)), dt)
        fd.add_output(fd.ops.sum(fd.ops.permute(xf, [0, 2, 1]), [2]))
    return fd, _randn([(A, B, C)], dt, device, seed)


def row_and_permuted_row_reduction(dt, M, N, device="cpu", seed=0):
    """Case 8:947: the row sum of an [M(expanded), N] input, broadcast into a permuted view
    [N, M] of another input and reduced over its dim 0, N again: two row reductions (one whose
    logical dims read [reduced, kept]), which inner_outer took for a row and a column
    reduction ("rfactor on T#: axis 0 (...) is not a reduction axis")."""
    with FusionDefinition("row_and_permuted_row_reduction") as fd:
        t0 = fd.define_tensor([-1, -1], dtype=DT[dt])
        t2 = fd.define_tensor([-1, -1], contiguity=[None, True], dtype=DataType.Half,
                              expanded=[True, False])
        v0 = fd.ops.cast(t2, F32)
        v6 = fd.ops.sum(v0, [1])
        v9 = fd.ops.where(fd.ops.permute(fd.ops.lt(t0, 0.5), [1, 0]), v6, 3.0)
        fd.add_output(fd.ops.mean(v9, [0]))
        fd.add_output(fd.ops.sub(v0, t0))
    x, w = _randn([(M, N), (1, N)], dt, device, seed)
    return fd, [x, w.to(torch.float16).expand(M, N)]


def column_variance_of_rows(dt, M, N, device="cpu", seed=0):
    """P11, case 8:158: var(x + sum(x, 1), 0): the column mean is broadcast back over the rows
    for the second column reduction ("rfactoring every reduction axis leaves nothing for the
    final reduction")."""
    with FusionDefinition("column_variance_of_rows") as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        xf = _f32(fd, x, dt)
        y = fd.ops.add(xf, fd.ops.sum(xf, [1], keepdim=True))
        _out(fd, fd.ops.var(y, [0], correction=0, keepdim=True), dt)
    return fd, _randn([(M, N)], dt, device, seed)


def column_sum_and_flattened_input(dt, M, N, device="cpu", seed=0):
    """P9, case 20261123:1064: sum(x, 0) [N] and reshape(x, [-1]) [M * N] as outputs (the
    reduction scheduler counted one dim each; "T# needs a register buffer of runtime size")."""
    with FusionDefinition("column_sum_and_flattened_input") as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        fd.add_output(fd.ops.sum(x, [0]))
        fd.add_output(fd.ops.reshape(x, [-1]))
    return fd, _randn([(M, N)], dt, device, seed)


def softmax_and_flattened_rows(dt, M, N, device="cpu", seed=0):
    """Cases 5:727, 1:1924: softmax of [M, N] rows beside reshape(x, [-1]) broadcast to
    [M, M * N] (each output row holds every input row): inner_persistent took it and read
    registers of other blocks' rows ("reads T#'s registers along ID (BIDx) in none of its
    BIDx loops")."""
    with FusionDefinition("softmax_and_flattened_rows") as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt])
        xf = _f32(fd, x, dt)
        e = fd.ops.exp(fd.ops.sub(xf, fd.ops.max(xf, [1], keepdim=True)))
        _out(fd, fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)), dt)
        fd.add_output(fd.ops.broadcast_in_dim(fd.ops.reshape(x, [M * N]), [M, M * N], [1]))
    return fd, _randn([(M, N)], dt, device, seed)


def column_max_beside_the_rows(dt, M, N, device="cpu", seed=0):
    """Case 20261123:226: max(x, 0) [1, N] beside (x < 0.5) + b [M, N] of a bf16 row b: the
    reduction scheduler read b's cache in vectors at unaligned register offsets."""
    with FusionDefinition("column_max_beside_the_rows") as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        b = fd.define_tensor([1, -1], dtype=DataType.BFloat16)
        fd.add_output(fd.ops.add(fd.ops.lt(x, 0.5), b))
        fd.add_output(fd.ops.max(x, [0], keepdim=True))
    g = torch.Generator().manual_seed(seed)
    return fd, [torch.randn(M, N, generator=g).to(device),
                torch.randn(1, N, generator=g).to(device=device, dtype=torch.bfloat16)]


def column_sum_and_permuted_other_input(dt, M, N, device="cpu", seed=0):
    """P9, case 8:637: |sum(t0 [M, N], 0, keepdim)| [1, N] and permute(t1 [1, N']) [N', 1], t1
    another input whose N' the fusion never ties to N."""
    with FusionDefinition("column_sum_and_permuted_other_input") as fd:
        t0 = fd.define_tensor([-1, -1], dtype=DT[dt])
        t1 = fd.define_tensor([1, -1], dtype=DT[dt])
        fd.add_output(fd.ops.abs(fd.ops.sum(t0, [0], keepdim=True)))
        fd.add_output(fd.ops.permute(t1, [1, 0]))
    return fd, _randn([(M, N), (1, N)], dt, device, seed)


# P3: reductions over expanded (stride-0) dims ---------------------------------------------------
# The frontend squeezes an expanded dim out of a reduction's result (E copies of one element: E
# times it for a sum) instead of reducing over it; the reduction keeps it as a broadcast.
def var_over_an_expanded_dim(dt, M, K, E, device="cpu", seed=0):
    """var over dims [1, 2] of x [M, K, E(expanded)] (triage P3: the reduction of (x - mean)^2
    over the expanded dim accumulated registers no thread wrote)."""
    with FusionDefinition("var_over_an_expanded_dim") as fd:
        x = fd.define_tensor([-1, -1, -1], dtype=DT[dt], expanded=[False, False, True])
        fd.add_output(fd.ops.var(_f32(fd, x, dt), [1, 2], correction=0))
    (x,) = _randn([(M, K, 1)], dt, device, seed)
    return fd, [x.expand(M, K, E)]


def layernorm_of_expanded_rows(dt, M, K, E, device="cpu", seed=0):
    """LayerNorm over dims [1, 2] of x [M(expanded), K, E(expanded)] (case 8:222): every kept
    dim a broadcast, so the reduction's kept dims are merged from two broadcasts, which the
    exact graph did not map to the squeezed result's one ("cyclic dependency between
    loops")."""
    with FusionDefinition("layernorm_of_expanded_rows") as fd:
        x = fd.define_tensor([-1, -1, -1], dtype=DT[dt], expanded=[True, False, True])
        xf = _f32(fd, x, dt)
        v, m = fd.ops.var_mean(xf, [1, 2], correction=0, keepdim=True)
        _out(fd, fd.ops.mul(fd.ops.sub(xf, m), fd.ops.rsqrt(fd.ops.add(v, 1e-5))), dt)
        _out(fd, fd.ops.var(xf, [1, 2], correction=1), dt)
    (x,) = _randn([(1, K, 1)], dt, device, seed)
    return fd, [x.expand(M, K, E)]


# P4: one-row tensors ([1, N], from_pytorch of a batch of 1: the row dim a broadcast) ------------
def layernorm_bwd_of_one_row(dt, N, device="cpu", seed=0):
    """The catalogue's LayerNorm backward with x, dy and w defined by from_pytorch from one row
    (cases 7:260, 20261123:1464): dy * w is a [1, N] row whose mean keeps a broadcast row dim,
    x - mean an [M, N] one; inner_outer took the former's reduction for the reference and
    found the latter neither a row nor a column reduction of it."""
    x, dy, w = _randn([(1, N), (1, N), (N,)], dt, device, seed)
    mean = x.float().mean(1, keepdim=True)
    rstd = (x.float().var(1, correction=0, keepdim=True) + 1e-5).rsqrt()
    with FusionDefinition("layernorm_bwd_of_one_row") as fd:
        tx, tdy, tw = (fd.from_pytorch(t) for t in (x, dy, w))
        tmean = fd.define_tensor([-1, 1], dtype=F32)
        trstd = fd.define_tensor([-1, 1], dtype=F32)
        xhat = fd.ops.mul(fd.ops.sub(_f32(fd, tx, dt), tmean), trstd)
        dyf = _f32(fd, tdy, dt)
        g = fd.ops.mul(dyf, _f32(fd, tw, dt))
        c1 = fd.ops.mean(g, [1], keepdim=True)
        c2 = fd.ops.mean(fd.ops.mul(g, xhat), [1], keepdim=True)
        dx = fd.ops.mul(fd.ops.sub(fd.ops.sub(g, c1), fd.ops.mul(xhat, c2)), trstd)
        _out(fd, dx, dt)
        _out(fd, fd.ops.sum(fd.ops.mul(dyf, xhat), [0]), dt)
        _out(fd, fd.ops.sum(dyf, [0]), dt)
    return fd, [x, dy, w, mean, rstd]


def norms_of_one_row_and_of_rows(dt, M, N, device="cpu", seed=0):
    """LayerNorm of a one-row y [1, N] (from_pytorch) plus LayerNorm of x [M, N]: y's
    reductions keep a broadcast row dim, x's iterate the rows (inner_persistent refused:
    "reductions over different dims")."""
    x, y = _randn([(M, N), (1, N)], dt, device, seed)
    with FusionDefinition("norms_of_one_row_and_of_rows") as fd:
        ty = fd.from_pytorch(y)
        tx = fd.define_tensor([-1, -1], dtype=DT[dt])

        def norm(t):
            v, m = fd.ops.var_mean(t, [1], correction=0, keepdim=True)
            return fd.ops.mul(fd.ops.sub(t, m), fd.ops.rsqrt(fd.ops.add(v, 1e-5)))
        ny = norm(_f32(fd, ty, dt))          # first: the first reduction keeps a broadcast
        _out(fd, fd.ops.add(norm(_f32(fd, tx, dt)), ny), dt)
    return fd, [y, x]



def rows_scaled_by_one_row(dt, M, N, device="cpu", seed=0):
    """x * w / (1 + |erf(sum(x * w, 1))|) with w [1, N] defined with a size-1 row dim (case
    20261123:476, with tma_inner_persistent: w's cache computed before the rows' grid-stride
    loop kept a grid-stride loop of its own over its broadcast row dim, which ran in block 0
    only; test_scheduler_acceptance schedules it so)."""
    x, w = _randn([(M, N), (1, N)], dt, device, seed)
    with FusionDefinition("rows_scaled_by_one_row") as fd:
        tx = fd.define_tensor([-1, -1], dtype=DT[dt])
        tw = fd.define_tensor([1, -1], dtype=DataType.BFloat16)
        xw = fd.ops.mul(_f32(fd, tx, dt), fd.ops.cast(tw, F32))
        s = fd.ops.sum(xw, [1], keepdim=True)
        _out(fd, fd.ops.div(xw, fd.ops.add(fd.ops.abs(fd.ops.erf(fd.ops.mul(s, 1e-3))), 1.0)), dt)
    return fd, [x, w.to(torch.bfloat16)]


def rows_times_a_weight_over_a_size_1_dim(dt, B, C, N, device="cpu", seed=0):
    """v = (x - w) * x, v * max(v, [2, 3]) for x [B, C, 1, N] and a bf16 w [1, C, 1, N] whose
    size-1 dims are broadcasts (GPU fuzz case 20261126:61): the row is x's dims 2 and 3 merged,
    w's cache merges a broadcast with N instead. The cache's vector loop (8 bf16) found no loop
    of the float output (which splits the same 8 into 2 x 4) to stand for, and its index could
    not reach N ("cannot index T#'s axis from its loops"); it now stands for the output's ID
    of 8 that those two loops come from (lower/context.py _match)."""
    x, w = _randn([(B, C, 1, N), (1, C, 1, N)], dt, device, seed)
    with FusionDefinition("rows_times_a_weight_over_a_size_1_dim") as fd:
        tx = fd.define_tensor([-1, -1, -1, -1], dtype=DT[dt])
        tw = fd.define_tensor([1, -1, 1, -1], dtype=DataType.BFloat16)
        # A float output of 16-bit inputs: its loop splits the inputs' 8-wide vectors 2 x 4.
        xf = _f32(fd, tx, dt)
        v = fd.ops.mul(fd.ops.sub(xf, fd.ops.cast(tw, F32)), xf)
        fd.add_output(fd.ops.mul(v, fd.ops.max(v, [2, 3], keepdim=True)))
    return fd, [x, w.to(torch.bfloat16)]


def var_mean_of_all_dims_of_an_expanded_input(dt, E, N, device="cpu", seed=0):
    """var_mean over both dims of x [E(expanded), N], squeezed to rank 0 (CI sample case
    20261123:286): the sum, its squeeze and the variance run in the block loop of the expanded
    row dim, while the mean output's chain has one-iteration loops of its own after it. The
    rank-0 chain between them was placed at the top of the kernel, before the loop that
    computes its input and after the one that reads it (a cycle); it now runs inside that loop,
    allocated at the top so the mean's chain reads it after (lower/context.py)."""
    (x,) = _randn([(1, N)], dt, device, seed)
    with FusionDefinition("var_mean_of_all_dims_of_an_expanded_input") as fd:
        tx = fd.define_tensor([-1, -1], contiguity=[None, True], dtype=DT[dt],
                              expanded=[True, False])
        xf = _f32(fd, tx, dt)
        var, mean = fd.ops.var_mean(fd.ops.mul(fd.ops.mul(fd.ops.exp(xf), xf), 0.25), [0, 1],
                                    keepdim=False, correction=0)
        _out(fd, mean, dt)
        _out(fd, var, dt)
    return fd, [x.expand(E, N)]


def outer_sum_of_an_input_with_its_middle_dim_outermost(dt, A, B, C, device="cpu", seed=0):
    """sum over dim 0 of x [A, B, C] laid out with dim 1 outermost and dim 2 innermost (fuzz
    20261127:878): the kept dims B and C merge into one vectorized loop, and the register
    cache of x sorted that merge at B's place, outside the unrolled reduction steps, so the two
    lanes of a vector were 4 registers apart: a misaligned vector write, half the output
    unwritten on the GPU. A vectorized ID is now innermost in a register buffer
    (TensorView.allocation_domain)."""
    (x,) = _randn([(B, A, C)], dt, device, seed)
    x = x.permute(1, 0, 2)
    with FusionDefinition("outer_sum_of_an_input_with_its_middle_dim_outermost") as fd:
        tx = fd.from_pytorch(x)
        fd.add_output(fd.ops.sum(_f32(fd, tx, dt), [0]))
    return fd, [x]


def var_of_all_dims_with_an_expanded_one(dt, A, B, C, device="cpu", seed=0):
    """var over every dim of x [A, B(expanded), C], keepdim (case 20261123:1085): the frontend
    keeps B through the reductions of A and C (their only kept dim), then squeezes it to rank
    0 and multiplies by B before broadcasting back; the rank-0 chain, at the top of the kernel,
    sat between two tensors of the same (expanded) block loop ("cyclic dependency")."""
    with FusionDefinition("var_of_all_dims_with_an_expanded_one") as fd:
        x = fd.define_tensor([-1, -1, -1], dtype=DT[dt], expanded=[False, True, False])
        _out(fd, fd.ops.var(_f32(fd, x, dt), [0, 1, 2], correction=0, keepdim=True), dt)
    (x,) = _randn([(A, 1, C)], dt, device, seed)
    return fd, [x.expand(A, B, C)]

# P14: every dim a broadcast ---------------------------------------------------------------------
def var_mean_of_one_int_element_read_twice(dt, device="cpu", seed=0):
    """Case 1:875: var_mean of float(x) for x [1] int64, and x - var: x's cache and the chain's
    tensors sit in two one-iteration loops lowering does not merge, each feeding and reading
    the rank-0 chain between them ("cyclic dependency between loops")."""
    with FusionDefinition("var_mean_of_one_int_element_read_twice") as fd:
        x = fd.define_tensor([1], dtype=DataType.Int)
        v, m = fd.ops.var_mean(fd.ops.cast(x, F32), [0], correction=0, keepdim=True)
        fd.add_output(fd.ops.sub(x, v))
        fd.add_output(m)
    return fd, [torch.tensor([3], device=device)]


def var_mean_of_one_element(dt, device="cpu", seed=0):
    """var_mean of x [1] over dim 0 (case 7:389): both reductions become squeezes to rank 0,
    and the one of (x - mean)^2 sat at the top of the kernel while its producer and its
    consumer shared the one-iteration loop ("cyclic dependency between loops")."""
    with FusionDefinition("var_mean_of_one_element") as fd:
        x = fd.define_tensor([1], dtype=DT[dt])
        xf = _f32(fd, x, dt)
        v, m = fd.ops.var_mean(xf, [0], correction=0, keepdim=True)
        _out(fd, fd.ops.mul(fd.ops.sub(xf, m), fd.ops.rsqrt(fd.ops.add(v, 0.25))), dt)
        _out(fd, m, dt)
    return fd, _randn([(1,)], dt, device, seed)


RUN = {
    # The pointwise scheduler refused these until lowering placed a rank-0 chain in the
    # one-iteration loops around it (fuzz 20261303:184, a sum of x [1]: a squeeze read back).
    "var_mean_of_one_element": (lambda dt, *shape, **kw: var_mean_of_one_element(dt, **kw),
                                "pointwise", [()], [()]),
    "var_mean_of_one_int_element_read_twice": (
        lambda dt, *shape, **kw: var_mean_of_one_int_element_read_twice(dt, **kw), "pointwise",
        [()], [()]),
    "permuted_max_sub": (permuted_max_sub, "outer_persistent",
                         [(96, 475), (7, 33)], [(96, 475), (4096, 1024), (1000, 3)]),
    "permuted_softmax": (permuted_softmax, "outer_persistent",
                         [(96, 475), (5, 64)], [(96, 475), (4096, 1024), (1000, 3)]),
    "permuted_layernorm": (permuted_layernorm, "outer_persistent",
                           [(96, 475), (5, 64)], [(96, 475), (4096, 1024), (1000, 3)]),
    "permuted_3d_softmax": (permuted_3d_softmax, "inner_persistent",
                            [(6, 7, 33)], [(6, 7, 33), (64, 32, 1024)]),
    "var_of_column_broadcast_back": (var_of_column_broadcast_back, "inner_persistent",
                                     [(300,), (2368,)], [(2368,), (5000,)]),
    "sum_of_column_broadcast_back": (sum_of_column_broadcast_back, "inner_persistent",
                                     [(300,), (2368,)], [(2368,), (5000,)]),
    "var_mean_around_a_size_1_dim": (var_mean_around_a_size_1_dim, "inner_persistent",
                                     [(6, 2, 9), (3, 4, 32)], [(6, 2, 9), (512, 8, 128)]),
    "log_softmax_with_a_size_1_row_dim": (log_softmax_with_a_size_1_row_dim,
                                          "inner_persistent",
                                          [(3, 500), (1, 64)], [(3, 5713), (1000, 1024)]),
    "column_sum_of_a_permuted_view": (column_sum_of_a_permuted_view, "inner_outer_persistent",
                                      [(64, 96), (7, 40)], [(2048, 1024), (1000, 333)]),
    "row_sum_of_a_permuted_view": (row_sum_of_a_permuted_view, "inner_outer_persistent",
                                   [(64, 96), (7, 40)], [(2048, 1024), (1000, 333)]),
    "row_norm_and_permuted_column_sum": (row_norm_and_permuted_column_sum,
                                         "inner_outer_persistent",
                                         [(64, 96), (7, 40)], [(2048, 1024), (1000, 333)]),
    "row_norm_and_permuted_row_sum": (row_norm_and_permuted_row_sum, "inner_persistent",
                                      [(64, 96), (7, 40)], [(2048, 1024), (1000, 333)]),
    "var_over_an_expanded_dim": (var_over_an_expanded_dim, "inner_persistent",
                                 [(4, 3, 257), (7, 33, 5)], [(4, 3, 257), (1024, 96, 16)]),
    "layernorm_of_expanded_rows": (layernorm_of_expanded_rows, "inner_persistent",
                                   [(7, 3, 257), (2, 40, 3)], [(7, 3, 257), (1024, 96, 16)]),
    "layernorm_bwd_of_one_row": (layernorm_bwd_of_one_row, "inner_outer_persistent",
                                 [(375,), (1024,)], [(375,), (4096,), (7981,)]),
    "norms_of_one_row_and_of_rows": (norms_of_one_row_and_of_rows, "inner_persistent",
                                     [(6, 512), (3, 75)], [(6, 512), (2048, 4096)]),
    "rows_scaled_by_one_row": (rows_scaled_by_one_row, "inner_persistent",
                               [(127, 193), (9, 256)], [(127, 193), (4096, 1024)]),
    "rows_times_a_weight_over_a_size_1_dim": (rows_times_a_weight_over_a_size_1_dim,
                                              "inner_persistent",
                                              [(2, 3, 40), (3, 5, 1320)],
                                              [(16, 12, 1320), (64, 32, 4096)]),
    "var_mean_of_all_dims_of_an_expanded_input": (var_mean_of_all_dims_of_an_expanded_input,
                                                  "inner_persistent",
                                                  [(5, 5209), (3, 64)],
                                                  [(5, 5209), (16, 8192)]),
    "outer_sum_of_an_input_with_its_middle_dim_outermost": (
        outer_sum_of_an_input_with_its_middle_dim_outermost, "reduction",
        [(131, 16, 70), (9, 5, 34)], [(131, 16, 70), (1024, 64, 258)]),
    "var_of_all_dims_with_an_expanded_one": (var_of_all_dims_with_an_expanded_one,
                                             "inner_persistent",
                                             [(8, 9, 303), (3, 5, 64)], [(8, 9, 303),
                                                                         (16, 16, 1000)]),
}

REFUSED = {
    "softmax_and_permuted_sum_of_another_dim": (
        softmax_and_permuted_sum_of_another_dim, "inner_persistent",
        "reductions over different dims", (4, 6, 40)),
    "row_and_permuted_row_reduction": (
        row_and_permuted_row_reduction, "inner_outer_persistent",
        "is neither a row nor a column reduction", (1025, 13)),
    "column_variance_of_rows": (
        column_variance_of_rows, "inner_outer_persistent",
        "is broadcast back over the rows", (64, 96)),
    "column_sum_and_flattened_input": (
        column_sum_and_flattened_input, "reduction",
        "an output whose dims are not the reduction's dims", (127, 219)),
    "column_sum_and_permuted_other_input": (
        column_sum_and_permuted_other_input, "reduction",
        "an output whose dims are not the reduction's dims", (1, 6437)),
    "column_max_beside_the_rows": (
        column_max_beside_the_rows, "reduction",
        "iterates both the reduced and the kept dims", (487, 60)),
    "softmax_and_flattened_rows": (
        softmax_and_flattened_rows, "inner_persistent",
        "iterates dims other than the rows'", (5, 41)),
}
