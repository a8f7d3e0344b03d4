"""The outer persistent scheduler: normalizations over the dims outermost in memory (softmax,
log_softmax and a normalization over dim 0, softmax over dim 1 of a column-major input).
Which fusions it takes and why not, its heuristic against the H100 entry of the device table,
its kernels on the interpreter against float64, and the NVRTC compile of the bench shape."""
import re
import sys
import warnings
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lower"))
from kir_testing import compile_clean, schedule_and_lower, setup  # noqa: E402

from pyfuser import DataType, FusionDefinition, catalogue, options  # noqa: E402
from pyfuser.codegen.cuda import generate_cuda  # noqa: E402
from pyfuser.runtime.device import get_device_properties  # noqa: E402
from pyfuser.runtime.executor import FallbackWarning  # noqa: E402
from pyfuser.schedule.schedulers import outer_persistent as op  # noqa: E402
from pyfuser.schedule.schedulers import registry  # noqa: E402
from pyfuser.schedule.schedulers.base import SchedulerError  # noqa: E402
from pyfuser.schedule.segmenter import segment  # noqa: E402
from pyfuser.testing import run_and_check  # noqa: E402

DT = {"fp32": DataType.Float, "bf16": DataType.BFloat16, "fp16": DataType.Half}
TORCH = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
INTERPRET = {"enable": ["interpret"]}


def _in(fd, dt, shape=(-1, -1), stride_order=None):
    x = fd.define_tensor(list(shape), dtype=DT[dt], stride_order=stride_order)
    return x, fd.ops.cast(x, DataType.Float)


def softmax(dt, dim=0, stride_order=None, log=False):
    with FusionDefinition() as fd:
        _, xf = _in(fd, dt, stride_order=stride_order)
        z = fd.ops.sub(xf, fd.ops.max(xf, [dim], keepdim=True))
        e = fd.ops.exp(z)
        s = fd.ops.sum(e, [dim], keepdim=True)
        y = fd.ops.sub(z, fd.ops.log(s)) if log else fd.ops.div(e, s)
        fd.add_output(fd.ops.cast(y, DT[dt]))
    return fd


def normalization(dt, eps=1e-5):
    """(x - mean(x, 0)) * rsqrt(var(x, 0) + eps) * w + b, w and b over the columns."""
    with FusionDefinition() as fd:
        _, xf = _in(fd, dt)
        w = fd.define_tensor([-1], dtype=DT[dt])
        b = fd.define_tensor([-1], dtype=DT[dt])
        var, mean = fd.ops.var_mean(xf, [0], correction=0, keepdim=True)
        y = fd.ops.mul(fd.ops.sub(xf, mean), fd.ops.rsqrt(fd.ops.add(var, eps)))
        y = fd.ops.add(fd.ops.mul(y, fd.ops.cast(w, DataType.Float)),
                       fd.ops.cast(b, DataType.Float))
        fd.add_output(fd.ops.cast(y, DT[dt]))
    return fd


def _inputs(name, dt, R, C, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(R, C, generator=g) * 3).to(TORCH[dt])
    if name == "normalization":
        return [x, torch.randn(C, generator=g).to(TORCH[dt]),
                torch.randn(C, generator=g).to(TORCH[dt])]
    return [x]


FUSIONS = {"softmax": lambda dt: softmax(dt), "log_softmax": lambda dt: softmax(dt, log=True),
           "normalization": normalization}


# Which fusions it takes -------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(FUSIONS))
def test_normalizations_over_dim_0_go_to_the_outer_persistent_scheduler(name):
    fusion = FUSIONS[name]("bf16").fusion
    choice = registry.choose(fusion)
    assert choice.scheduler is op, choice.reason
    assert choice.reason.startswith("reductions over the outermost dims broadcast back")
    # Before it existed, they fell back: the schedulers tried first refuse them, and the plain
    # reduction scheduler refuses a result broadcast back.
    assert [n for n, _ in choice.rejected] == ["inner_outer_persistent"]
    ok, why = registry.by_name("inner_persistent").can_schedule(fusion)
    assert not ok and "not innermost" in why
    ok, why = registry.by_name("reduction").can_schedule(fusion)
    assert not ok and "broadcast back" in why


def test_the_catalogue_softmax_over_dim_0_is_an_outer_persistent_fusion():
    entry = catalogue.get("softmax_dim0")
    assert entry.kind == "outer_persistent"
    assert registry.choose(catalogue.define("softmax_dim0").fusion).scheduler is op


def test_softmax_over_the_inner_dim_of_a_row_major_input_stays_inner_persistent():
    fusion = softmax("bf16", dim=1).fusion
    assert op.can_schedule(fusion) == (False, "the reduced dims are not outermost in memory")
    assert registry.choose(fusion).scheduler.NAME == "inner_persistent"


def test_the_order_in_memory_decides_not_the_logical_order():
    # stride_order [0, 1]: dim 1 outermost in memory (a column-major [R, C]). Softmax over dim
    # 1 reduces the dim outermost in memory: the outer persistent scheduler takes it, and the
    # one over dim 0 (innermost in memory) is left to the others.
    over_1 = softmax("bf16", dim=1, stride_order=[0, 1]).fusion
    assert op.outer_layout(over_1, op.reference_reduction(op.reduction_tensors(over_1)))[0]
    assert registry.choose(over_1).scheduler is op
    over_0 = softmax("bf16", dim=0, stride_order=[0, 1]).fusion
    assert op.can_schedule(over_0) == (False, "the reduced dims are not outermost in memory")


def test_refusals_give_their_reason():
    with FusionDefinition() as fd:              # a column sum: nothing broadcast back
        _, xf = _in(fd, "fp32")
        fd.add_output(fd.ops.sum(xf, [0]))
    assert op.can_schedule(fd.fusion) == (
        False, "no reduction result is broadcast back over the reduced dims")
    with FusionDefinition() as fd:              # reduced dim between kept dims in memory
        _, xf = _in(fd, "fp32", (-1, -1, -1))
        fd.add_output(fd.ops.sub(xf, fd.ops.max(xf, [1], keepdim=True)))
    assert op.can_schedule(fd.fusion) == (
        False, "the reduced dims interleave with the kept dims in memory")
    with FusionDefinition() as fd:              # a row and a column statistic
        _, xf = _in(fd, "fp32")
        y = fd.ops.sub(xf, fd.ops.max(xf, [0], keepdim=True))
        fd.add_output(fd.ops.sub(y, fd.ops.sum(y, [1], keepdim=True)))
    assert op.can_schedule(fd.fusion) == (False, "reductions over different dims")
    with FusionDefinition() as fd:              # everything reduced
        _, xf = _in(fd, "fp32")
        fd.add_output(fd.ops.sub(xf, fd.ops.sum(xf, [0, 1], keepdim=True)))
    assert op.can_schedule(fd.fusion) == (False, "a full reduction (no kept dims) is not "
                                                 "supported yet")


# Heuristics against the H100 ----------------------------------------------------------------------
def _heuristic(fd, shapes, dt, device="h100"):
    ins = [torch.empty(s, dtype=TORCH[dt]) for s in shapes]
    st = setup(fd, ins, device=device, alignment=16)
    return op.compute_heuristics(st.fusion, st.info)


@pytest.mark.parametrize("R,C,dt,want", [
    # (vector, bdimx, bdimy, P): P x V <= 64 elements per thread of 512; vectors narrowed from
    # 16 bytes until at most MAX_FOLD_ROWS (128) threads fold a column (H100 sweep: 960 GB/s
    # at V=8, By=256; 1093 at V=4, By=128).
    (2048, 8192, "bf16", (4, 4, 128, 16)),
    (2048, 8192, "fp32", (4, 4, 128, 16)),
    (1024, 4096, "bf16", (4, 4, 128, 8)),
    (128, 4096, "bf16", (8, 2, 128, 1)),
    # (8192 rows of bf16 fit 4-wide vectors only, 8 bytes of each row: refused, and run as a
    # plan of kernels; tests/schedule/test_split_normalizations.py.)
    # 32768 fp32 rows: element-wise, P = 64.
    (32768, 8, "fp32", (1, 1, 512, 64)),
    (7, 5, "fp32", (1, 4, 7, 1)),
    (1000, 3, "bf16", (1, 2, 125, 8)),
])
def test_heuristic_on_the_h100(R, C, dt, want):
    p = _heuristic(softmax(dt), [(R, C)], dt)
    assert (p.vector, p.bdimx, p.bdimy, p.persistent_batch) == want, p
    assert p.reduced_extents == (R,)
    assert p.bdimx * p.bdimy <= op.MAX_THREADS
    assert p.bdimy * p.persistent_batch >= R > (p.bdimy - 1) * p.persistent_batch
    assert p.persistent_batch * p.vector <= op.MAX_ELEMENTS_PER_THREAD
    assert p.vector_inputs == ((0,) if p.vector > 1 else ())
    assert hash(p) == hash(_heuristic(softmax(dt), [(R, C)], dt))
    assert "132 SMs" in p.reason


def test_heuristic_reads_the_device_table():
    h100 = _heuristic(softmax("bf16"), [(2048, 8192)], "bf16", "h100")
    small = _heuristic(softmax("bf16"), [(2048, 8192)], "bf16", "h100-4sm")
    assert h100 == small and "4 SMs" in small.reason and "132 SMs" in h100.reason
    assert get_device_properties("h100").sm_count == 132


@pytest.mark.parametrize("R,dt", [(65536, "bf16"), (65536, "fp32")])
def test_columns_that_do_not_fit_registers_take_the_looped_variant(R, dt):
    p = _heuristic(softmax(dt), [(R, 8192)], dt)
    assert p.persistent_batch == 0 and p.reduced_extents == ()
    assert (p.vector, p.bdimx * p.bdimy) == (8 if dt == "bf16" else 4, op.MAX_THREADS)
    assert re.match(rf"looped: {R} reduced rows need .* fit registers", p.reason), p.reason
    assert "(looped)" in p.describe()


@pytest.mark.parametrize("name", list(FUSIONS))
@pytest.mark.parametrize("dt", ["fp32", "bf16"])
def test_interpreted_looped_kernels_match_float64(name, dt, monkeypatch):
    # 16 threads per block: 3000 and 2049 rows do not fit registers, so the looped variant
    # runs at sizes the interpreter takes (with the few column tiles it is refused for).
    monkeypatch.setattr(op, "MAX_THREADS", 16)
    monkeypatch.setattr(op, "MIN_LOOPED_SM_FRACTION", 0)
    for shape in [(3000, 5), (2049, 40)]:
        fd = FUSIONS[name](dt)
        run_and_check(fd, _inputs(name, dt, *shape), scheduler="outer_persistent",
                      options=INTERPRET)
        (p,) = fd.last_run.heuristics
        assert p.persistent_batch == 0 and p.bdimx * p.bdimy == 16


@pytest.mark.parametrize("C", [8, 2048])
def test_looped_columns_that_leave_most_sms_idle_are_refused(C):
    """65536 rows of 8 (or 2048) bf16 columns looped in 1 (64) column tiles: at most half of
    the H100's 132 SMs would work; the heuristic refuses, and execute() plans the fusion
    without this scheduler (test_executor_cpu)."""
    with pytest.raises(SchedulerError, match=r"grid-persistent plan"):
        _heuristic(softmax("bf16"), [(65536, C)], "bf16")


def test_a_refused_batchnorm_of_a_channels_last_image_is_planned_without_it():
    """BatchNorm statistics of a channels-last [32, 256, 56, 56]: 100352 rows of 256 columns
    (the looped variant would use 16 SMs, 30 GB/s measured on the H200). explain shows the plan
    execute() makes instead: reductions and pointwise kernels, no reference segment."""
    x = torch.empty(32, 256, 56, 56, dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        var, mean = fd.ops.var_mean(fd.ops.cast(t, DataType.Float), [0, 2, 3], correction=0,
                                    keepdim=True)
        fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.sub(fd.ops.cast(t, DataType.Float), mean),
                                             fd.ops.rsqrt(fd.ops.add(var, 1e-5))),
                                  DataType.BFloat16))
    assert op.can_schedule(fd.fusion)[0]
    plan = fd.explain([x.to("meta")], device="h100")
    (seg,) = plan.segments
    assert seg.name == "outer_persistent" and "grid-persistent" in seg.refused
    # (The rewrite's own executor offers it to every scheduler: refused by this one again.)
    again = [(s.kind, s.name) for s in seg.again.segments_run]
    assert again and ("kernel", "outer_persistent") not in again
    assert ("reference", "reference") not in again
    assert "plans this segment again without the outer_persistent scheduler" in str(plan)


def test_looped_softmax_over_dim_0_compiles_without_spills(monkeypatch):
    monkeypatch.setattr(op, "MIN_LOOPED_SM_FRACTION", 0)     # 4 column tiles: refused
    fd = softmax("fp32")
    _, _, p, kernel = schedule_and_lower(fd, [torch.empty(65536, 64)], scheduler=op)
    assert p.persistent_batch == 0
    src = generate_cuda(kernel)
    assert len(re.findall(r"pf::block_allreduce_y_group<4>", src)) == 2
    compile_clean(src)


# Kernels on the interpreter against float64 ------------------------------------------------------
@pytest.mark.parametrize("name", list(FUSIONS))
@pytest.mark.parametrize("dt", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("shape", [(7, 5), (33, 17), (1000, 3), (1, 9)])
def test_interpreted_kernels_match_float64(name, dt, shape):
    fd = FUSIONS[name](dt)
    run_and_check(fd, _inputs(name, dt, *shape), scheduler="outer_persistent", options=INTERPRET)


@pytest.mark.parametrize("name", list(FUSIONS))
def test_interpreted_vectorized_kernels_match_float64(name):
    # 96 rows x 40 columns of bf16: 8-wide vectors, P = 1, 5 column vectors over 4 threads
    # along x (one block holds a partial tile).
    fd = FUSIONS[name]("bf16")
    inputs = _inputs(name, "bf16", 96, 40)
    run_and_check(fd, inputs, scheduler="outer_persistent", options=INTERPRET)
    (p,) = fd.last_run.heuristics
    assert p.vector == 8 and p.vector_inputs == ((0, 1, 2) if name == "normalization" else (0,))


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dt,shape", [("bf16", (1500, 72)), ("fp16", (1200, 72))])
def test_interpreted_logsumexp_key_kernels_match_float64(name, dt, shape):
    # 16-bit columns of 1200 and 1500 rows: 64 elements a thread (4-wide vectors, a partial tile
    # of columns, the last row slots past the rows), the max and the sum of exp as one
    # reduction of (max, sum) keys; log_softmax keeps its sum's log for the outputs.
    fd = FUSIONS[name](dt)
    run_and_check(fd, _inputs(name, dt, *shape), scheduler="outer_persistent", options=INTERPRET)
    (p,) = fd.last_run.heuristics
    assert p.logsumexp_keys and p.persistent_batch * p.vector == 64, p


def test_interpreted_softmax_over_dim_1_of_a_column_major_input():
    fd = softmax("bf16", dim=1, stride_order=[0, 1])
    x = torch.randn(40, 300).to(torch.bfloat16).t().contiguous().t()     # [40, 300], col-major
    run_and_check(fd, [x], scheduler="outer_persistent", options=INTERPRET)
    (p,) = fd.last_run.heuristics
    # Vectors along dim 0, the input's stride-1 dim; 300 reduced rows.
    assert p.vector == 8 and p.reduced_extents == (300,)


def test_interpreted_reduction_over_the_two_outer_dims():
    # x [A, B, C] normalized over A and B (BatchNorm's statistics of a channels-last tensor,
    # flattened): the reduced dims merge into one of A * B rows.
    with FusionDefinition() as fd:
        _, xf = _in(fd, "fp32", (-1, -1, -1))
        var, mean = fd.ops.var_mean(xf, [0, 1], correction=0, keepdim=True)
        fd.add_output(fd.ops.mul(fd.ops.sub(xf, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5))))
    run_and_check(fd, [torch.randn(5, 13, 12)], scheduler="outer_persistent", options=INTERPRET)
    assert fd.last_run.heuristics[0].reduced_extents == (5, 13)


def test_an_output_over_one_of_two_reduced_dims_is_another_segment():
    """x [A, B, C] normalized over A and B, beside an output of a [1, B, 1] input alone (fuzz
    20261327:2369): that output's loop along threadIdx.y runs over B, not the merged A * B
    rows, so the kernel left elements of it unwritten. The outer persistent scheduler leaves
    it to another segment; the plan of four segments (x * y stored for an outer persistent
    kernel of the statistics) loses to the split's three (a one-pass variance reading x and
    y, schedule/split_normalizations.py)."""
    with FusionDefinition() as fd:
        _, xf = _in(fd, "fp32", (-1, -1, -1))
        y = fd.define_tensor([1, -1, 1], dtype=DataType.Float)
        var, mean = fd.ops.var_mean(fd.ops.mul(xf, y), [0, 1], correction=0, keepdim=True)
        fd.add_output(fd.ops.mul(fd.ops.sub(xf, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5))))
        fd.add_output(fd.ops.exp(y))
    ok, why = op.can_schedule(fd.fusion)
    assert not ok and "iterates some of the reduced dims" in why
    fused = FusionDefinition()
    with fused:                 # the same without y: taken whole
        _, xf = _in(fused, "fp32", (-1, -1, -1))
        var, mean = fused.ops.var_mean(xf, [0, 1], correction=0, keepdim=True)
        fused.add_output(fused.ops.sub(xf, mean))
    assert op.can_schedule(fused.fusion)[0]
    run_and_check(fd, [torch.randn(5, 13, 12), torch.randn(1, 13, 1)], kernels=None,
                  options=INTERPRET)
    assert {s.kind for s in fd.last_run.segments} == {"kernel"}
    assert fd.last_run.schedulers == ("reduction", "pointwise", "pointwise")
    assert fd.last_run.reason.startswith("normalization split")


def test_an_input_over_one_of_two_reduced_dims_is_refused():
    """var over dims 0 and 1 of min(x [3, 13, N], w [1, 13, 1]) (fuzz 20261330:1384): w's
    cache, held for the column, was laid out over its own row loop (13, not 3 x 13), and the
    rows read registers never written. The plan takes it in other kernels, right."""
    with FusionDefinition() as fd:
        _, xf = _in(fd, "fp32", (-1, -1, -1))
        w = fd.define_tensor([1, -1, 1], dtype=DataType.Float)
        fd.add_output(fd.ops.var(fd.ops.minimum(xf, w), [0, 1], correction=1))
    ok, why = op.can_schedule(fd.fusion)
    assert not ok and "iterates some of the reduced dims" in why
    run_and_check(fd, [torch.randn(3, 13, 1024), torch.randn(1, 13, 1)], kernels=None,
                  options=INTERPRET)
    # Not min(x, w) stored by a pointwise kernel for the column schedule's variance: the
    # split's one reduction kernel of float64 sums (schedule/one_pass_variance.py).
    assert fd.last_run.schedulers == ("reduction",)
    assert fd.last_run.reason.startswith("normalization split")


def test_interpreted_kernel_with_a_per_column_statistic_output():
    # softmax over dim 0 returning the column maxima [1, C] too.
    with FusionDefinition() as fd:
        _, xf = _in(fd, "fp32")
        m = fd.ops.max(xf, [0], keepdim=True)
        e = fd.ops.exp(fd.ops.sub(xf, m))
        fd.add_output(fd.ops.div(e, fd.ops.sum(e, [0], keepdim=True)))
        fd.add_output(m)
    run_and_check(fd, [torch.randn(37, 21)], scheduler="outer_persistent", options=INTERPRET)


def test_the_segmenter_gives_the_softmax_over_dim_0_to_the_outer_persistent_scheduler():
    # softmax over dim 0, then a row sum of it: two segments, the first one ours. The
    # executor runs the split's two instead, which store the logsumexp's [19] keys between
    # them where ours store y (schedule/split_normalizations.py).
    with FusionDefinition() as fd:
        _, xf = _in(fd, "fp32")
        e = fd.ops.exp(fd.ops.sub(xf, fd.ops.max(xf, [0], keepdim=True)))
        y = fd.ops.div(e, fd.ops.sum(e, [0], keepdim=True))
        fd.add_output(fd.ops.sum(y, [1]))
    inputs = [torch.randn(29, 19)]
    segmented = segment(fd.fusion)
    assert [(s.kind, s.name) for s in segmented.segments] == [
        ("kernel", "outer_persistent"), ("kernel", "reduction")]
    run_and_check(fd, inputs, kernels=0, options=INTERPRET,
                  segments=(("kernel", "reduction"), ("kernel", "reduction")))
    assert fd.last_run.reason.startswith("normalization split")


def test_explain_shows_the_outer_persistent_plan():
    fd = catalogue.define("softmax_dim0")
    text = str(fd.explain([torch.empty(2048, 8192, dtype=torch.bfloat16, device="meta")],
                          device="h100"))
    assert "outer_persistent" in text
    assert "outer persistent: block 4x128, 16 columns per block, 16 x 4 elements" in text


# NVRTC --------------------------------------------------------------------------------------------
def test_softmax_over_dim_0_of_2048x8192_bf16_compiles_without_spills():
    fd = catalogue.define("softmax_dim0", "bf16")
    x = torch.empty(2048, 8192, dtype=torch.bfloat16)
    st, sch, p, kernel = schedule_and_lower(fd, [x])
    assert sch is op and (p.vector, p.bdimx, p.bdimy, p.persistent_batch) == (4, 4, 128, 16)
    assert p.logsumexp_keys
    src = generate_cuda(kernel)
    text = src[src.index("typedef"):]
    assert '__launch_bounds__(512) ' in text
    # The column reduction is one grouped block all-reduction of (max, sum) keys along
    # threadIdx.y; every load and store is one 8-byte vector (4 bf16: see MAX_FOLD_ROWS); exp
    # is evaluated for the outputs only (the keys' sums use ex2).
    assert re.findall(r"pf::block_allreduce_y_group<4>\([^;]*", text) == [
        "pf::block_allreduce_y_group<4>(*reinterpret_cast<long long(*)[4]>(&T12[0]), "
        "pf_red_ws_long_long, pf::OpLogSumExp())"]
    assert "block_allreduce_x" not in text
    assert len(re.findall(r"load_global_vec<[^>]*>\(\*reinterpret_cast<pf::Array<pf::bf16, 4>",
                          text)) == 1
    assert len(re.findall(r"store_global_vec\(", text)) == 1
    assert len(re.findall(r"pf::exp\(", text)) == 1
    # Two 512-thread blocks an SM: at most 64 registers (the two reductions' kernel took 104).
    rep = compile_clean(src)
    assert rep.registers <= 64, rep.summary()


@pytest.mark.parametrize("shape,dt,keys", [
    ((2048, 8192), "bf16", True),        # 64 elements a thread: exp(x - max) not held
    ((1024, 4096), "bf16", False),       # 32: held as floats
    ((2048, 4096), "fp32", False),       # float columns: one block an SM either way
])
def test_long_16_bit_columns_reduce_logsumexp_keys(shape, dt, keys):
    p = _heuristic(softmax(dt), [shape], dt)
    assert op.recomputes_transcendental(p) == (p.persistent_batch * p.vector > 32)
    assert p.logsumexp_keys == keys
    assert ("one logsumexp key reduction" in p.describe()) == keys
    # Not for a normalization (no max / sum-of-exp pair), nor with the option off.
    norm = _heuristic(normalization(dt), [shape, shape[1:], shape[1:]], dt)
    assert not norm.logsumexp_keys and op.recomputes_transcendental(norm) == (shape[0] == 2048)
    with options.override(disable=["one_pass_logsumexp"]):
        assert not _heuristic(softmax(dt), [shape], dt).logsumexp_keys


def test_normalization_over_dim_0_compiles_without_spills():
    fd = normalization("bf16")
    ins = [torch.empty(2048, 8192, dtype=torch.bfloat16)] + [torch.empty(8192, dtype=torch.bfloat16)] * 2
    _, _, p, kernel = schedule_and_lower(fd, ins, scheduler=op)
    assert p.vector_inputs == (0, 1, 2)
    compile_clean(generate_cuda(kernel))


def test_no_fallback_warning_on_the_interpreter():
    fd = softmax("fp16")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        fd.execute([torch.randn(65, 33).half()], options=INTERPRET)
    assert fd.last_run.schedulers == ("outer_persistent",)


def test_var_mean_over_an_expanded_and_a_reduced_dim():
    """var_mean over dims 0 (expanded: stride 0) and 1 of [17, 5, 747] (GPU fuzz 20261504:575):
    the mean [1, 1, N] is broadcast for its output, in a serial loop of one element, and for
    x - mean, in the rows' threadIdx.y loop; lowering refused to merge the two loops of the
    tensor inlined into both (a LoweringError, the segment ran on the reference). A serial
    loop of one broadcast element now merges into the other: its value is computed in each
    row thread alike, its write guarded to the first."""
    x = torch.randint(-8, 1, (3735,), dtype=torch.int32).as_strided((17, 5, 747), (0, 747, 1))
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        var, mean = fd.ops.var_mean(fd.ops.exp2(t0), [0, 1], keepdim=True, correction=1)
        fd.add_output(mean)
        fd.add_output(var)
    _outer_persistent_on_interpreter_and_nvrtc(fd, [x])


@pytest.mark.parametrize("rows, cols", [(4, 16), (33, 40), (2, 257)])
def test_columns_only_a_full_gives(rows, cols):
    """var_mean over the rows of full([M, N]) + x [M, 1] (CPU fuzz 20261606:375, :1058): the
    N columns come from the full alone. The kernel writes the sum in loops it shares with the
    mean's output, and recomputes the full for that write: the copy's dims had no producer
    mapping them to the original's, so lowering could not index the sum ("cannot index T4's
    axis ... from its loops", the fusion ran on the reference). A recomputed copy's dims now
    map to its original's (IdGraph)."""
    x = torch.randn(rows, 1).half()
    with FusionDefinition() as fd:
        t = fd.define_tensor(shape=[-1, 1], contiguity=[True, None], dtype=DataType.Half)
        ones = fd.ops.logical_not(fd.ops.le(fd.ops.full([rows, cols], 1.0,
                                                        dtype=DataType.Float), 0.5))
        v = fd.ops.add(ones, t)
        var, mean = fd.ops.var_mean(v, [0], keepdim=True, correction=0)
        for o in (v, var, mean):
            fd.add_output(o)
    _outer_persistent_on_interpreter_and_nvrtc(fd, [x])


def _outer_persistent_on_interpreter_and_nvrtc(fd, inputs):
    """One outer persistent kernel, right on the interpreter, compiled by NVRTC without spills."""
    run_and_check(fd, inputs, scheduler="outer_persistent", options=INTERPRET)
    pytest.importorskip("cuda.bindings.nvrtc")
    from pyfuser.runtime.fusion_kernel import compile_kernel
    fk, = fd.kernels(last_run=True)
    compile_kernel(fk)
    assert not fk.module.ptxas.has_spills, fk.module.ptxas.summary()
