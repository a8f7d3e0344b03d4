"""The looped variant of the inner persistent scheduler (CPU): rows too long for registers that
no cluster can split (an odd length has no vectors) are walked in serial steps once per pass,
each pass reading the inputs again; a softmax's max and sum of exp become one pass of
logsumexp keys. Heuristic choices against the device table, the kernels on the interpreter
against float64 at odd sizes, and the bar shapes compiled for sm_90a with a clean ptxas
report."""
import dataclasses
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lower"))
from kir_testing import empty_inputs, schedule_and_lower, setup  # noqa: E402
from pyfuser import catalogue, options  # noqa: E402
from pyfuser.schedule.schedulers import inner_persistent as ip  # noqa: E402
from pyfuser.schedule.schedulers.base import SchedulerError  # noqa: E402
from pyfuser.testing import run_and_check  # noqa: E402


def _params(name, M, N, dtype="bf16", device="h200"):
    fd = catalogue.define(name, dtype)
    st = setup(fd, empty_inputs(name, M, N, dtype), device=device)
    return ip.compute_heuristics(st.fusion, st.info)


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layernorm_fwd", "rmsnorm_fwd"])
@pytest.mark.parametrize("N,dtype", [(50257, "bf16"), (65537, "bf16"), (65537, "fp32")])
def test_odd_vocabulary_rows_take_the_looped_variant(name, N, dtype):
    # [*, 50257] bf16 held 128 unvectorized elements per thread in registers: ptxas took 128
    # registers and a 256-byte stack (871 GB/s on the H200). A 16-bit element alone takes a
    # whole register, so the register rows are refused and the row is looped.
    p = _params(name, 4096, N, dtype)
    assert p.looped and p.vector == 1 and p.vector_inputs == ()
    # LayerNorm reads x, w and b along the row: 4 loads of each per step, 16 in all.
    unroll = 4 if name == "layernorm_fwd" else 8
    assert (p.bdimx, p.bdimy, p.unroll, p.row_extents) == (1024, 1, unroll, ())
    assert "looped instead" in p.reason and "(looped)" in p.describe()
    assert "264 rows" in p.reason and ("within" in p.reason) == (dtype == "bf16" or N < 60000)


@pytest.mark.parametrize("name,N,dtype", [("softmax", 8192, "bf16"), ("softmax", 4097, "bf16"),
                                          ("layernorm_fwd", 16385, "bf16"),
                                          ("rmsnorm_fwd", 65536, "bf16"),
                                          ("layernorm_fwd", 131072, "bf16")])
def test_rows_that_fit_registers_or_a_cluster_stay_there(name, N, dtype):
    p = _params(name, 4096, N, dtype)
    assert not p.looped
    assert (p.cluster > 1) == (N >= 65536)


@pytest.mark.parametrize("name,N", [("softmax", 65536), ("log_softmax", 131072),
                                    ("softmax", 128256)])
def test_a_row_read_twice_looped_instead_of_a_cluster(name, N):
    # One reduction pass (the max and sum of exp fused) and the row the only input along it:
    # looped reads it twice, faster than a cluster holding it once (H200, session 20).
    p = _params(name, 4096, N)
    assert p.looped and p.vector == 8
    assert "a cluster of" in p.reason and "2 passes" in p.reason
    with options.override({"disable": ["one_pass_logsumexp"]}):
        # Three passes without the fused pair: the cluster stays.
        assert _params(name, 4096, N).cluster > 1


def test_cross_entropy_rows_are_looped():
    # Logits [8192, 128256] with per-row targets: the targets are not along the row, so the row
    # is still read twice in all; the per-row loss is computed once per thread, not per element
    # (inlining.py's _materialized_broadcast, context.py's _promote).
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    import bench_issue17
    from pyfuser.runtime.explain import explain_fusion
    fd, inputs, *_ = bench_issue17.cross_entropy("meta")
    e = explain_fusion(fd.fusion, inputs, device="h200")
    (k,) = e.kernels
    assert k.params.looped and "2 passes" in k.params.reason
    # The target's logit gathered and the log taken once (the index check with them), outside
    # the row's steps; before, once per element in each unswitch version, into a 128-float
    # register buffer.
    src = k.kernel.source.split("__global__")[-1]
    assert src.count("report_index_error(") == 1 and src.count("pf::log(") == 1
    # With the one-hot a scatter, its index check (on the target broadcast along the row) runs
    # once too, not per element: ptxas had spilled 1.7 KB around the per-element reports.
    fd, inputs, *_ = bench_issue17.cross_entropy_scatter("meta")
    (k,) = explain_fusion(fd.fusion, inputs, device="h200", compile=True).kernels
    assert k.params.looped
    assert k.kernel.source.split("__global__")[-1].count("report_index_error(") == 2
    assert "0 B spill stores" in k.ptxas


def test_a_lone_16_bit_element_takes_a_register():
    # 16385 bf16 in registers: 64 elements for each of 257 threads (vector 1), 64 registers
    # (counted 32 before), under the 0.6 x 227 allowed. 50257 needs 128 of 157: refused.
    p = _params("softmax", 4096, 16385)
    assert (p.vector, p.persistent_batch, p.bdimx, p.looped) == (1, 64, 257, False)


def test_rows_only_reduced_are_left_to_the_reduction_kernels():
    # A two-pass variance over odd vocabulary rows writes nothing along the row: the reduction
    # scheduler reads the rows twice in its own kernels (as inner_persistent's REREAD rule).
    import torch
    from pyfuser import DataType, FusionDefinition
    with FusionDefinition() as fd:
        x = fd.ops.cast(fd.define_tensor(shape=[-1, -1], dtype=DataType.BFloat16), DataType.Float)
        mean = fd.ops.broadcast(fd.ops.mean(x, [1]), [False, True])
        d = fd.ops.sub(x, mean)
        fd.add_output(fd.ops.sum(fd.ops.mul(d, d), [1]))
    st = setup(fd, [torch.empty(4096, 50257, dtype=torch.bfloat16)], device="h200")
    assert ip.can_schedule(st.fusion)[0]
    with pytest.raises(SchedulerError, match="registers"):
        ip.compute_heuristics(st.fusion, st.info)


def _looped(bdimx=32, unroll=4, vector=1):
    return ip.InnerPersistentParams(vector, 1, bdimx, 1, (0,) if vector > 1 else (),
                                    keep_weights=False, looped=True, unroll=unroll)


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layernorm_fwd", "rmsnorm_fwd",
                                  "add_rmsnorm_fwd"])
@pytest.mark.parametrize("N", [1, 7, 1001])
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_looped_kernels_on_the_interpreter(name, N, dtype):
    # 32 threads, 4 elements a step: 1001 takes 8 steps, the last one partial; 7 and 1 one step
    # of mostly idle lanes.
    fd = catalogue.define(name, dtype)
    inputs = catalogue.make_inputs(name, 3, N, dtype, seed=N)
    run_and_check(fd, inputs, scheduler="inner_persistent",
                  options={"enable": ["interpret"], "heuristic": _looped()})
    assert fd.last_run.heuristics[0].looped


@pytest.mark.parametrize("name", ["softmax", "layernorm_fwd"])
def test_looped_vector_kernels_on_the_interpreter(name):
    # 1000 bf16 elements a row: vectors of 8, 16 threads x 2 vectors a step, 4 steps (the last
    # partial by whole vectors).
    fd = catalogue.define(name, "bf16")
    inputs = catalogue.make_inputs(name, 2, 1000, "bf16", seed=3)
    run_and_check(fd, inputs, scheduler="inner_persistent",
                  options={"enable": ["interpret"], "heuristic": _looped(16, 2, 8)})


@pytest.mark.parametrize("name,passes", [("softmax", 2), ("log_softmax", 2),
                                         ("layernorm_fwd", 3), ("rmsnorm_fwd", 2)])
def test_each_pass_reads_the_row_again(name, passes):
    # softmax and log_softmax: the (max, sum of exp) keys in one pass, then the outputs' pass;
    # layernorm: mean, variance, outputs. Each pass loads the row from global memory (in two
    # versions: the unswitched steps' unchecked loads, the last step's checked ones) and ends in
    # one block reduction (the last in the stores).
    from pyfuser.codegen.cuda import generate_cuda
    fd = catalogue.define(name, "bf16")
    _, _, p, kernel = schedule_and_lower(fd, empty_inputs(name, 4096, 50257, "bf16"),
                                         device="h200")
    assert p.looped
    src = generate_cuda(kernel)
    body = src[src.index("__global__"):]
    assert len(re.findall(r"block_allreduce", body)) == passes - 1
    assert len(re.findall(r"= T0\[", body)) == 2 * passes
    unswitched = re.findall(r"if \(\(\(\(\(\(j\d+ \* (\d)\) \+ (\d)\) \* 1024\) \+ pf_tidx\) < ", body)
    # Each pass's unchecked version runs where the step's last element is in the row.
    assert [(int(u), int(last)) for u, last in unswitched] == [(p.unroll, p.unroll - 1)] * passes
    assert ("OpLogSumExp" in body or "lse_" in body) == (name in ("softmax", "log_softmax"))


def test_the_key_pass_is_off_with_the_option():
    from pyfuser import options
    from pyfuser.codegen.cuda import generate_cuda
    fd = catalogue.define("softmax", "bf16")
    with options.override({"disable": ["one_pass_logsumexp"]}):
        _, _, p, kernel = schedule_and_lower(fd, empty_inputs("softmax", 4096, 50257, "bf16"),
                                             device="h200")
        body = generate_cuda(kernel)
    body = body[body.index("__global__"):]
    assert p.looped and len(re.findall(r"block_allreduce", body)) == 2


@pytest.mark.parametrize("name,N,dtype", [("softmax", 50257, "bf16"), ("log_softmax", 50257, "bf16"),
                                          ("softmax", 65537, "bf16"), ("layernorm_fwd", 50257, "bf16"),
                                          ("add_rmsnorm_fwd", 50257, "bf16"),
                                          ("rmsnorm_fwd", 65537, "fp16"), ("softmax", 65537, "fp32")])
def test_looped_bar_shapes_compile_without_spills(name, N, dtype):
    pytest.importorskip("cuda.bindings.nvrtc")
    from pyfuser.codegen.cuda import generate_cuda
    from pyfuser.runtime.nvrtc import compile_to_cubin
    fd = catalogue.define(name, dtype)
    _, _, p, kernel = schedule_and_lower(fd, empty_inputs(name, 4096, N, dtype), device="h200")
    assert p.looped
    # Two 1024-thread blocks per SM, as the heuristic counts the rows in flight: 32 registers.
    assert kernel.launch.min_blocks == 2
    rep = compile_to_cubin(generate_cuda(kernel), "k", arch="sm_90a").ptxas
    assert (rep.spill_store_bytes, rep.spill_load_bytes, rep.stack_frame_bytes) == (0, 0, 0), \
        rep.summary()
    assert rep.registers <= 32 and rep.warnings == ()


def test_looped_params_are_a_frozen_part_of_the_key():
    a, b = _looped(), dataclasses.replace(_looped(), unroll=8)
    assert a != b and hash(a) != hash(b)


def test_the_looped_variant_can_be_forced_on_and_off():
    from pyfuser import options
    with options.override({"enable": ["looped_inner_persistent"]}):
        p = _params("softmax", 4096, 1024)
    assert p.looped and "forced on" in p.reason and p.bdimx == 128
    with options.override({"disable": ["looped_inner_persistent"]}):
        with pytest.raises(SchedulerError, match="registers"):
            _params("softmax", 4096, 50257)


def test_more_than_64_elements_per_thread_are_looped():
    # [*, 32769] bf16: 128 lone elements per thread of 257, under the register estimate's cap
    # (128 of 136), but ptxas put the row partly on the stack (167 registers, a 256-byte
    # frame); 64 per thread of 257 (16385) stay in registers.
    p = _params("softmax", 4096, 32769)
    assert p.looped and "128 elements per thread of 257" in p.reason
    p = _params("softmax", 4096, 16385)
    assert not p.looped and p.persistent_batch * p.vector == 64


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layernorm_fwd", "rmsnorm_fwd"])
def test_lone_elements_that_leave_one_block_per_sm_are_looped(name):
    # 64 lone elements per thread of 385 ([*, 24577] bf16): 64 registers of the 47 that two
    # blocks per SM leave (0.6 x 78); the log-softmax took 128 registers, one block per SM, and
    # ran at 0.61 of the looped kernel (H200, session 20).
    p = _params(name, 4096, 24577)
    assert p.looped and "no room for two blocks per SM" in p.reason
    with options.override({"disable": ["looped_inner_persistent"]}):
        p = _params(name, 4096, 24577)
        assert not p.looped and (p.persistent_batch, p.bdimx) == (64, 385)


@pytest.mark.parametrize("form", ["iota", "scatter", "log_probs"])
@pytest.mark.parametrize("looped", [True, False])
def test_cross_entropy_on_the_interpreter(looped, form):
    # The loss (logsumexp minus the target's logit, per row) and dlogits, looped and in
    # registers: the per-row loss is computed once per thread in either.
    import torch
    from pyfuser import DataType, FusionDefinition
    m, v = 3, 301
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    import bench_issue17
    with FusionDefinition() as fd:
        tx = fd.define_tensor(shape=[-1, -1], dtype=DataType.BFloat16)
        tt = fd.define_tensor(shape=[-1], dtype=DataType.Int)
        bench_issue17.define_cross_entropy(fd, tx, tt, m, v, scatter=form == "scatter",
                                           from_log_probs=form == "log_probs")
    g = torch.Generator().manual_seed(5)
    x = torch.randn(m, v, generator=g).to(torch.bfloat16)
    t = torch.randint(0, v, (m,), generator=g)
    enable = ["interpret"] + (["looped_inner_persistent"] if looped else [])
    disable = [] if looped else ["looped_inner_persistent"]
    run_and_check(fd, [x, t], scheduler="inner_persistent",
                  options={"enable": enable, "disable": disable})
    assert fd.last_run.heuristics[0].looped == looped


@pytest.mark.parametrize("name,unroll", [("softmax", 2), ("rmsnorm_fwd", 2), ("layernorm_fwd", 1)])
def test_a_step_holds_at_most_16_registers_of_the_row_inputs(name, unroll):
    # Vectors of 8 bf16 (4 registers each) per row input: softmax's x alone takes 2 a step,
    # RMSNorm's x and w 2 each (16 registers), LayerNorm's x, w and b one each (12): at 2 each
    # (24) a LayerNorm-like var_mean spilled 252 B at the looped kernel's 32 registers (GPU fuzz
    # 20262002:17), 16 B at one.
    with options.override({"enable": ["looped_inner_persistent"]}):
        p = _params(name, 4096, 65536)
    assert p.looped and p.vector == 8 and p.unroll == unroll


@pytest.mark.parametrize("N,unroll", [(65536, 1), (50257, 2)])
def test_a_division_along_the_row_takes_a_quarter_of_the_step(N, unroll):
    """Softmax written with a division (not the catalogue's reciprocal): its output pass holds
    the divisor, its reciprocal and a check's flag (lower/shared_divisor.py); at the step
    without a division (2 vectors of 8, or 8 lone elements) ptxas spilled 24 and 12 B at the
    kernel's 32 registers, at a quarter nothing."""
    from pyfuser import DataType, FusionDefinition
    from pyfuser.codegen.cuda import generate_cuda
    from pyfuser.runtime.nvrtc import compile_to_cubin
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
        xf = fd.ops.cast(x, DataType.Float)
        e = fd.ops.exp(fd.ops.sub(xf, fd.ops.max(xf, [1], keepdim=True)))
        fd.add_output(fd.ops.cast(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)),
                                  DataType.BFloat16))
    _, _, p, kernel = schedule_and_lower(fd, empty_inputs("softmax", 4096, N, "bf16"),
                                         device="h200")
    assert p.looped and p.unroll == unroll == max(1, _params("softmax", 4096, N).unroll // 4)
    pytest.importorskip("cuda.bindings.nvrtc")
    rep = compile_to_cubin(generate_cuda(kernel), "k", arch="sm_90a").ptxas
    assert (rep.spill_store_bytes, rep.stack_frame_bytes) == (0, 0), rep.summary()


def test_the_steps_stay_rolled_where_the_row_length_is_a_constant():
    """Cross-entropy's iota of 128256 makes the row's length a constant: the row's steps are
    still one rolled loop per pass (`#pragma unroll 1`, IterDomain.rolled), and the per-row
    values the steps read (max, sum, target) are held once, not copied per step (a copy per
    step, indexed by a rolled loop, would be local memory). Unrolled, the kernel was 9592 SASS
    instructions and 2-3% slower (H200, session 22)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    import bench_issue17
    from pyfuser.runtime.explain import explain_fusion
    fd, inputs, *_ = bench_issue17.cross_entropy("meta")
    (k,) = explain_fusion(fd.fusion, inputs, device="h200", compile=True).kernels
    src = k.kernel.source.split("__global__")[-1]
    steps = re.findall(r"#pragma unroll 1\n\s*for \(index_t (j\d+) = 0; \1 < (\d+);", src)
    # one rolled loop per pass (and the pass's exact copy, lower/shared_divisor.py), of one
    # vector a step: the division along the row takes a quarter of two
    assert [n for _, n in steps] == ["16", "16", "16"], steps
    buffers = [int(n) for n in re.findall(r"\b(?:float|long long) T\d+\[(\d+)\]", src)]
    assert max(buffers) <= 16, buffers                       # a step's U x V at most
    assert "0 B stack" in k.ptxas and "0 B spill stores" in k.ptxas, k.ptxas
