"""The inner-outer persistent (norm backward) scheduler's variants (CPU): the choice between
multi-wave and warp-specialized and its overrides, the warp-specialized heuristic's search and
fallbacks, the multi-wave rows through a TMA circular buffer, the phase-2 column tiles; each
variant interpreted against the reference (the interpreter runs the producer and compute roles
as cooperating groups, so a wrong parity or a missing release deadlocks) and compiled for
sm_90a with a clean ptxas report."""
import dataclasses
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lower"))
from kir_testing import empty_inputs, interpret, reference, schedule_and_lower, setup  # noqa: E402
from pyfuser import catalogue, options  # noqa: E402
from pyfuser.kir import nodes as K  # noqa: E402
from pyfuser.schedule.schedulers import inner_outer_persistent as io  # noqa: E402

BACKWARD = ["rmsnorm_bwd", "layernorm_bwd"]


def heuristic(name, M, N, dtype="bf16", enable=(), disable=(), inputs=None):
    fd = catalogue.define(name, dtype)
    inputs = inputs if inputs is not None else empty_inputs(name, M, N, dtype)
    with options.override(enable=list(enable), disable=list(disable)):
        st = setup(fd, inputs)
        return io.compute_heuristics(st.fusion, st.info)


@pytest.mark.parametrize("name", BACKWARD)
@pytest.mark.parametrize("N,stages,per_sm", [(1024, 4, 2), (2048, 4, 2), (4096, 4, 2),
                                             (8192, 3, 1)])
def test_multi_wave_rows_through_tma_by_row_length(name, N, stages, per_sm):
    p = heuristic(name, 16384, N, disable=["ws_normalization"])
    assert not p.warp_specialized and p.variant == "multi-wave"
    assert (p.stages, p.prefetch, p.tma_inputs) == (stages, stages - 1, (0, 1))
    assert p.grid == 132 * per_sm
    assert p.reason.startswith("multi-wave: ") and "TMA" in p.reason


def test_long_rows_keep_register_rows():
    p = heuristic("rmsnorm_bwd", 16384, 16384)
    assert (p.stages, p.tma_inputs) == (0, ())
    assert "register rows" in p.reason


def test_rows_a_bulk_copy_refuses_keep_register_rows():
    # 1004 bf16 = 2008 bytes per row: not a multiple of 16.
    p = heuristic("rmsnorm_bwd", 4096, 1004)
    assert (p.stages, p.tma_inputs) == (0, ())
    assert "multiple of 16" in p.reason


@pytest.mark.parametrize("name", ["rmsnorm_bwd", "layernorm_bwd"])
@pytest.mark.parametrize("N", [1024, 2048, 4096, 8192])
def test_automatic_choice_follows_the_measured_table(name, N):
    # WS_AUTO: warp-specialized only for layernorm (two column sums) at N <= 1024.
    p = heuristic(name, 16384, N)
    want = name == "layernorm_bwd" and N <= 1024
    assert p.warp_specialized == want, p.reason
    assert ("(WS_AUTO)" in p.reason) if want else \
        ("multi-wave measured faster than warp-specialized" in p.reason)


@pytest.mark.parametrize("name", BACKWARD)
@pytest.mark.parametrize("N,rows", [(1024, 3), (2048, 3), (4096, 2), (8192, 1)])
def test_forced_warp_specialized_search(name, N, rows):
    p = heuristic(name, 16384, N, enable=["ws_normalization"])
    assert p.warp_specialized and p.variant == "warp-specialized"
    assert p.compute_rows == rows and p.bdimx * rows % 128 == 0
    assert p.stages >= 2 and p.prefetch == p.stages - 1 and p.tma_inputs == (0, 1)
    assert p.grid == 132
    stage_bytes = rows * N * 2 * 2
    assert p.stages * stage_bytes <= 227 * 1024 - 8 * 1024
    assert p.reason.startswith("warp-specialized forced on (ws_normalization)")


def test_forced_warp_specialized_falls_back_with_reasons():
    # Layernorm at 16384: the column partials live in shared memory, no room for stages.
    p = heuristic("layernorm_bwd", 16384, 16384, enable=["ws_normalization"])
    assert not p.warp_specialized
    assert p.reason.startswith("warp-specialized forced on but not possible (")
    assert "shared memory" in p.reason
    # Rows a bulk copy refuses.
    p = heuristic("rmsnorm_bwd", 4096, 1004, enable=["ws_normalization"])
    assert not p.warp_specialized and "multiple of 16" in p.reason


def test_warp_specialized_register_fallback_to_fewer_compute_warp_groups():
    # rmsnorm at 16384: 512 threads per row (32 elements each); compute threads are 256 or
    # 384, whole rows of 512 threads fit neither.
    fd = catalogue.define("rmsnorm_bwd")
    st = setup(fd, empty_inputs("rmsnorm_bwd", 16384, 16384))
    p = io.multi_wave_params(st.fusion, st.info)
    ws, why = io.warp_specialized_params(st.fusion, st.info, p)
    assert p.bdimx == 512
    assert ws is None and why == ["no compute warp-group count fits rows of 512 threads"]


def test_disable_keeps_multi_wave():
    p = heuristic("rmsnorm_bwd", 16384, 4096, disable=["ws_normalization"])
    assert not p.warp_specialized
    assert "disabled (PYFUSER_DISABLE=ws_normalization)" in p.reason


def test_variant_is_not_part_of_the_kernel_key_reason():
    a = heuristic("rmsnorm_bwd", 16384, 4096)
    b = dataclasses.replace(a, reason="other words")
    assert a == b and hash(a) == hash(b)


def _lowered(name, M, N, dtype, **changes):
    fd = catalogue.define(name, dtype)
    inputs = catalogue.make_inputs(name, M, N, dtype, seed=3)
    st = setup(fd, inputs)
    p = dataclasses.replace(io.multi_wave_params(st.fusion, st.info), **changes)
    st, _, p, k = schedule_and_lower(fd, inputs, params=p, scheduler=io)
    return fd, inputs, st, p, k


VARIANTS = {
    "registers": dict(grid=3),
    "tma": dict(stages=2, prefetch=1, tma_inputs=(0, 1), grid=2),
    "tma3": dict(stages=3, prefetch=2, tma_inputs=(0, 1), grid=3),
    "ws": dict(stages=2, prefetch=1, tma_inputs=(0, 1), grid=2, warp_specialized=True),
    "ws3": dict(stages=3, prefetch=2, tma_inputs=(0, 1), grid=1, warp_specialized=True),
}


@pytest.mark.parametrize("name", BACKWARD)
@pytest.mark.parametrize("M", [1, 7, 40])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_interpreted_variants_match_the_reference(name, M, variant):
    # N = 64 fp32: 16 vectors of 4 -> 16 threads per row; the warp-specialized variant takes 16
    # compute rows (256 threads) and 8 producer rows.
    changes = dict(VARIANTS[variant])
    if changes.get("warp_specialized"):
        changes["compute_rows"] = 16
    fd, inputs, st, p, k = _lowered(name, M, 64, "fp32", **changes)
    if p.warp_specialized:
        assert k.warp_roles is not None and k.warp_roles.compute_threads == 256
        assert any(isinstance(s, K.GridSync) and s.barrier == (1, 256) for s in K.walk(k.body))
    elif p.stages:
        assert [kind for *_, kind in k.circular_buffers] == ["pipelined", "pipelined"]
    outs, it = interpret(k, st.bindings, inputs)
    for o, r in zip(outs, reference(fd, inputs)):
        torch.testing.assert_close(o.double(), r.double(), rtol=1e-5, atol=1e-5)


def _compile(name, M, N, **enable):
    pytest.importorskip("cuda.bindings.nvrtc")
    from pyfuser.runtime.fusion_kernel import build_kernel
    fd = catalogue.define(name)
    with options.override(**enable):       # the heuristic reads them from st.info
        st = setup(fd, empty_inputs(name, M, N))
        p = io.compute_heuristics(st.fusion, st.info)
    fk = build_kernel(st.fusion, io, p, "int", f"{name}_{N}")
    return p, fk


@pytest.mark.parametrize("name", BACKWARD)
@pytest.mark.parametrize("N", [1024, 2048, 4096, 8192])
@pytest.mark.parametrize("variant", ["multi-wave", "warp-specialized"])
def test_both_variants_compile_without_spills(name, N, variant, tmp_path, monkeypatch):
    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(tmp_path))
    key = "enable" if variant == "warp-specialized" else "disable"
    p, fk = _compile(name, 16384, N, **{key: ["ws_normalization"]})
    assert p.variant == variant
    rep = fk.module.ptxas
    assert (rep.spill_store_bytes, rep.spill_load_bytes, rep.stack_frame_bytes) == (0, 0, 0), \
        rep.summary()
    assert rep.warnings == (), rep.summary()     # no "setmaxnreg ignored"
    src = fk.source
    assert src.count("pf::grid_sync(") == 1
    if variant == "warp-specialized":
        assert "pf::setmaxnreg_dec<" in src and "pf::setmaxnreg_inc<" in src
        assert f"pf::NamedBarrier{{1, {fk.kernel.warp_roles.compute_threads}}}" in src
        assert "pf::grid_sync(reinterpret_cast<unsigned*>(pf_grid_sync), pf::NamedBarrier{1," in src
    else:
        assert "pf::setmaxnreg_" not in src and "pf::bulk_copy_g2s(" in src


def test_phase2_tiles_spread_over_the_blocks():
    # 4096 columns, 264 blocks: 8 columns per tile (512 tiles), each thread sums its share of
    # the 264 partials of 8 columns, one grouped block all-reduce per tile.
    p = heuristic("rmsnorm_bwd", 16384, 4096, disable=["ws_normalization"])
    assert p.col_vector == 8
    assert io.phase2_columns(1024, 264) == 2 and io.phase2_columns(16384, 132) == 8
    assert io.phase2_columns(16384, 132, threads=512) == 4
    # Tiles need not divide an odd row (the last one is predicated); a cluster slice's must.
    assert io.phase2_columns(1027, 264) == 2
    assert io.phase2_columns(1027, 264, whole_tiles=True) == 1
    assert io.phase2_columns(1026, 8) == 2 and io.phase2_columns(1028, 8) == 4
    # Wider partial tiles where ptxas is bounded by the blocks per SM.
    assert io.phase2_columns(1026, 8, bounded=True) == 8
    assert io.phase2_columns(1026, 8, whole_tiles=True, bounded=True) == 2


@pytest.mark.parametrize("M", [1, 3, 100])
def test_few_rows_keep_the_full_grid_for_phase_2(M):
    # Blocks without rows write zero partials; the column sums need the blocks.
    p = heuristic("rmsnorm_bwd", M, 4096, disable=["ws_normalization"])
    assert p.grid == 264


def test_a_gather_over_other_rows_is_left_to_its_own_segment():
    """CPU fuzz 2640:363 (shrunk): a column var_mean and a row min of x [M, N] (column-major
    fp8) beside take_along_axis(x, index [13, N], 0): the gather's output and index iterate 13
    rows, not the M the kernel's loops cover; the inner-outer kernel took it and lowering
    refused the gather a register buffer of runtime size (an internal error, the reference
    ran). The scheduler now refuses it; the plan runs the gather in a kernel of its own."""
    from pyfuser import DataType, FusionDefinition
    from pyfuser.testing import run_and_check
    g = torch.Generator().manual_seed(363)
    x = torch.randn(31, 203, generator=g).to(torch.float8_e5m2).t()         # [203, 31]
    t2 = torch.randn(203, 1, generator=g)
    idx = torch.randint(0, 203, (13, 31), generator=g)
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        c2 = fd.from_pytorch(t2)
        t3 = fd.from_pytorch(idx)
        v0 = fd.ops.cast(t0, dtype=DataType.Float)
        v5 = fd.ops.cast(fd.ops.eq(v0, c2), dtype=DataType.BFloat16)
        _, mean = fd.ops.var_mean(v5, [0], keepdim=True, correction=1)
        v8 = fd.ops.mul(v0, 1)
        fd.add_output(fd.ops.sub(v8, fd.ops.min(v8, [1], keepdim=True)))
        fd.add_output(fd.ops.take_along_axis(v0, t3, 0))
        fd.add_output(mean)
    ok, why = io.can_schedule(fd.fusion)
    assert not ok and "a gather's index dims" in why
    run_and_check(fd, [x, t2, idx], kernels=0, options={"enable": ["interpret"]})
    run = fd.last_run
    assert run.kind == "kernels" and not run.internal_error
    assert [(s.kind, s.name) for s in run.segments] == [("kernel", "inner_outer_persistent"),
                                                        ("kernel", "pointwise")]
