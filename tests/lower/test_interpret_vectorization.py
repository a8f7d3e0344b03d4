"""Vector accesses of scheduled kernels, run by the kernel-IR interpreter against the float64
reference: every tensor is accessed with the width of its own dtype (16 bytes at most) along its
own stride-1 dim, or element-wise; never refused with an internal error, never read wrongly.

The first tests are the failures users met (an H100 and the interpreter); the parametrized ones
below look for the same class of bug in every scheduler: mixed dtypes, size-1 and expanded
innermost dims, permuted and sliced inputs, odd innermost sizes."""

import warnings
import pytest
import torch

from kir_testing import interpret_against_float64, ops, schedule_and_lower, setup
from pyfuser import DataType, FusionDefinition, catalogue
from pyfuser.ir import ParallelType as PT
from pyfuser.runtime.executor import FallbackWarning
from pyfuser.runtime.inputs import output_strides
from pyfuser.schedule.schedulers import inner_outer_persistent, inner_persistent, pointwise
from pyfuser.schedule.schedulers import reduction
from pyfuser.testing import run_and_check
from pyfuser.ir.dtype import from_torch

BF16, F32 = DataType.BFloat16, DataType.Float


def check(fd, inputs, scheduler=None, params=None):
    """Schedule, lower and interpret `fd` (alignment from the inputs' data pointers, as the
    executor sees it); every output within the issue's tolerance of the float64 reference and
    written exactly once. Returns (scheduler, params, kernel, widths): widths maps ("input", k)
    and ("output", j) to the widths of the global accesses of that tensor."""
    st, sch, params, k = schedule_and_lower(fd, inputs, params=params, scheduler=scheduler,
                                            alignment=None)
    interpret_against_float64(fd, st, k, inputs, params)
    return sch, params, k, global_widths(k)


def global_widths(k) -> dict:
    source = {p.name: p.source for p in k.params if p.source[0] in ("input", "output")}
    out: dict = {}
    for op in ops(k):
        for a in [op.out, *op.ins]:
            if getattr(a, "buffer", None) is not None and a.buffer.name in source:
                out.setdefault(source[a.buffer.name], set()).add(max(op.vector, 1))
    return {key: max(ws) for key, ws in out.items()}


def vectorized_axes(tv) -> list:
    return [i for i in tv.domain.loop if i.parallel_type == PT.Vectorize]


# 1. Norm forward returning its statistics ------------------------------------------------------
def rmsnorm_with_rstd(out_dtype=BF16, stats=True):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=BF16)
        w = fd.define_tensor([-1], dtype=BF16)
        xf = fd.ops.cast(x, F32)
        rstd = fd.ops.rsqrt(fd.ops.add(fd.ops.mean(fd.ops.mul(xf, xf), [1], keepdim=True), 1e-5))
        y = fd.ops.mul(fd.ops.mul(xf, rstd), fd.ops.cast(w, F32))
        fd.add_output(fd.ops.cast(y, out_dtype) if out_dtype != F32 else y)
        if stats:
            fd.add_output(rstd)
    return fd


def layernorm_with_stats(out_dtype=BF16, stats=True):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=BF16)
        w = fd.define_tensor([-1], dtype=BF16)
        b = fd.define_tensor([-1], dtype=BF16)
        xf = fd.ops.cast(x, F32)
        var, mean = fd.ops.var_mean(xf, [1], correction=0, keepdim=True)
        rstd = fd.ops.rsqrt(fd.ops.add(var, 1e-5))
        y = fd.ops.add(fd.ops.mul(fd.ops.mul(fd.ops.sub(xf, mean), rstd), fd.ops.cast(w, F32)),
                       fd.ops.cast(b, F32))
        fd.add_output(fd.ops.cast(y, out_dtype) if out_dtype != F32 else y)
        if stats:
            fd.add_output(mean)
            fd.add_output(rstd)
    return fd


def _norm_inputs(fd, M, N):
    return [torch.randn(M, N).to(torch.bfloat16)] + [
        torch.randn(N).to(torch.bfloat16) for _ in fd.fusion.inputs[1:]]


NORM_SHAPES = [(7, 1000), (64, 4096), (2048, 4096), (16384, 1024)]


@pytest.mark.parametrize("make", [rmsnorm_with_rstd, layernorm_with_stats])
@pytest.mark.parametrize("M,N", NORM_SHAPES)
def test_norm_statistics_are_written_element_wise(make, M, N):
    """The fp32 [M, 1] statistics took the row's bf16 vector split on their broadcast dim and
    were vectorized by it: `8 x 4 bytes exceeds a 16-byte access`. They have no run of elements
    along the row: element-wise; the bf16 output keeps its 16-byte stores."""
    fd = make()
    inputs = [torch.empty(M, N, dtype=torch.bfloat16)] + [
        torch.empty(N, dtype=torch.bfloat16) for _ in fd.fusion.inputs[1:]]
    st = setup(fd, inputs, alignment=16)
    params = inner_persistent.compute_heuristics(st.fusion, st.info)
    inner_persistent.schedule(st.fusion, params)
    y, *stats = st.fusion.outputs
    assert params.vector == 8
    assert [i.const_extent for i in vectorized_axes(y)] == [8]
    for s in stats:
        assert s.dtype == F32 and vectorized_axes(s) == []


@pytest.mark.parametrize("make", [rmsnorm_with_rstd, layernorm_with_stats])
def test_norm_with_statistics_matches_the_reference(make):
    fd = make()
    check(fd, _norm_inputs(fd, 7, 1000), scheduler=inner_persistent)


@pytest.mark.parametrize("make", [rmsnorm_with_rstd, layernorm_with_stats])
@pytest.mark.parametrize("M,N", [(7, 1000), (3, 4096), (5, 1032)])
def test_fp32_norm_output_of_bf16_rows_is_stored_16_bytes_at_a_time(make, M, N):
    """A loop vectorized for bf16 rows (8 elements) writes its fp32 output in two 4-wide
    stores instead of refusing the 32-byte access (the statistics: the test above)."""
    fd = make(F32, stats=False)
    sch, params, k, widths = check(fd, _norm_inputs(fd, M, N))
    assert sch is inner_persistent and params.vector == 8
    assert widths[("input", 0)] == 8 and widths[("output", 0)] == 4


# 2. A [1]-shaped input next to a [256] one -----------------------------------------------------
@pytest.mark.parametrize("op", ["minimum", "maximum"])
@pytest.mark.parametrize("n", [256, 1000, 36])
def test_size_1_input_is_read_element_wise(op, n):
    """The [1] input was read with 4-wide loads (`read of T1[0]<4>: elements [0, 4) outside
    [0, 1)`; wrong values on the GPU)."""
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1])
        b = fd.define_tensor([1])
        fd.add_output(getattr(fd.ops, op)(a, b))
    sch, params, k, widths = check(fd, [torch.randn(n), torch.randn(1)])
    assert sch is pointwise and params.vector == 4 and params.vector_inputs == (0,)
    assert widths == {("input", 0): 4, ("input", 1): 1, ("output", 0): 4}


# 3. Layout changes ------------------------------------------------------------------------------
def _permute(x, dims, via_set):
    with FusionDefinition() as fd:
        a = fd.from_pytorch(x)
        p = fd.ops.permute(a, dims)
        fd.add_output(fd.ops.set(p) if via_set else p)
    return fd


@pytest.mark.parametrize("via_set", [True, False])
@pytest.mark.parametrize("shape", [(2, 8, 4, 8), (3, 16, 5, 7), (1, 24, 2, 3)])
def test_nchw_to_nhwc_reads_the_input_element_wise(via_set, shape):
    """The input was read with vectors along the output's innermost dim (C), which is not the
    input's stride-1 dim (W): misaligned accesses, 85% wrong elements on the GPU."""
    x = torch.randn(*shape).to(torch.bfloat16)
    # The pointwise scheduler's reads (the transpose scheduler takes this fusion by default).
    sch, params, k, widths = check(_permute(x, [0, 2, 3, 1], via_set), [x], scheduler=pointwise)
    assert widths[("input", 0)] == 1 and params.vector_inputs == ()
    assert widths[("output", 0)] == params.vector == (8 if shape[1] % 8 == 0 else
                                                      shape[1] & -shape[1])


@pytest.mark.parametrize("shape", [(2, 8, 4, 8), (3, 16, 5, 7)])
def test_channels_last_input_to_a_contiguous_output(shape):
    x = torch.randn(*shape).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.set(fd.from_pytorch(x)))
    _, params, k, widths = check(fd, [x], scheduler=pointwise)     # transpose's by default
    assert widths[("input", 0)] == 1
    # A row of W not a multiple of 8: the output's vectors run across its rows (ragged).
    assert widths[("output", 0)] == params.vector == 8
    assert params.ragged == (shape[3] % 8 != 0)
    # Permuted to NHWC, its memory order, the output's stride-1 dim is the input's (C).
    _, params, k, widths = check(_permute(x, [0, 2, 3, 1], True), [x])
    assert widths[("input", 0)] == params.vector > 1


def test_permute_that_keeps_the_innermost_dim_reads_vectors():
    x = torch.randn(2, 8, 4, 16).to(torch.bfloat16)
    _, params, k, widths = check(_permute(x, [0, 2, 1, 3], True), [x])
    assert widths[("input", 0)] == 8 == params.vector


@pytest.mark.parametrize("stride_order", [[0, 1, 2], [1, 0, 2], [2, 0, 1], [0, 2, 1]])
def test_stride_order_inputs(stride_order):
    """Inputs of every stride order, added to a contiguous one: each input is read with vectors
    exactly when its stride-1 dim is the output's."""
    shape = (6, 5, 8)
    dense = torch.randn(*shape)
    order = sorted(range(3), key=lambda d: -stride_order[d])      # outermost first
    x = torch.randn(*[shape[d] for d in order]).permute(*[order.index(d) for d in range(3)])
    assert x.shape == dense.shape
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1, -1], stride_order=stride_order)
        b = fd.from_pytorch(dense)
        fd.add_output(fd.ops.add(fd.ops.mul(a, 2.0), b))
    _, params, k, widths = check(fd, [x, dense])
    assert widths[("input", 0)] == (4 if stride_order[2] == 0 else 1)
    assert widths[("input", 1)] == widths[("output", 0)] == 4


# 4. Outputs of unrelated shapes -----------------------------------------------------------------
def adamw(shapes):
    with FusionDefinition() as fd:
        for shape in shapes:
            p, g, m, v = [fd.define_tensor([-1] * len(shape)) for _ in range(4)]
            m2 = fd.ops.add(fd.ops.mul(m, 0.9), fd.ops.mul(g, 0.1))
            v2 = fd.ops.add(fd.ops.mul(v, 0.999), fd.ops.mul(fd.ops.mul(g, g), 0.001))
            upd = fd.ops.div(m2, fd.ops.add(fd.ops.sqrt(v2), 1e-8))
            p2 = fd.ops.sub(fd.ops.mul(p, 1 - 1e-3 * 0.01), fd.ops.mul(upd, 1e-3))
            for o in (p2, m2, v2, fd.ops.mul(p2, 1.0)):
                fd.add_output(o)
    inputs = []
    for shape in shapes:
        inputs += [torch.randn(*shape), torch.randn(*shape), torch.randn(*shape),
                   torch.rand(*shape)]
    return fd, inputs


@pytest.mark.parametrize("shapes", [[(1000,), (185,)], [(1000,), (37, 5)], [(10, 100), (37, 5)]])
def test_adamw_over_parameters_of_different_sizes_is_one_pointwise_segment_each(shapes):
    """One pointwise loop nest cannot iterate outputs of unrelated shapes (it used to fail with
    `a vectorized axis needs a constant extent`, then ran the reference evaluator): pointwise
    refuses the whole fusion with the reason, and the segmenter gives each parameter's update
    a pointwise kernel of its own."""
    fd, inputs = adamw(shapes)
    ok, why = pointwise.can_schedule(fd.fusion)
    assert not ok
    if len(shapes[0]) == len(shapes[1]):
        assert why.startswith("output 4 does not iterate the elements of output 0")
        assert "outputs of unrelated shapes" in why
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        run_and_check(fd, inputs, kernels=2, options={"enable": ["interpret"]},
                      segments=(("kernel", "pointwise"), ("kernel", "pointwise")))


def test_adamw_of_one_parameter_is_one_pointwise_kernel():
    fd, inputs = adamw([(1000,)])
    sch, params, k, widths = check(fd, inputs)
    assert sch is pointwise and params.vector == 4 and params.vector_inputs == (0, 1, 2, 3)


def broadcast_outputs(first_is_broadcast):
    """Outputs exp(c) [M, 1] and -r [1, N] beside a * c + r [M, N], which broadcasts them."""
    col, row, x = torch.randn(6, 1), torch.randn(1, 36), torch.randn(6, 36)
    with FusionDefinition() as fd:
        c, r, a = fd.from_pytorch(col), fd.from_pytorch(row), fd.from_pytorch(x)
        outs = [fd.ops.exp(c), fd.ops.neg(r), fd.ops.add(fd.ops.mul(a, c), r)]
        for o in (outs if first_is_broadcast else outs[::-1]):
            fd.add_output(o)
    return fd, [col, row, x]


@pytest.mark.parametrize("first_is_broadcast", [True, False])
def test_outputs_that_broadcast_to_another_are_one_pointwise_fusion(first_is_broadcast):
    fd, _ = broadcast_outputs(first_is_broadcast)
    assert pointwise.can_schedule(fd.fusion)[0]


@pytest.mark.parametrize("first_is_broadcast", [True, False])
def test_outputs_that_broadcast_to_another_run_as_one_kernel(first_is_broadcast):
    """Whichever output comes first, the [M, N] output is the reference (it iterates the most
    dims) and the [M, 1] and [1, N] outputs run in its flat loop, each element written once:
    exp(c) by the thread at column 0 of its row, -r by the threads of row 0. (It used to fail
    to index when the [M, N] output came first, and to write the [M, 1] output once per
    thread of its row when that came first.)"""
    fd, inputs = broadcast_outputs(first_is_broadcast)
    sch, params, k, widths = check(fd, inputs)
    assert sch is pointwise and params.vector == 4
    j = 2 if first_is_broadcast else 0
    assert widths[("output", j)] == 4 and widths[("input", 2)] == 4
    # The [1, N] output's lanes step along N: 4-wide stores; the [M, 1] output's lanes would
    # step along the broadcast N: element-wise.
    assert widths[("output", 1)] == 4 and widths[("output", 2 - j)] == 1


# 5. The same class of bug in every scheduler -----------------------------------------------------
DT = {"bf16": torch.bfloat16, "fp32": torch.float32, "int64": torch.int64, "bool": torch.bool}


def _rand(shape, dtype):
    if dtype == "int64":
        return torch.randint(-50, 50, shape)
    if dtype == "bool":
        return torch.rand(shape) > 0.5
    return torch.randn(*shape).to(DT[dtype])


@pytest.mark.parametrize("out_dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("other", ["bf16", "fp32", "int64", "bool"])
@pytest.mark.parametrize("N", [64, 40, 36, 7])
def test_pointwise_mixed_dtypes(out_dtype, other, N):
    """Each input is read with its own 16-byte width (8 x bf16, 4 x fp32, 2 x int64, 16 x bool,
    capped by the loop's width), or element-wise."""
    x, y = _rand((5, N), "bf16"), _rand((5, N), other)
    with FusionDefinition() as fd:
        a, b = fd.from_pytorch(x), fd.from_pytorch(y)
        bf = fd.ops.cast(b, F32)
        fd.add_output(fd.ops.cast(fd.ops.add(fd.ops.cast(a, F32), bf),
                                  BF16 if out_dtype == "bf16" else F32))
        fd.add_output(fd.ops.mul(fd.ops.cast(a, F32), 3.0))
    sch, params, k, widths = check(fd, [x, y])
    size = {"bf16": 2, "fp32": 4, "int64": 8, "bool": 1}
    for key, t in [(("input", 0), x), (("input", 1), y), (("output", 0), None),
                   (("output", 1), None)]:
        nbytes = t.element_size() if t is not None else size[out_dtype if key == ("output", 0)
                                                              else "fp32"]
        assert widths[key] == min(params.vector, 16 // nbytes), (key, widths, params)


@pytest.mark.parametrize("layout", ["expanded_inner", "size1_inner", "sliced_misaligned",
                                    "sliced_aligned", "transposed", "bias", "scalar_1x1"])
@pytest.mark.parametrize("N", [32, 36, 7])
def test_pointwise_input_layouts(layout, N):
    y = torch.randn(6, N)
    x = {"expanded_inner": torch.randn(6, 1).expand(6, N),
         "size1_inner": torch.randn(6, 1),
         "sliced_misaligned": torch.randn(6, N + 5)[:, 1:N + 1],
         "sliced_aligned": torch.randn(6, N + 8)[:, 4:N + 4],
         "transposed": torch.randn(N, 6).t(),
         "bias": torch.randn(N),
         "scalar_1x1": torch.randn(1, 1)}[layout]
    with FusionDefinition() as fd:
        a, b = fd.from_pytorch(x), fd.from_pytorch(y)
        fd.add_output(fd.ops.mul(fd.ops.sigmoid(a), b))
    # The pointwise scheduler's reads ("transposed" is the transpose scheduler's by default).
    _, params, k, widths = check(fd, [x, y], scheduler=pointwise)
    # No broadcast input and rows of 7: vectors across the rows of the dense output and y,
    # x (not dense) element-wise.
    ragged = N % 4 != 0 and layout in ("sliced_misaligned", "sliced_aligned", "transposed")
    assert params.ragged == ragged
    assert widths[("output", 0)] == params.vector == (4 if N % 4 == 0 or ragged else 1)
    assert widths[("input", 1)] == params.vector
    readable = layout == "bias" or (layout == "sliced_aligned" and N % 4 == 0)
    assert widths[("input", 0)] == (params.vector if readable else 1)


@pytest.mark.parametrize("shape", [(64, 1), (64, 3, 1), (1, 64)])
def test_pointwise_size_1_dims(shape):
    """Size-1 (broadcast) dims innermost or outermost: element-wise where the innermost dim is
    one, 16-byte accesses along the dim where it is not."""
    x = torch.randn(*shape)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.exp(fd.from_pytorch(x)))
    _, params, k, widths = check(fd, [x])
    assert params.vector == (4 if shape[-1] == 64 else 1)
    assert widths[("input", 0)] == widths[("output", 0)] == params.vector


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("out_dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("N", [64, 40, 7])
def test_reduction_of_bf16_into_fp32_or_bf16(dim, out_dtype, N):
    """Row and column sums of bf16 data: the outer reduction stores its fp32 results in 4-wide
    accesses of a loop vectorized 8-wide for the bf16 input."""
    x = _rand((33, N), "bf16")
    with FusionDefinition() as fd:
        a = fd.from_pytorch(x)
        s = fd.ops.sum(fd.ops.cast(a, F32), [dim])
        fd.add_output(fd.ops.cast(s, BF16) if out_dtype == "bf16" else s)
    sch, params, k, widths = check(fd, [x])
    assert sch is reduction
    assert widths[("input", 0)] == params.vector
    if dim == 0 and params.vector > 1:
        assert widths[("output", 0)] == min(params.vector, 4 if out_dtype == "fp32" else 8)


@pytest.mark.parametrize("layout", ["sliced_misaligned", "sliced_aligned", "expanded_row"])
@pytest.mark.parametrize("dim", [0, 1])
def test_reduction_input_layouts(layout, dim):
    N = 40
    x = {"sliced_misaligned": torch.randn(9, N + 3)[:, 1:N + 1],
         "sliced_aligned": torch.randn(9, N + 8)[:, 4:N + 4],
         "expanded_row": torch.randn(1, N).expand(9, N)}[layout]
    y = torch.randn(9, N)
    with FusionDefinition() as fd:
        a, b = fd.from_pytorch(x), fd.from_pytorch(y)
        fd.add_output(fd.ops.sum(fd.ops.mul(a, b), [dim]))
    sch, params, k, widths = check(fd, [x, y])
    assert sch is reduction
    # An expanded row (stride 0 across rows) is read with vectors along the row.
    assert widths[("input", 0)] == (1 if layout == "sliced_misaligned" else params.vector)


@pytest.mark.parametrize("N", [1000, 1032, 7, 36])
@pytest.mark.parametrize("weight", ["bf16", "fp32"])
def test_inner_persistent_mixed_dtype_weight(N, weight):
    """RMSNorm of bf16 rows with a bf16 or fp32 weight: the loop's width is 16 bytes of the
    widest row input; each tensor takes its own width."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=BF16)
        w = fd.define_tensor([-1], dtype=BF16 if weight == "bf16" else F32)
        xf = fd.ops.cast(x, F32)
        rstd = fd.ops.rsqrt(fd.ops.add(fd.ops.mean(fd.ops.mul(xf, xf), [1], keepdim=True), 1e-5))
        fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.mul(xf, rstd), fd.ops.cast(w, F32)), BF16))
    inputs = [_rand((5, N), "bf16"), _rand((N,), weight)]
    sch, params, k, widths = check(fd, inputs)
    assert sch is inner_persistent
    assert widths[("input", 0)] == widths[("input", 1)] == widths[("output", 0)] == params.vector


@pytest.mark.parametrize("layout", ["sliced_misaligned", "sliced_aligned"])
def test_inner_persistent_sliced_rows(layout):
    N = 64
    x = {"sliced_misaligned": torch.randn(5, N + 3).to(torch.bfloat16)[:, 1:N + 1],
         "sliced_aligned": torch.randn(5, N + 8).to(torch.bfloat16)[:, 8:N + 8]}[layout]
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], contiguity=[False, True], dtype=BF16)
        af = fd.ops.cast(a, F32)
        e = fd.ops.exp(fd.ops.sub(af, fd.ops.max(af, [1], keepdim=True)))
        fd.add_output(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)))
    sch, params, k, widths = check(fd, [x])
    assert sch is inner_persistent
    assert widths[("output", 0)] == min(params.vector, 4)
    assert widths[("input", 0)] == (8 if layout == "sliced_aligned" else 1)


def _norm_backward(dx_dtype, N):
    """RMSNorm backward with bf16 x, dy, w, an fp32 rstd [M, 1] and a dx of `dx_dtype`."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=BF16)
        dy = fd.define_tensor([-1, -1], dtype=BF16)
        w = fd.define_tensor([-1], dtype=BF16)
        rstd = fd.define_tensor([-1, 1], dtype=F32)
        xhat = fd.ops.mul(fd.ops.cast(x, F32), rstd)
        g = fd.ops.mul(fd.ops.cast(dy, F32), fd.ops.cast(w, F32))
        c = fd.ops.mean(fd.ops.mul(g, xhat), [1], keepdim=True)
        dx = fd.ops.mul(fd.ops.sub(g, fd.ops.mul(xhat, c)), rstd)
        fd.add_output(fd.ops.cast(dx, dx_dtype) if dx_dtype != F32 else dx)
        fd.add_output(fd.ops.sum(fd.ops.mul(fd.ops.cast(dy, F32), xhat), [0]))
    M = 6
    inputs = [_rand((M, N), "bf16"), _rand((M, N), "bf16"), _rand((N,), "bf16"),
              torch.rand(M, 1) + 0.5]
    return fd, inputs


@pytest.mark.parametrize("dx_dtype", [BF16, F32])
@pytest.mark.parametrize("N", [1024, 40, 7])
def test_inner_outer_fp32_dx_and_dw_of_bf16_rows(dx_dtype, N):
    """The norm backward: bf16 rows read 8-wide, an fp32 dx stored 4-wide, the per-row rstd
    [M, 1] read element-wise."""
    import dataclasses
    fd, inputs = _norm_backward(dx_dtype, N)
    st = setup(fd, inputs, alignment=16)
    params = inner_outer_persistent.compute_heuristics(st.fusion, st.info)
    params = dataclasses.replace(params, grid=4)
    sch, params, k, widths = check(fd, inputs, scheduler=inner_outer_persistent, params=params)
    for j in (0, 1):        # unless copied by TMA (then no register load of the row)
        assert widths.get(("input", j), params.vector) == params.vector
    assert widths[("input", 2)] == params.vector and widths[("input", 3)] == 1
    assert widths[("output", 0)] == min(params.vector, 4 if dx_dtype == F32 else 8)


def test_catalogue_norms_keep_their_16_byte_accesses():
    """No change for fusions of one dtype: bf16 rows, weights and outputs 8-wide."""
    for name in ("rmsnorm_fwd", "layernorm_fwd", "softmax"):
        fd = catalogue.define(name, "bf16")
        inputs = catalogue.make_inputs(name, 3, 64, "bf16", seed=0)
        sch, params, k, widths = check(fd, inputs)
        assert set(widths.values()) == {8}, (name, widths)


def _fusion(tensors, body):
    with FusionDefinition() as fd:
        outs = body(fd, *[fd.from_pytorch(t) for t in tensors])
        for o in (outs if isinstance(outs, (list, tuple)) else [outs]):
            fd.add_output(o)
    return fd


REDUCTION_CASES = {
    # name: (inputs, body, expected input widths)
    "int64": (lambda: [_rand((9, 40), "int64")], lambda fd, a, d: fd.ops.sum(a, [d]), [2]),
    "bool": (lambda: [_rand((9, 40), "bool")],
             lambda fd, a, d: fd.ops.sum(fd.ops.cast(a, F32), [d]), [8]),
    "bf16_times_fp32": (lambda: [_rand((9, 40), "bf16"), _rand((9, 40), "fp32")],
                        lambda fd, a, b, d: fd.ops.sum(fd.ops.mul(fd.ops.cast(a, F32), b), [d]),
                        [4, 4]),
    "bf16_max": (lambda: [_rand((9, 40), "bf16")], lambda fd, a, d: fd.ops.max(a, [d]), [8]),
    # The expanded input beside a dense one: a sum over the expanded dim of the expanded input
    # alone is no reduction (the frontend makes it 40 times the one element).
    "expanded_inner": (lambda: [torch.randn(9, 1).expand(9, 40), _rand((9, 40), "fp32")],
                       lambda fd, a, b, d: fd.ops.sum(fd.ops.mul(a, b), [d]), [1, 4]),
}


@pytest.mark.parametrize("case", list(REDUCTION_CASES))
@pytest.mark.parametrize("dim", [0, 1])
def test_reduction_dtypes_and_expanded_inputs(case, dim):
    make, body, expect = REDUCTION_CASES[case]
    inputs = make()
    fd = _fusion(inputs, lambda fd, *vs: body(fd, *vs, dim))
    sch, params, k, widths = check(fd, inputs)
    assert sch is reduction
    assert [widths[("input", j)] for j in range(len(inputs))] == expect


def _softmax(fd, af):
    e = fd.ops.exp(fd.ops.sub(af, fd.ops.max(af, [1], keepdim=True)))
    return fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True))


@pytest.mark.parametrize("x_dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("out_dtype", [BF16, F32])
def test_masked_softmax_with_a_bool_mask(x_dtype, out_dtype):
    """bf16 or fp32 rows with a bool mask [M, N]: the mask is read with the row's width (8 or
    4 bytes), the output with its own dtype's."""
    x, m = _rand((6, 72), x_dtype), _rand((6, 72), "bool")

    def body(fd, a, mask):
        y = _softmax(fd, fd.ops.where(mask, fd.ops.cast(a, F32), -1e4))
        return fd.ops.cast(y, out_dtype) if out_dtype != F32 else y
    sch, params, k, widths = check(_fusion([x, m], body), [x, m])
    assert sch is inner_persistent
    assert widths[("input", 0)] == widths[("input", 1)] == params.vector
    assert widths[("output", 0)] == min(params.vector, 16 // out_dtype.size)


@pytest.mark.parametrize("case", ["int64_rows", "fp64_weight", "expanded_weight", "odd_row"])
def test_inner_persistent_row_dtypes(case):
    x = {"int64_rows": _rand((5, 64), "int64"), "odd_row": _rand((5, 1001), "bf16")}.get(
        case, _rand((5, 64), "bf16"))
    w = {"fp64_weight": torch.randn(64, dtype=torch.float64),
         "expanded_weight": torch.randn(1).to(torch.bfloat16).expand(64)}.get(
        case, torch.randn(x.shape[1]).to(torch.bfloat16))

    def body(fd, a, ww):
        af = fd.ops.cast(a, F32)
        r = fd.ops.rsqrt(fd.ops.add(fd.ops.mean(fd.ops.mul(af, af), [1], keepdim=True), 1e-5))
        return fd.ops.cast(fd.ops.mul(fd.ops.mul(af, r), fd.ops.cast(ww, F32)), BF16)
    sch, params, k, widths = check(_fusion([x, w], body), [x, w])
    assert sch is inner_persistent
    expect = {"int64_rows": (2, 2, 2), "fp64_weight": (2, 2, 2), "expanded_weight": (8, 1, 8),
              "odd_row": (1, 1, 1)}[case]
    assert (widths[("input", 0)], widths[("input", 1)], widths[("output", 0)]) == expect


@pytest.mark.parametrize("case", ["expand", "sum_of_expanded"])
def test_expanded_outputs_hold_every_element(case):
    """An output whose dim is an expanded broadcast (an expand, or the sum over the other dim
    of an expanded input) was allocated dense but written at one position of that dim: the rest
    was never written. It is allocated expanded (stride 0), as torch's expand is."""
    x = torch.randn(5, 1) if case == "expand" else torch.randn(9, 1).expand(9, 40)

    def body(fd, a):
        if case == "expand":
            return fd.ops.expand(fd.ops.exp(a), [-1, 16])
        return fd.ops.sum(a, [0])
    fd = _fusion([x], body)
    check(fd, [x])
    (o,) = fd.execute([x], options={"enable": ["interpret"]})
    assert fd.last_run.kind == "kernels"
    torch.testing.assert_close(o, torch.exp(x).expand(5, 16) if case == "expand" else x.sum(0))
    assert output_strides(fd.fusion.outputs[0], list(o.shape)) == (
        [1, 0] if case == "expand" else [0])


@pytest.mark.parametrize("case", ["fp32_norm_output", "int64_input"])
def test_narrower_vectors_compile_clean(case):
    """A tensor accessed narrower than its loop's vector split (two 4-wide fp32 stores per 8
    bf16 elements, two 2-wide int64 loads per 4 fp32 ones): CUDA that NVRTC compiles for sm_90a
    without spills."""
    from kir_testing import compile_clean
    from pyfuser.codegen.cuda import generate_cuda
    if case == "fp32_norm_output":
        fd = rmsnorm_with_rstd(F32, stats=False)
        inputs = [torch.empty(64, 4096, dtype=torch.bfloat16),
                  torch.empty(4096, dtype=torch.bfloat16)]
        widths = {("input", 0): 8, ("output", 0): 4}
    else:
        x, y = _rand((64, 1024), "fp32"), _rand((64, 1024), "int64")
        fd = _fusion([x, y], lambda fd, a, b: fd.ops.add(a, fd.ops.cast(b, F32)))
        inputs = [x, y]
        widths = {("input", 0): 4, ("input", 1): 2, ("output", 0): 4}
    _, _, _, k = schedule_and_lower(fd, inputs, alignment=16)
    assert {key: w for key, w in global_widths(k).items() if key in widths} == widths
    compile_clean(generate_cuda(k))


# 6. Broadcast inputs of a wider dtype than the loop's width --------------------------------------
# A [1, N] or [N] input is read in the flat loop of the [M, N] output. Wider than the output's
# dtype (int64 beside fp32, fp32 beside bf16), its cache splits the loop's vector further (2 x
# int64 in a loop of 4 fp32 lanes); those loops stand for the same split of the output's loop
# (lower/context.py), else its index could not be found from the loops (its flat loop over N is
# not the output's over M * N).
@pytest.mark.parametrize("shape,bshape,out,wide", [
    ((7, 8), (1, 8), "fp32", "int64"),
    ((7, 8), (8,), "fp32", "int64"),
    ((7, 64), (1, 64), "bf16", "fp32"),
    ((5, 40), (1, 40), "bf16", "int64"),
    ((6, 7, 7, 8), (1, 7, 1, 8), "fp32", "int64"),
])
def test_pointwise_broadcast_input_wider_than_the_output(shape, bshape, out, wide):
    x, b = _rand(shape, out), _rand(bshape, wide)
    with FusionDefinition() as fd:
        a = fd.from_pytorch(x)
        w = fd.define_tensor([1 if n == 1 else -1 for n in bshape], dtype=from_torch(b.dtype))
        fd.add_output(fd.ops.add(a, fd.ops.cast(w, from_torch(x.dtype))))
    sch, params, k, widths = check(fd, [x, b])
    assert sch is pointwise and params.vector == 16 // x.element_size()
    assert widths[("input", 1)] == 16 // b.element_size() < params.vector
    assert widths[("input", 0)] == widths[("output", 0)] == params.vector


def test_fuzz_7_91_int32_minus_one_maximum_with_an_int64_row():
    """Fuzz case 7:91, shrunk: maximum(int32 [6, 7, 7, 8] - 1.0, int64 [1, 7, 1, 8]) (the int64
    row is read 2-wide in the fp32 loop of 4)."""
    t = _rand((6, 7, 7, 8), "int64").to(torch.int32)
    r = torch.randint(0, 16, (92,))[36:].as_strided((1, 7, 1, 8), (0, 8, 8, 1))
    with FusionDefinition() as fd:
        a, b = fd.from_pytorch(t), fd.from_pytorch(r)
        fd.add_output(fd.ops.maximum(fd.ops.sub(a, 1.0), b))
    sch, params, k, widths = check(fd, [t, r])
    assert sch is pointwise and widths[("input", 1)] == 2

