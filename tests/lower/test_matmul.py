"""The matmul scheduler and its lowering (schedule/schedulers/matmul.py, lower/matmul.py): which
matmuls it takes, the heuristic against the device table, the kernel it builds (warp roles,
wgmma, TMA tiles, stmatrix epilogue), NVRTC's report on it, and the fragment, stmatrix and
swizzle address maps it relies on."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.kir import nodes as K
from pyfuser.runtime.device import DEVICE_TABLE
from pyfuser.schedule.schedulers import matmul
from pyfuser.schedule.schedulers.base import SchedulerError

BF16 = DataType.BFloat16
BF16_T = torch.bfloat16


def linear_fd(dtype=BF16):
    with FusionDefinition("linear") as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=dtype)
        w = fd.define_tensor(shape=[-1, -1], dtype=dtype)
        fd.add_output(fd.ops.linear(x, w))
    return fd


def matmul_fd(dtype=BF16):
    with FusionDefinition("matmul") as fd:
        a = fd.define_tensor(shape=[-1, -1], dtype=dtype)
        b = fd.define_tensor(shape=[-1, -1], dtype=dtype)
        fd.add_output(fd.ops.matmul(a, b))
    return fd


def meta(*shape, dtype=torch.bfloat16, stride=None):
    if stride is None:
        return torch.empty(shape, dtype=dtype, device="meta")
    return torch.empty_strided(shape, stride, dtype=dtype, device="meta")


def only_segment(explanation):
    assert len(explanation.segments) == 1, explanation
    return explanation.segments[0]


def test_linear_is_one_matmul_kernel():
    seg = only_segment(linear_fd().explain([meta(4096, 4096), meta(4096, 4096)], device="h100"))
    assert seg.kind == "kernel" and seg.kernel.scheduler == "matmul"
    p = seg.kernel.params
    assert (p.tile_m, p.tile_n, p.stages, p.grid) == (128, 256, 4, 132)
    assert seg.kernel.block == (128, 3, 1)


def test_matmul_of_a_transposed_weight_is_k_major():
    # b = w.t(): [K, N] with K the stride-1 dim, as a Linear's weight seen through .t().
    a, b = meta(512, 256), meta(256, 384, stride=(1, 256))
    with FusionDefinition("matmul_t") as fd:
        fd.add_output(fd.ops.matmul(fd.from_pytorch(a), fd.from_pytorch(b)))
    seg = only_segment(fd.explain([a, b], device="h100"))
    assert seg.kind == "kernel" and seg.kernel.scheduler == "matmul"


def test_mn_major_b_is_read_by_64x64_boxes():
    # b row-major [K, N] (torch.matmul's usual operand): B MN-major.
    seg = only_segment(matmul_fd().explain([meta(512, 256), meta(256, 384)], device="h100",
                                           compile=True))
    assert seg.kind == "kernel" and seg.kernel.params.b_major == "MN"
    kernel = seg.kernel.kernel.kernel
    maps = sorted((m.role, m.inner, m.box) for m in kernel.tensor_maps.values())
    assert ("input", 1, (64, 64)) in maps            # B's N dim along the box rows
    assert "0, 1;\\n}" in seg.kernel.kernel.source or ", 1;" in seg.kernel.kernel.source
    assert "wgmma_desc_sw128_mn" in seg.kernel.kernel.source
    report = seg.kernel.ptxas
    assert "0 B spill stores" in report and "serializ" not in report.lower(), report


def test_column_major_a_is_read_by_64x64_boxes():
    # a = x.t() of a row-major [K, M]: A MN-major, read with imm-trans-a.
    a = meta(256, 512, stride=(1, 256))
    with FusionDefinition("matmul_at") as fd:
        fd.add_output(fd.ops.matmul(fd.from_pytorch(a), fd.from_pytorch(meta(512, 384))))
    seg = only_segment(fd.explain([a, meta(512, 384)], device="h100", compile=True))
    assert seg.kind == "kernel" and seg.kernel.params.a_major == "MN"
    kernel = seg.kernel.kernel.kernel
    maps = sorted((m.role, m.index, m.inner, m.box) for m in kernel.tensor_maps.values())
    assert ("input", 0, 0, (64, 64)) in maps        # A's M dim along the box rows
    assert "_ta_tb(" in seg.kernel.kernel.source    # imm-trans-a and imm-trans-b
    report = seg.kernel.ptxas
    assert "0 B spill stores" in report and "serializ" not in report.lower(), report


def test_column_major_a_with_m_not_a_multiple_of_8_runs_torch():
    a = meta(100, 512, stride=(1, 100))        # M * 2 bytes between K rows: not 16-byte aligned
    with FusionDefinition("matmul_at") as fd:
        fd.add_output(fd.ops.matmul(fd.from_pytorch(a), fd.from_pytorch(meta(512, 384))))
    e = fd.explain([a, meta(512, 384)], device="h100")
    assert refused_to_library(e)
    assert "operand a cannot be read with TMA tiles (MN-major)" in str(e)


def refused_to_library(e) -> bool:
    """The matmul scheduler's heuristic refused the shapes and the plan made again without it
    runs torch (a library segment)."""
    seg = only_segment(e)
    return seg.kind == "kernel" and seg.again is not None and \
        [s.kind for s in seg.again.segments] == ["library"]


@pytest.mark.parametrize("k", [100, 4])
def test_rows_tma_cannot_copy_run_torch(k):
    # K * 2 bytes not a multiple of 16: no tensor map over the operands.
    e = linear_fd().explain([meta(256, k), meta(256, k)], device="h100")
    assert refused_to_library(e), e


def test_what_follows_the_matmul_must_be_element_wise():
    with FusionDefinition("linear_sum") as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=BF16)
        w = fd.define_tensor(shape=[-1, -1], dtype=BF16)
        fd.add_output(fd.ops.sum(fd.ops.linear(x, w), [1]))
    ok, why = matmul.can_schedule(fd.fusion)
    assert not ok and "element-wise" in why, why
    with FusionDefinition("linear_three_outputs") as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=BF16)
        w = fd.define_tensor(shape=[-1, -1], dtype=BF16)
        y = fd.ops.linear(x, w)
        fd.add_output(y)
        fd.add_output(fd.ops.relu(y))
        fd.add_output(fd.ops.neg(y))
    ok, why = matmul.can_schedule(fd.fusion)
    assert not ok and "3 outputs (the kernel stores up to 2)" in why, why


def _info(m, n, k, device="h100"):
    from pyfuser.schedule.schedulers.base import InputFacts, RuntimeInfo
    fd = linear_fd()
    facts = (InputFacts((m, k), (k, 1), 16), InputFacts((n, k), (k, 1), 16))
    return fd.fusion, RuntimeInfo({}, facts, DEVICE_TABLE[device])


# The tile and kind each shape ran fastest with on the H200 (tools/sweep_matmul.py, bench/results/
# 2026-11-28/h200-sweep-matmul-tiles.txt), where the sweep measured it (8192^3: 128x192 staging
# every epilogue box was 1.7% faster in one sweep, 2026-11-29/h200-sweep-staging-boxes.txt, and
# 3% slower with a bias + GELU epilogue at 8192x16384x4096: the heuristic keeps 128x256).
@pytest.mark.parametrize("mnk, tile", [((8192, 8192, 8192), (128, 256, 1)),
                                       ((4096, 14336, 5120), (128, 256, 1)),
                                       ((16384, 256, 4096), (128, 256, 1)),
                                       ((3000, 2056, 1032), (128, 192, 1)),
                                       ((2048, 1024, 4096), (128, 128, 2)),
                                       # 128x64 ping-pong tiles, one per CTA (session 29's
                                       # h200-matmul-clusters-n-session29.txt: 11.1 against
                                       # 128x128's 12.8 us at 1024^3)
                                       ((1024, 1024, 1024), (128, 64, 2)),
                                       ((1000, 1000, 1000), (128, 64, 2))])
def test_heuristic_tile_and_stages_fit_the_device(mnk, tile):
    fusion, info = _info(*mnk)
    p = matmul.compute_heuristics(fusion, info)
    assert (p.tile_m, p.tile_n, p.compute_roles) == tile
    dev = info.device
    stage = (p.tile_m + p.tile_n) * 64 * 2
    staging = p.compute_warp_groups * p.staging_boxes * 64 * 64 * 2
    assert 2 <= p.stages and p.stages * stage + staging + 1024 <= dev.max_shared_memory_per_block_optin
    tiles = -(-mnk[0] // p.tile_m) * -(-mnk[1] // p.tile_n)
    assert p.grid == min(tiles, dev.sm_count)


@pytest.mark.parametrize("tile, roles, outputs, boxes, stages", [
    ((128, 192), 1, (2,), 3, 4),     # every box staged, 4 stages beside them
    ((128, 256), 1, (2,), 2, 4),     # all 4 would leave 3 stages: the default's 2
    ((128, 128), 2, (2,), 2, 6),     # ping-pong keeps the default
    ((128, 192), 1, (2, 2), 1, 4),   # two outputs: 3 boxes each would leave 3 stages
    ((128, 192), 1, (4,), 1, 4),     # an fp32 output likewise
])
def test_fitted_staging_boxes_and_stages(tile, roles, outputs, boxes, stages):
    p = matmul.fitted_params(*tile, roles, 100, DEVICE_TABLE["h100"], 2, "K", outputs)
    assert (p.staging_boxes, p.stages) == (boxes, stages), p
    assert p.boxes_per_tile % p.staging_boxes == 0


@pytest.mark.parametrize("m", [1, 64])
def test_few_rows_run_torch_unless_the_kernel_is_asked_for(m):
    from pyfuser.options import Options
    fusion, info = _info(m, 4096, 4096)
    with pytest.raises(SchedulerError, match=f"M = {m} rows .* matmul_few_rows"):
        matmul.compute_heuristics(fusion, info)
    info.options = Options(enable=frozenset(["matmul_few_rows"]))
    p = matmul.compute_heuristics(fusion, info)
    # 64 tiles of 128x64, one per CTA (27.7 us against 128x128 ping-pong's 28.2 at 64 rows,
    # bench/results/2026-11-28/h200-sweep-matmul-tiles.txt and 2026-11-29/h200-sweep-split-k.txt).
    assert (p.tile_m, p.tile_n, p.compute_roles, p.split_k) == (128, 64, 2, 1)
    # 65 rows: the kernel.
    fusion, info = _info(65, 4096, 4096)
    assert matmul.compute_heuristics(fusion, info).compute_roles == 2


def test_few_rows_plan_is_a_library_segment():
    e = linear_fd().explain([meta(8, 4096), meta(4096, 4096)], device="h100")
    assert refused_to_library(e), e
    assert "matmul_few_rows" in str(e), e


@pytest.mark.parametrize("forced, roles", [(True, 2), (False, 1)])
def test_heuristic_pingpong_forced_on_or_off(forced, roles):
    from pyfuser.options import Options
    fusion, info = _info(1000, 1000, 1000)
    info.options = Options(enable=frozenset(["matmul_pingpong"])) if forced else \
        Options(disable=frozenset(["matmul_pingpong"]))
    p = matmul.compute_heuristics(fusion, info)
    assert p.compute_roles == roles
    assert (p.tile_n <= 128) if forced else p.tile_n in (192, 256)


def test_cost_model_waves_and_busy_sms():
    shape = matmul.TILE_CANDIDATES[0]
    one = matmul.estimated_us(shape, 132, 10, 132)
    # One tile more than the CTAs: a second wave.
    assert matmul.estimated_us(shape, 133, 10, 132) > 1.9 * (one - matmul.LAUNCH_OVERHEAD_US)
    # Few busy SMs: each tile's k blocks are cheaper (the L2 is shared by fewer).
    assert matmul.estimated_us(shape, 60, 10, 132) < one


def test_split_k_factors_offered_when_asked():
    shape = matmul.TILE_CANDIDATES[0]
    # 16 tiles, 64 k blocks: factors up to a wave of 132 units.
    assert matmul.split_k_choices(shape, 16, 64, 132, True) == (2, 3, 4, 5, 6, 7, 8)
    # 8 k blocks: at least 2 per split (a split takes blocks s, s + S, ...).
    assert matmul.split_k_choices(shape, 16, 8, 132, True) == (2, 3, 4)
    assert matmul.split_k_choices(shape, 16, 9, 132, True) == (2, 3, 4)
    assert matmul.split_k_choices(shape, 16, 1, 132, True) == (1,)
    assert matmul.split_k_choices(shape, 66, 64, 132, True) == (2,)
    assert matmul.split_k_choices(shape, 67, 64, 132, True) == (1,)
    # Not asked (measured slower: SPLIT_K_PER_SPLIT_US) or forced off: never.
    assert matmul.split_k_choices(shape, 16, 64, 132, None) == (1,)
    assert matmul.split_k_choices(shape, 16, 64, 132, False) == (1,)
    # The model: splitting a few tiles' long K pays; the partials' traffic grows with splits.
    one = matmul.estimated_us(shape, 16, 64, 132)
    assert matmul.estimated_us(shape, 16, 64, 132, 4, rows=64) < one
    assert (matmul.estimated_us(shape, 16, 64, 132, 8, rows=128)
            > matmul.estimated_us(shape, 16, 64, 132, 8, rows=1))


@pytest.mark.parametrize("feature", [None, True, False])
def test_heuristic_split_k_feature(feature):
    from pyfuser.options import Options
    fusion, info = _info(200, 1024, 4096)        # 16 tiles of 128x256 (2 x 8 of 128x128)
    if feature is not None:
        info.options = Options(**{"enable" if feature else "disable":
                                  frozenset(["matmul_split_k"])})
    p = matmul.compute_heuristics(fusion, info)
    assert (p.split_k > 1) == (feature is True), p
    units = p.split_k * -(-200 // p.tile_m) * -(-1024 // p.tile_n)
    assert p.grid == min(units, 132)


@pytest.mark.parametrize("mnk", [(8192, 16384, 4096), (4096, 14336, 5120)])
@pytest.mark.parametrize("kind, roles", [("bias_gelu", 1), ("residual", 1),
                                         ("bias_gelu_preact", 2)])
def test_the_epilogue_chooses_the_kind(mnk, kind, roles):
    """As measured on the H200 at these shapes (bench/results/2026-11-29/
    h200-bench-issue21-epilogue-kinds.txt): cooperative with one stored output, ping-pong (its
    epilogue under the other role's MMAs) with the pre-activation stored too."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    from bench_issue21 import fusion, inputs
    seg = only_segment(fusion(kind).explain(inputs(kind, *mnk, "meta"), device="h100"))
    assert seg.kernel.params.compute_roles == roles, seg.kernel.params
    # The model's epilogue term: zero for a bare store, per output after the first.
    shape = matmul.TILE_CANDIDATES[0]
    assert matmul.epilogue_us(shape, False, 1) == 0
    assert (matmul.epilogue_us(shape, True, 2) - matmul.epilogue_us(shape, True, 1)
            == matmul.EPILOGUE_OUTPUT_US)


def test_heuristic_refuses_k_zero_and_non_hopper():
    fusion, info = _info(128, 128, 0)
    with pytest.raises(SchedulerError, match="K = 0"):
        matmul.compute_heuristics(fusion, info)
    import dataclasses
    fusion, info = _info(128, 128, 64)
    info.device = dataclasses.replace(info.device, name="A100", major=8, minor=0)
    with pytest.raises(SchedulerError, match="Hopper"):
        matmul.compute_heuristics(fusion, info)


def _kernel(m=1300, n=1160, k=200):
    seg = only_segment(linear_fd().explain([meta(m, k), meta(n, k)], device="h100",
                                           compile=True))
    return seg.kernel


def test_kernel_roles_and_instructions():
    ke = _kernel()
    kernel = ke.kernel.kernel
    kinds = {type(s).__name__ for s in K.walk(kernel.body)}
    assert {"RoleSplit", "Wgmma", "StMatrix", "TensorMapStore", "TensorMapLoad",
            "MBarrierWait", "SetMaxNReg"} <= kinds
    roles = kernel.warp_roles
    assert (roles.producer_registers, roles.compute_registers) == (40, 232)
    # Every operand copy got a stage and a barrier from pipeline_loads.
    assert all(s.bar is not None for s in K.walk(kernel.body) if isinstance(s, K.TensorMapLoad))
    src = ke.kernel.source
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16" in src
    assert "pf::tma_store_2d" in src and "pf::stmatrix_x4" in src
    # Three tile maps: A and B boxes of 64 K elements, the output's 64x64 staging box.
    maps = sorted((m.role, m.box) for m in kernel.tensor_maps.values())
    assert maps == [("input", (64, 128)), ("input", (64, 128)), ("output", (64, 64))]
    assert kernel.smem_align == 1024
    assert kernel.launch.shared_mem_dynamic <= DEVICE_TABLE["h100"].max_shared_memory_per_block_optin


@pytest.mark.parametrize("mnk", [(4096, 4096, 4096), (300, 264, 200)])
def test_ptxas_no_spills_no_serialized_wgmma(mnk):
    ke = _kernel(*mnk)
    report = ke.ptxas
    assert "0 B spill stores" in report and "0 B spill loads" in report, report
    assert "serializ" not in report.lower(), report
    assert "setmaxnreg ignored" not in report.lower(), report


def test_fragment_and_stmatrix_maps_agree():
    """The epilogue's stmatrix of accumulator registers 4 j0 .. 4 j0 + 7 by lane l (addresses of
    row l % 8 + 8 (l / 8 % 2) at 16-byte unit 2 jj + l / 16, as lower/matmul.py computes them)
    puts each accumulator where the wgmma fragment formula says its element is: row r, column
    c of the 64-column box at byte swizzled_byte(r * 128 + 2 c)."""
    for warp in range(4):
        for jj in range(4):
            j0 = 2 * jj
            placed = {}
            for lane in range(32):
                row = 16 * warp + lane % 8 + 8 * (lane // 8 % 2)
                unit = 2 * jj + lane // 16
                placed[lane] = row * 64 + ((unit ^ (row % 8)) * 8)   # element of the row start
            for lane in range(32):
                for kreg in range(4):      # register k of the stmatrix: matrix k
                    for half in range(2):
                        i = 4 * j0 + 2 * kreg + half     # the accumulator register
                        r = 16 * warp + lane // 4 + 8 * ((i >> 1) & 1)
                        c = 8 * (i >> 2) + 2 * (lane % 4) + (i & 1)
                        # stmatrix: matrix k row lane // 4 from lane 8 k + lane // 4's address
                        elem = placed[8 * kreg + lane // 4] + 2 * (lane % 4) + half
                        assert elem * 2 == K.swizzled_byte((r * 64 + c) * 2), (warp, jj, lane, i)


def test_swizzle_is_a_permutation_of_16_byte_units_per_atom():
    atom = [K.swizzled_byte(b) for b in range(1024)]
    assert sorted(atom) == list(range(1024))
    assert all(K.swizzled_byte(b) % 16 == b % 16 for b in range(1024))
    assert K.swizzled_byte(1024 + 130) == 1024 + K.swizzled_byte(130)


# The generated kernel on the kernel-IR interpreter ---------------------------------------------
def _interpret(m, n, k, params, dtype=torch.bfloat16, matmul_of_t=False):
    from kir_testing import interpret_against_float64, schedule_and_lower
    g = torch.Generator().manual_seed(m * 7 + n * 3 + k)
    x = torch.randn(m, k, dtype=dtype, generator=g)
    w = torch.randn(n, k, dtype=dtype, generator=g)
    inputs = [x, w.t()] if matmul_of_t else [x, w]
    with FusionDefinition("mm") as fd:
        a, b = (fd.from_pytorch(t) for t in inputs)
        fd.add_output(fd.ops.matmul(a, b) if matmul_of_t else fd.ops.linear(a, b))
    st, sched, p, kernel = schedule_and_lower(fd, inputs, params=params, scheduler=matmul,
                                              device="h100-4sm")
    return interpret_against_float64(fd, st, kernel, inputs, context=p)


@pytest.mark.parametrize("mnk, tile, grid", [
    ((129, 264, 72), (128, 256), 2),     # ragged, two k blocks, 4 epilogue chunks (2 boxes)
    ((130, 136, 72), (128, 128), 4),
    ((100, 64, 40), (128, 64), 1),       # one chunk per tile: one staging box
    ((520, 136, 136), (128, 256), 2),    # 5 tiles on 2 CTAs: the stage counter across tiles
    ((130, 400, 136), (128, 192), 2),    # 3 chunks per warp group: one staging box
])
def test_interpreted_kernel_matches_float64(mnk, tile, grid):
    p = matmul.MatmulParams(tile_m=tile[0], tile_n=tile[1], stages=2 if mnk[2] > 64 else 3,
                            grid=grid)
    _interpret(*mnk, p)


@pytest.mark.parametrize("mnk, tile, roles, boxes, grid", [
    ((130, 400, 136), (128, 192), 1, 3, 2),  # every box of a tile staged: no wait in a tile
    ((520, 264, 72), (128, 256), 1, 4, 2),   # 4 boxes, 6 tiles on 2 CTAs: waits across tiles
    ((520, 264, 72), (128, 256), 1, 1, 2),   # one box for 4 chunks: a wait before each
    ((390, 136, 136), (128, 128), 2, 4, 2),  # ping-pong: each role its own 4 boxes
])
def test_interpreted_staging_boxes(mnk, tile, roles, boxes, grid):
    p = matmul.MatmulParams(tile_m=tile[0], tile_n=tile[1], stages=2, grid=grid,
                            compute_roles=roles, epilogue_boxes=boxes)
    assert p.staging_boxes == boxes and p.boxes_per_tile % boxes == 0
    _interpret(*mnk, p)


@pytest.mark.parametrize("boxes", [2, -3])
def test_staging_boxes_must_divide_a_tiles_boxes(boxes):
    p = matmul.MatmulParams(tile_m=128, tile_n=192, stages=2, grid=2, epilogue_boxes=boxes)
    with pytest.raises(SchedulerError, match="do not divide the 3 boxes"):
        _interpret(130, 400, 136, p)


@pytest.mark.parametrize("mnk, tn", [((129, 264, 72), 256), ((70, 136, 136), 128),
                                     ((100, 64, 40), 64)])
def test_interpreted_mn_major_b(mnk, tn):
    m, n, k = mnk
    g = torch.Generator().manual_seed(m + n + k)
    a = torch.randn(m, k, dtype=torch.bfloat16, generator=g)
    b = torch.randn(k, n, dtype=torch.bfloat16, generator=g)
    with FusionDefinition("mm") as fd:
        fd.add_output(fd.ops.matmul(fd.from_pytorch(a), fd.from_pytorch(b)))
    from kir_testing import interpret_against_float64, schedule_and_lower
    p = matmul.MatmulParams(tile_m=128, tile_n=tn, stages=2, grid=2, b_major="MN")
    st, _, p, kernel = schedule_and_lower(fd, [a, b], params=p, scheduler=matmul,
                                          device="h100-4sm")
    interpret_against_float64(fd, st, kernel, [a, b], context=p)


@pytest.mark.parametrize("mnk, tile, roles, b_major", [
    ((136, 264, 72), (128, 256), 1, "K"),    # ragged: the second tile's rows mostly past M
    ((200, 136, 136), (128, 128), 2, "MN"),  # ping-pong, both operands MN-major
    ((72, 64, 40), (64, 64), 2, "K"),        # one box per tile, K shorter than a block
])
def test_interpreted_column_major_a(mnk, tile, roles, b_major):
    m, n, k = mnk
    g = torch.Generator().manual_seed(m + 2 * n + k)
    a = torch.randn(k, m, dtype=torch.bfloat16, generator=g).t()          # [M, K], stride (1, M)
    b = torch.randn(*((k, n) if b_major == "MN" else (n, k)), dtype=torch.bfloat16, generator=g)
    with FusionDefinition("mm") as fd:
        ta, tb = fd.from_pytorch(a), fd.from_pytorch(b)
        fd.add_output(fd.ops.matmul(ta, tb) if b_major == "MN" else fd.ops.linear(ta, tb))
    from kir_testing import interpret_against_float64, schedule_and_lower
    p = matmul.MatmulParams(tile_m=tile[0], tile_n=tile[1], stages=2, grid=2, b_major=b_major,
                            a_major="MN", compute_roles=roles)
    st, _, p, kernel = schedule_and_lower(fd, [a, b], params=p, scheduler=matmul,
                                          device="h100-4sm")
    assert {w.a_major for w in K.walk(kernel.body) if isinstance(w, K.Wgmma)} == {"MN"}
    interpret_against_float64(fd, st, kernel, [a, b], context=p)


@pytest.mark.parametrize("mnk, tile, b_major", [
    ((300, 264, 136), (128, 128), "K"),      # 3 x 3 tiles on 2 CTAs: roles take turns
    ((129, 200, 72), (128, 64), "MN"),
    ((520, 136, 200), (64, 128), "K"),      # one slice per tile
])
def test_interpreted_pingpong(mnk, tile, b_major):
    m, n, k = mnk
    g = torch.Generator().manual_seed(m + n + k)
    a = torch.randn(m, k, dtype=torch.bfloat16, generator=g)
    b = torch.randn(*((k, n) if b_major == "MN" else (n, k)), dtype=torch.bfloat16, generator=g)
    with FusionDefinition("mm") as fd:
        ta, tb = fd.from_pytorch(a), fd.from_pytorch(b)
        fd.add_output(fd.ops.matmul(ta, tb) if b_major == "MN" else fd.ops.linear(ta, tb))
    from kir_testing import interpret_against_float64, schedule_and_lower
    p = matmul.MatmulParams(tile_m=tile[0], tile_n=tile[1], stages=3, grid=2, b_major=b_major,
                            compute_roles=2)
    st, _, p, kernel = schedule_and_lower(fd, [a, b], params=p, scheduler=matmul,
                                          device="h100-4sm")
    assert kernel.warp_roles.compute_roles == 2
    interpret_against_float64(fd, st, kernel, [a, b], context=p)


def test_pingpong_heuristic_and_ptxas():
    from pyfuser import options
    with options.override(enable=["matmul_pingpong"]):
        seg = only_segment(linear_fd().explain([meta(4096, 4096), meta(4096, 4096)],
                                               device="h100", compile=True))
    p = seg.kernel.params
    assert (p.tile_m, p.tile_n, p.compute_roles) == (128, 128, 2)
    assert seg.kernel.block == (128, 3, 1)
    report = seg.kernel.ptxas
    assert "0 B spill stores" in report and "serializ" not in report.lower(), report


def test_interpreted_fp16_matmul_of_a_transposed_weight():
    _interpret(70, 200, 48, matmul.MatmulParams(tile_m=128, tile_n=128, stages=2, grid=2),
               dtype=torch.float16, matmul_of_t=True)


def test_the_interpreter_sees_an_unswizzled_epilogue(monkeypatch):
    """The check can fail: stmatrix addresses without the XOR land the accumulators where the
    TMA store (which reads the box swizzled) does not look for them."""
    from pyfuser.lower import matmul as lowering
    monkeypatch.setattr(lowering, "swizzled_unit", lambda unit, row: unit)
    with pytest.raises(AssertionError):
        _interpret(130, 136, 72, matmul.MatmulParams(tile_m=128, tile_n=128, stages=2, grid=4))


# fp32 outputs --------------------------------------------------------------------------------
def _fp32_output_fd(kind):
    F32 = DataType.Float
    with FusionDefinition(kind) as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=BF16)
        w = fd.define_tensor(shape=[-1, -1], dtype=BF16)
        if kind == "cast":                      # logits in fp32: linear(x, w).float()
            fd.add_output(fd.ops.cast(fd.ops.linear(x, w), F32))
        else:                                   # h (bf16) and gelu(h) in fp32
            b = fd.define_tensor(shape=[-1], dtype=BF16)
            h = fd.ops.linear(x, w, b)
            fd.add_output(h)
            fd.add_output(fd.ops.gelu(fd.ops.cast(h, F32), approximate="tanh"))
    return fd


@pytest.mark.parametrize("kind", ["cast", "preact_and_fp32_gelu"])
@pytest.mark.parametrize("tile, roles", [((128, 128), 1), ((128, 64), 2)])
def test_interpreted_fp32_outputs(kind, tile, roles):
    from kir_testing import interpret_against_float64, schedule_and_lower
    fd = _fp32_output_fd(kind)
    # Entries in {-1, 0, 1}: the bf16 matmul (|sums| <= 72) is exact, so the fp32 outputs are
    # compared with float64 at fp32's tolerance (random values would carry the bf16 rounding
    # the fusion defines before its cast).
    g = torch.Generator().manual_seed(7)
    m, n, k = 130, 200, 72

    def ints(*shape):
        return torch.randint(-1, 2, shape, generator=g).to(torch.bfloat16)
    inputs = [ints(m, k), ints(n, k)] + ([] if kind == "cast" else [ints(n)])
    ok, why = matmul.can_schedule(fd.fusion)
    assert ok, why
    p = matmul.MatmulParams(tile_m=tile[0], tile_n=tile[1], stages=2, grid=3, compute_roles=roles,
                            output_bytes=(4,) if kind == "cast" else (2, 4))
    st, _, p, kernel = schedule_and_lower(fd, inputs, params=p, scheduler=matmul,
                                          device="h100-4sm")
    assert any(isinstance(s, K.StSharedPair) for s in K.walk(kernel.body))
    interpret_against_float64(fd, st, kernel, inputs, context=(kind, p))


def test_fp32_output_heuristic_and_ptxas():
    fd = _fp32_output_fd("preact_and_fp32_gelu")
    seg = _compiled_matmul_segment(fd, [torch.empty(4096, 4096, dtype=torch.bfloat16),
                                        torch.empty(4096, 4096, dtype=torch.bfloat16),
                                        torch.empty(4096, dtype=torch.bfloat16)])
    p = seg.kernel.params
    assert p.outputs == 2 and p.output_bytes == (2, 4), p
    maps = sorted((m.role, m.box) for m in seg.kernel.kernel.kernel.tensor_maps.values())
    assert ("output", (32, 64)) in maps and ("output", (64, 64)) in maps


# Split-K on the interpreter -------------------------------------------------------------------
@pytest.mark.parametrize("mnk, tile, roles, split, grid", [
    ((70, 136, 320), (128, 128), 1, 3, 4),    # the last split's 64-deep block past K: zeros
    ((1, 264, 384), (128, 256), 1, 4, 4),     # one valid row of each partial
    ((130, 136, 256), (128, 128), 2, 2, 2),   # ping-pong: 8 units on 2 CTAs, tiles' splits apart
    ((200, 72, 200), (64, 128), 2, 3, 3),     # one 64-row slice per tile
])
def test_interpreted_split_k(mnk, tile, roles, split, grid):
    p = matmul.MatmulParams(tile_m=tile[0], tile_n=tile[1], stages=2, grid=grid,
                            compute_roles=roles, split_k=split)
    _, interp = _interpret(*mnk, p)
    assert not interp._split_partials and not any(interp._split_arrivals.values())


def test_split_k_kernel_and_its_workspaces():
    """The kernel's split-K reduction: a warp group's partial per tile and split, one counter
    per warp group of a tile (zeroed by the executor, reset by the last arrival), sized from
    the call's extents; the epilogue runs in the last CTA only."""
    from pyfuser import options
    from pyfuser.kir.launch import evaluate
    x, w = meta(64, 4096), meta(4096, 4096)
    with options.override(enable=["matmul_few_rows", "matmul_split_k"],
                          disable=["matmul_pingpong"]):
        seg = only_segment(linear_fd().explain([x, w], device="h100", compile=True))
    p = seg.kernel.params
    assert (p.tile_m, p.compute_roles) == (128, 1) and p.split_k > 1
    kernel = seg.kernel.kernel.kernel
    reduces = [s for s in K.walk(kernel.body) if isinstance(s, K.SplitKReduce)]
    assert len(reduces) == 2 and {s.barrier for s in reduces} == {(8, 128), (9, 128)}
    launch = kernel.launch_description
    kinds = {kind: evaluate(elements, [x, w]) for kind, _, elements in launch.workspaces}
    tiles = -(-4096 // p.tile_n)
    assert kinds == {"split_k_partials": tiles * p.split_k * 128 * p.tile_n,
                     "split_k_counters": tiles * 2}
    src = seg.kernel.kernel.source
    assert "pf::load_cg_f32x2" in src and "if (pf_split_last) {" in src
    report = seg.kernel.ptxas
    assert "0 B spill stores" in report and "serializ" not in report.lower(), report


def test_interpreted_split_k_fused_epilogue_and_two_outputs():
    from kir_testing import interpret_against_float64, schedule_and_lower
    for kind, roles in (("bias_gelu", 1), ("scales_silu", 2)):
        fd = _epilogue_fd(kind)
        inputs = _epilogue_inputs(kind, 90, 200, 200)
        p = matmul.MatmulParams(tile_m=128, tile_n=128 if roles == 1 else 64, stages=2, grid=3,
                                compute_roles=roles, split_k=2)
        st, _, p, kernel = schedule_and_lower(fd, inputs, params=p, scheduler=matmul,
                                              device="h100-4sm")
        interpret_against_float64(fd, st, kernel, inputs, context=(kind, p))


# Stream-K on the interpreter -------------------------------------------------------------------
@pytest.mark.parametrize("mnk, tile, grid, ctas", [
    ((130, 136, 320), (128, 128), 3, 2),    # 4 tiles of 5 k blocks over 3 CTAs: runs of 7
    ((130, 136, 320), (128, 128), 3, 3),
    ((520, 136, 136), (128, 256), 3, 2),    # 5 tiles: 3 data-parallel, 2 stream-K
    ((130, 400, 136), (128, 192), 7, 4),    # 6 tiles of 3 blocks over 7 CTAs: runs of 3
    ((300, 264, 200), (128, 128), 5, 2),    # tiles of 4 blocks, runs of 4: every tile whole
])
def test_interpreted_stream_k(mnk, tile, grid, ctas):
    p = matmul.MatmulParams(tile_m=tile[0], tile_n=tile[1], stages=2, grid=grid, stream_k=ctas)
    _, interp = _interpret(*mnk, p)
    assert not interp._split_partials and not any(interp._split_arrivals.values())


@pytest.mark.parametrize("tiles, k_blocks, grid, ctas", [
    (4, 5, 3, 2), (15, 4, 4, 3), (72, 64, 132, 3), (36, 128, 132, 5), (4, 256, 132, 16),
    (512, 64, 132, 2), (300, 7, 132, 2), (1, 3, 8, 4), (264, 16, 132, 2)])
def test_stream_k_partition(tiles, k_blocks, grid, ctas):
    """lower/matmul.stream_k_units' expressions, evaluated per CTA: every (tile, k block) done
    once; a CTA's units contiguous in count_before; a tile's runs over at most `ctas` CTAs,
    split 0 the one with its first k blocks; and the heuristic's stream_k_width (its cost
    model's partition) the same as the kernel's."""
    from pyfuser.lower import matmul as lowering
    from pyfuser.runtime.interpreter import eval_expr
    u = K.Var("u")
    units = lowering.stream_k_units(K.Const(tiles), K.Const(k_blocks), ctas)
    done, runs = {}, {}
    for g in range(grid):
        env = {"gridDim.x": grid, "blockIdx.x": g}
        for d in units["defs"]:
            env[d.var.name] = eval_expr(d.value, env)
        dp, width = matmul.stream_k_width(tiles, k_blocks, grid, ctas)
        assert (env["pf_sk_dp"], env["pf_sk_width"]) == (dp, width)
        count = 0
        for i in range(eval_expr(units["units"], env)):
            env["u"] = i
            t, b, e = (eval_expr(units[x](u), env) for x in ("tile", "kbeg", "kend"))
            assert 0 <= b < e <= k_blocks and eval_expr(units["before"](u), env) == count
            count += e - b
            for kb in range(b, e):
                assert (t, kb) not in done
                done[t, kb] = g
            if (b, e) != (0, k_blocks):
                runs.setdefault(t, []).append((b, eval_expr(units["split"](u), env),
                                               eval_expr(units["ctas"](u), env)))
    assert len(done) == tiles * k_blocks
    for t, rs in runs.items():
        rs.sort()
        assert [split for _, split, _ in rs] == list(range(len(rs))), (t, rs)
        assert {n for _, _, n in rs} == {len(rs)} and len(rs) <= ctas


def test_interpreted_stream_k_sums_partials():
    """Runs that split tiles store partials and the tiles' first runs sum them (the counters
    seen), and the pipeline's stage counter runs on from each unit's count_before: counted
    from the unit's index instead, the interpreter finds the broken barrier phases."""
    from pyfuser.lower import matmul as lowering
    p = matmul.MatmulParams(tile_m=128, tile_n=128, stages=2, grid=3, stream_k=2)
    _, interp = _interpret(130, 136, 320, p)
    assert sorted(interp._split_arrivals) == [2, 3, 4, 5]     # slots of tiles 1 and 2
    units = lowering.stream_k_units

    def unit_index_counter(*a):
        out = units(*a)
        out["before"] = lambda u: K.mul(u, 5)
        return out
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lowering, "stream_k_units", unit_index_counter)
        with pytest.raises(Exception, match="would never return"):
            _interpret(130, 136, 320, p)


def test_interpreted_stream_k_fused_epilogue():
    from kir_testing import interpret_against_float64, schedule_and_lower
    fd = _epilogue_fd("bias_gelu")
    inputs = _epilogue_inputs("bias_gelu", 200, 200, 320)
    p = matmul.MatmulParams(tile_m=128, tile_n=128, stages=2, grid=3, stream_k=3)
    st, _, p, kernel = schedule_and_lower(fd, inputs, params=p, scheduler=matmul,
                                          device="h100-4sm")
    interpret_against_float64(fd, st, kernel, inputs, context=p)


@pytest.mark.parametrize("mnk, tile, ctas", [
    ((768, 768, 8192), (128, 128), 5),      # measured 36.1 -> 27.5-33.3 us (H200)
    ((512, 1024, 8192), (128, 128), 5),
    ((256, 256, 16384), (128, 64), 16),
])
def test_stream_k_heuristic_takes_few_tiles_of_long_k(mnk, tile, ctas):
    m, n, k = mnk
    p = only_segment(linear_fd().explain([meta(m, k), meta(n, k)], device="h200")).kernel.params
    assert (p.tile_m, p.tile_n, p.compute_roles, p.stream_k) == (*tile, 1, ctas), p
    assert p.grid == 132 and p.cluster == 1 and p.split_k == 1


@pytest.mark.parametrize("mnk", [(1536, 1536, 4096), (1000, 1000, 1000), (3000, 2056, 1032),
                                 (16384, 256, 4096), (4096, 4096, 4096), (768, 768, 1024),
                                 (300, 4096, 4096), (1024, 1024, 8192)])
def test_stream_k_not_where_tiles_fill_the_sms_or_k_is_short(mnk):
    m, n, k = mnk
    p = only_segment(linear_fd().explain([meta(m, k), meta(n, k)], device="h200")).kernel.params
    assert p.stream_k == 0, p


@pytest.mark.parametrize("feature", [True, False])
def test_stream_k_feature(feature):
    from pyfuser import options
    change = {"enable" if feature else "disable": ["matmul_stream_k"]}
    with options.override(**change):
        p = only_segment(linear_fd().explain([meta(1536, 4096), meta(1536, 4096)],
                                             device="h200")).kernel.params
        q = only_segment(linear_fd().explain([meta(768, 8192), meta(768, 8192)],
                                             device="h200")).kernel.params
    assert (p.stream_k > 0, q.stream_k > 0) == (feature, feature), (p, q)


@pytest.mark.parametrize("kind", ["bias_gelu", None])
@pytest.mark.parametrize("tile", matmul.STREAM_K_TILES)
def test_stream_k_kernels_compile_without_spills(kind, tile, monkeypatch):
    """Each stream-K tile, bare and with a bias (its column registers) + GELU: no spill, no
    serialized wgmma, the fixup's 16-byte partials and acquire-wait in the source, and the
    workspaces sized for the stream-K part's tiles (at most twice the grid)."""
    from pyfuser import options
    from pyfuser.kir.launch import evaluate
    monkeypatch.setattr(matmul, "TILE_CANDIDATES", ())
    monkeypatch.setattr(matmul, "STREAM_K_TILES", (tile,))
    fd = _epilogue_fd(kind) if kind else linear_fd()
    ins = [meta(1536, 4096), meta(1536, 4096)] + ([meta(1536)] if kind else [])
    with options.override(enable=["matmul_stream_k"]):
        seg = only_segment(fd.explain(ins, device="h200", compile=True))
    p = seg.kernel.params
    assert (p.tile_m, p.tile_n, p.compute_roles) == (tile.tile_m, tile.tile_n, 1) and p.stream_k
    report = seg.kernel.ptxas
    assert "0 B spill stores" in report and "serializ" not in report.lower(), report
    assert "warning" not in report.lower(), report
    src = seg.kernel.kernel.source
    assert "pf::load_cg_f32x4" in src and "pf::load_acquire" in src
    launch = seg.kernel.kernel.kernel.launch_description
    kinds = {kind: evaluate(elements, ins) for kind, _, elements in launch.workspaces}
    tiles = min(-(-1536 // tile.tile_m) * -(-1536 // tile.tile_n), 2 * p.grid)
    assert kinds == {"split_k_partials": tiles * p.stream_k * tile.tile_m * tile.tile_n,
                     "split_k_counters": tiles * 2}


def test_stream_k_refuses_ping_pong_clusters_and_split_k():
    fd = linear_fd()
    inputs = [torch.empty(300, 200, dtype=torch.bfloat16), torch.empty(264, 200,
                                                                        dtype=torch.bfloat16)]
    from kir_testing import schedule_and_lower
    for change in ({"compute_roles": 2, "tile_n": 64}, {"split_k": 2}, {"cluster_m": 2},
                   {"stream_k": 1}):
        p = dataclasses.replace(matmul.MatmulParams(tile_m=128, tile_n=128, stages=2, grid=2,
                                                    stream_k=2), **change)
        with pytest.raises(Exception, match="stream-K"):
            schedule_and_lower(fd, inputs, params=p, scheduler=matmul, device="h100-4sm")


# Fused epilogues, on the interpreter ----------------------------------------------------------
def _epilogue_fd(kind, dtype=BF16):
    F32 = DataType.Float
    with FusionDefinition(kind) as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=dtype)
        w = fd.define_tensor(shape=[-1, -1], dtype=dtype)
        if kind == "bias_gelu":                 # gelu_tanh(x @ w^T + b): a linear's bias
            b = fd.define_tensor(shape=[-1], dtype=dtype)
            y = fd.ops.gelu(fd.ops.linear(x, w, b), approximate="tanh")
        elif kind == "residual":                # x @ w^T + r
            r = fd.define_tensor(shape=[-1, -1], dtype=dtype)
            y = fd.ops.linear(x, w) + r
        elif kind == "scales_silu":             # silu(s_row * (x @ w^T) * s_col) in fp32, cast
            sr = fd.define_tensor(shape=[-1], dtype=F32)
            sc = fd.define_tensor(shape=[-1], dtype=F32)
            h = fd.ops.cast(fd.ops.linear(x, w), F32)
            h = h * fd.ops.broadcast(sr, [False, True]) * fd.ops.broadcast(sc, [True, False])
            y = fd.ops.cast(fd.ops.silu(h) * 0.5, dtype)
        fd.add_output(y)
    return fd


def _epilogue_inputs(kind, m, n, k, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(m + 3 * n + k)
    x = torch.randn(m, k, dtype=dtype, generator=g)
    w = torch.randn(n, k, dtype=dtype, generator=g) / 8
    extra = {"bias_gelu": [torch.randn(n, dtype=dtype, generator=g)],
             "residual": [torch.randn(m, n, dtype=dtype, generator=g)],
             "scales_silu": [torch.rand(m, generator=g) + 0.5, torch.rand(n, generator=g)]}
    return [x, w] + extra[kind]


@pytest.mark.parametrize("kind", ["bias_gelu", "residual", "scales_silu"])
@pytest.mark.parametrize("tile, roles", [((128, 128), 1), ((128, 64), 2)])
def test_interpreted_fused_epilogue(kind, tile, roles):
    from kir_testing import interpret_against_float64, schedule_and_lower
    fd = _epilogue_fd(kind)
    inputs = _epilogue_inputs(kind, 130, 200, 72)
    ok, why = matmul.can_schedule(fd.fusion)
    assert ok, why
    p = matmul.MatmulParams(tile_m=tile[0], tile_n=tile[1], stages=2, grid=3,
                            compute_roles=roles)
    st, _, p, kernel = schedule_and_lower(fd, inputs, params=p, scheduler=matmul,
                                          device="h100-4sm")
    interpret_against_float64(fd, st, kernel, inputs, context=(kind, p))


@pytest.mark.parametrize("kind, tile, roles", [("bias_gelu", (128, 192), 1),
                                               ("scales_silu", (128, 64), 2)])
def test_column_inputs_are_read_when_the_tile_starts(kind, tile, roles):
    """A fusion input the epilogue reads by the column alone (a linear's bias, a column scale)
    is read into tn / 4 registers per thread when the tile starts (RegisterCopy), before the
    tile's wgmmas; the epilogue reads those registers, not global memory. A row scale is read
    in the epilogue still."""
    from kir_testing import schedule_and_lower
    from pyfuser.codegen.cuda import generate_cuda
    fd = _epilogue_fd(kind)
    inputs = _epilogue_inputs(kind, 130, 200, 72)
    p = matmul.MatmulParams(tile_m=tile[0], tile_n=tile[1], stages=2, grid=3,
                            compute_roles=roles)
    _, _, _, kernel = schedule_and_lower(fd, inputs, params=p, scheduler=matmul,
                                         device="h100-4sm")
    copies = [s for s in K.walk(kernel.body) if isinstance(s, K.RegisterCopy)]
    per_role = tile[1] // 4                        # each ping-pong role reads its own tile's
    assert len(copies) == roles * per_role, len(copies)
    column_input = copies[0].src.buffer.name
    assert {c.src.buffer.name for c in copies} == {column_input}
    assert all(c.dst.buffer.dtype == DataType.Float for c in copies)
    src = generate_cuda(kernel)
    compute = src[src.index("warp-specialized compute loop"):]
    first_copy = compute.index(f"{copies[0].dst.buffer.name}[0] =")
    assert first_copy < compute.index("pf_wgmma_"), "the column loads come after the k loop"
    reads = [line for line in compute.splitlines() if f"{column_input}[" in line]
    assert len(reads) == roles * per_role, reads[:4]
    names = [f"T{v.name}" for v in fd.fusion.inputs]
    assert column_input == names[-1]                 # the bias, or the column scale
    if kind == "scales_silu":      # the row scale: read in the epilogue, per accumulator
        assert compute.count(f"{names[2]}[") >= roles * tile[1] // 2


def test_lone_output_values_stay_fp32_until_the_stmatrix():
    """A 16-bit output no op reads back keeps its epilogue values in fp32 (the stmatrix's pack
    rounds once); a pre-activation another op reads stays 16-bit, and so do both outputs of a
    kernel that stores two."""
    from kir_testing import schedule_and_lower
    for kind, want in (("residual", {"pf_epi": DataType.Float}),
                       ("bias_gelu", {"pf_epi": DataType.Float})):
        fd = _epilogue_fd(kind)
        _, _, _, kernel = schedule_and_lower(fd, _epilogue_inputs(kind, 130, 200, 72),
                                             params=matmul.MatmulParams(tile_m=128, tile_n=128,
                                                                        stages=2, grid=3),
                                             scheduler=matmul, device="h100-4sm")
        bufs = {s.buffer.name: s.buffer.dtype for s in K.walk(kernel.body)
                if isinstance(s, K.Allocate) and s.buffer.name.startswith("pf_epi")}
        assert bufs == want, (kind, bufs)
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=BF16)
        w = fd.define_tensor(shape=[-1, -1], dtype=BF16)
        h = fd.ops.linear(x, w)
        fd.add_output(h)
        fd.add_output(fd.ops.relu(h))
    inputs = _epilogue_inputs("residual", 130, 200, 72)[:2]
    _, _, _, kernel = schedule_and_lower(fd, inputs, params=matmul.MatmulParams(
        tile_m=128, tile_n=128, stages=2, grid=3, output_bytes=(2, 2)), scheduler=matmul,
        device="h100-4sm")
    bufs = {s.buffer.name: s.buffer.dtype for s in K.walk(kernel.body)
            if isinstance(s, K.Allocate) and s.buffer.name.startswith("pf_epi")}
    assert bufs == {"pf_epi": BF16, "pf_epi1": BF16}, bufs


@pytest.mark.parametrize("tile, boxes, roles", [((128, 256), 0, 1), ((128, 192), 3, 1),
                                                ((128, 192), 1, 1), ((128, 128), 1, 1),
                                                ((128, 64), 0, 1), ((128, 128), 0, 2),
                                                ((128, 128), 1, 2), ((128, 64), 0, 2)])
def test_residual_read_through_the_staging_boxes(tile, boxes, roles):
    """The residual's boxes land by TMA in the staging boxes (a warp group's first boxes when
    the tile starts, the others when their box is free) and each lane reads its values with
    ldmatrix: interpreted at [130, 392] on a grid of 2 (each CTA runs several tiles, so the
    staging boxes' mbarriers go through several phases; with 3 boxes a tile, each box's phase
    follows the tile count; in ping-pong each role has its own boxes and mbarriers and counts
    the tiles it takes), against float64; no global read of the residual is left."""
    import re

    from kir_testing import interpret_against_float64, schedule_and_lower
    from pyfuser.codegen.cuda import generate_cuda
    fd = _epilogue_fd("residual")
    inputs = _epilogue_inputs("residual", 130, 392, 72)
    p = matmul.MatmulParams(tile_m=tile[0], tile_n=tile[1], stages=2, grid=2,
                            epilogue_boxes=boxes, staged_input=2, compute_roles=roles)
    st, _, p, kernel = schedule_and_lower(fd, inputs, params=p, scheduler=matmul,
                                          device="h100-4sm")
    interpret_against_float64(fd, st, kernel, inputs, context=(tile, boxes, roles))
    assert sum(isinstance(x, K.LdMatrix) for x in K.walk(kernel.body)) > 0
    residual = next(q.name for q in kernel.params if q.source == ("input", 2))
    loads = [x for x in K.walk(kernel.body) if isinstance(x, K.TensorMapLoad)
             and x.source.name == residual]
    assert len(loads) == p.boxes_per_tile * p.compute_warp_groups, len(loads)
    assert not re.search(re.escape(residual) + r"\[", generate_cuda(kernel))


@pytest.mark.parametrize("roles", [1, 2])
def test_fp16_residual_read_through_the_staging_boxes(roles):
    """The same in fp16 (ldmatrix's halves read as fp16), cooperative and ping-pong."""
    from kir_testing import interpret_against_float64, schedule_and_lower
    fd = _epilogue_fd("residual", dtype=DataType.Half)
    inputs = _epilogue_inputs("residual", 130, 392, 72, dtype=torch.float16)
    p = matmul.MatmulParams(tile_m=128, tile_n=128, stages=2, grid=2, staged_input=2,
                            compute_roles=roles)
    st, _, p, kernel = schedule_and_lower(fd, inputs, params=p, scheduler=matmul,
                                          device="h100-4sm")
    assert {x.out.dtype for x in K.walk(kernel.body) if isinstance(x, K.LdMatrix)} == {
        DataType.Half}
    interpret_against_float64(fd, st, kernel, inputs, context=roles)


def test_the_heuristic_stages_a_residual_of_the_outputs_dtype():
    """A residual of the output's shape and dtype is read through the staging boxes; not a
    bias (one row), a residual of another dtype, a fp32 output or split-K; a forced staged
    input that cannot be staged is refused with a reason."""
    from kir_testing import setup

    def params(fd, inputs, **opts):
        import pyfuser.options as O
        with O.override(**opts):
            st = setup(fd, inputs, "h100")
            return matmul.compute_heuristics(st.fusion, st.info), st
    x, w = meta(8192, 4096), meta(16384, 4096)
    with FusionDefinition("residual") as fd:
        fd.add_output(fd.ops.linear(fd.from_pytorch(x), fd.from_pytorch(w))
                      + fd.from_pytorch(meta(8192, 16384)))
    p, _ = params(fd, [x, w, meta(8192, 16384)])
    assert p.staged_input == 2 and p.compute_roles == 1, p
    assert "input 2 read through the staging boxes" in p.describe()
    p, _ = params(fd, [x, w, meta(8192, 16384)], enable=["matmul_pingpong"])
    assert p.staged_input == 2 and p.compute_roles == 2, p
    p, st = params(fd, [x, w, meta(8192, 16384)])
    split = dataclasses.replace(p, split_k=2, staged_input=-1)
    assert matmul.staged_input(st.fusion, st.info, split, (1, 8192, 16384)) == -1
    with pytest.raises(SchedulerError, match="cannot be read through the staging boxes"):
        matmul.schedule(setup(fd, [x, w, meta(8192, 16384)], "h100").fusion,
                        dataclasses.replace(split, staged_input=2))
    for kind in ("bias_gelu", "scales_silu"):
        fd = _epilogue_fd(kind)
        ins = [meta(8192, 4096), meta(16384, 4096)] + (
            [meta(16384)] if kind == "bias_gelu" else
            [meta(8192, dtype=torch.float32), meta(16384, dtype=torch.float32)])
        assert params(fd, ins)[0].staged_input == -1, kind
    with FusionDefinition("residual_fp16") as fd:
        fd.add_output(fd.ops.linear(fd.from_pytorch(x), fd.from_pytorch(w))
                      + fd.from_pytorch(meta(8192, 16384, dtype=torch.float16)))
    assert params(fd, [x, w, meta(8192, 16384, dtype=torch.float16)])[0].staged_input == -1


def _compiled_matmul_segment(fd, inputs):
    """`fd`'s plan on the H100 for meta copies of `inputs`: one matmul kernel, compiled with no
    spills, no serialized wgmma and no NVRTC warning."""
    metas = [torch.empty(t.shape, dtype=t.dtype, device="meta") for t in inputs]
    seg = only_segment(fd.explain(metas, device="h100", compile=True))
    assert seg.kind == "kernel" and seg.kernel.scheduler == "matmul", seg
    report = seg.kernel.ptxas
    assert "0 B spill stores" in report and "serializ" not in report.lower(), report
    assert "warning" not in report.lower(), report      # (an unused variable, say)
    return seg


def test_a_fused_epilogue_is_one_kernel_with_the_matmul():
    _compiled_matmul_segment(_epilogue_fd("bias_gelu"),
                             _epilogue_inputs("bias_gelu", 8192, 16384, 64))


def _two_outputs_fd(kind):
    """Two stored outputs of one matmul: a pre-activation and its activation."""
    with FusionDefinition(kind) as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=BF16)
        w = fd.define_tensor(shape=[-1, -1], dtype=BF16)
        if kind == "bias_and_gelu":             # h = x @ w^T + b; gelu_tanh(h): both stored
            b = fd.define_tensor(shape=[-1], dtype=BF16)
            h = fd.ops.linear(x, w, b)
            fd.add_output(h)
            fd.add_output(fd.ops.gelu(h, approximate="tanh"))
        else:                                   # relu(x @ w^T + r) first, then x @ w^T + r
            r = fd.define_tensor(shape=[-1, -1], dtype=BF16)
            h = fd.ops.linear(x, w) + r
            fd.add_output(fd.ops.relu(h))
            fd.add_output(h)
    return fd


def _two_outputs_inputs(kind, m, n, k):
    g = torch.Generator().manual_seed(m + 5 * n + k)
    x = torch.randn(m, k, dtype=BF16_T, generator=g)
    w = torch.randn(n, k, dtype=BF16_T, generator=g) / 8
    extra = torch.randn(n, dtype=BF16_T, generator=g) if kind == "bias_and_gelu" else \
        torch.randn(m, n, dtype=BF16_T, generator=g)
    return [x, w, extra]


@pytest.mark.parametrize("kind", ["bias_and_gelu", "residual_relu"])
@pytest.mark.parametrize("tile, roles", [((128, 128), 1), ((128, 64), 2)])
def test_interpreted_two_stored_outputs(kind, tile, roles):
    """A pre-activation stored beside its activation: each output its own staging boxes, both
    boxes of a chunk stored by one bulk group; the activation reads the pre-activation's
    16-bit value, as the fusion defines it."""
    from kir_testing import interpret_against_float64, schedule_and_lower
    fd = _two_outputs_fd(kind)
    inputs = _two_outputs_inputs(kind, 130, 200, 72)
    ok, why = matmul.can_schedule(fd.fusion)
    assert ok and "2 outputs stored" in why, why
    p = matmul.MatmulParams(tile_m=tile[0], tile_n=tile[1], stages=2, grid=3,
                            compute_roles=roles, output_bytes=(2, 2))
    st, _, p, kernel = schedule_and_lower(fd, inputs, params=p, scheduler=matmul,
                                          device="h100-4sm")
    stores = [s for s in K.walk(kernel.body) if isinstance(s, K.TensorMapStore)]
    assert len({s.target.name for s in stores}) == 2 and len({s.src.buffer.name for s in stores}) == 2
    interpret_against_float64(fd, st, kernel, inputs, context=(kind, p))


@pytest.mark.parametrize("kind", ["bias_and_gelu", "residual_relu"])
def test_two_stored_outputs_through_the_executor(kind):
    """The heuristic's path (outputs=2 staged) to the interpreted kernel, outputs poisoned."""
    from pyfuser.testing import run_and_check
    fd = _two_outputs_fd(kind)
    run_and_check(fd, _two_outputs_inputs(kind, 130, 200, 72), scheduler="matmul",
                  options={"enable": ["interpret"]})
    assert fd.last_run.heuristics[0].outputs == 2


def test_two_stored_outputs_take_shared_memory_from_the_stages():
    """The heuristic stages each output's boxes: fewer pipeline stages fit beside them; a
    forced heuristic staging one output for two is refused."""
    fd = _two_outputs_fd("bias_and_gelu")
    seg = _compiled_matmul_segment(fd, _two_outputs_inputs("bias_and_gelu", 8192, 16384, 64))
    p = seg.kernel.params
    one = matmul.fitted_params(p.tile_m, p.tile_n, p.compute_roles, 1, DEVICE_TABLE["h100"], 2,
                               p.b_major)
    assert p.outputs == 2 and p.stages < one.stages, (p, one)
    with pytest.raises(SchedulerError, match="stages 1 output"):
        from kir_testing import schedule_and_lower
        schedule_and_lower(fd, _two_outputs_inputs("bias_and_gelu", 130, 200, 72),
                           params=dataclasses.replace(p, output_bytes=(2,)), scheduler=matmul,
                           device="h100-4sm")


def test_one_row_of_any_length_is_a_tile_map():
    """fuzz 20262001:3: a [1, 29] a (one row: no row stride to keep a multiple of 16 bytes) times
    a row-major b [29, 64] is taken, and the interpreter encodes the one-row map as the
    executor does (it refused the row stride the encoder never uses)."""
    from pyfuser.testing import rel_error
    g = torch.Generator().manual_seed(3)
    a = torch.randn(1, 29, dtype=torch.bfloat16, generator=g)
    b = torch.randn(29, 64, dtype=torch.bfloat16, generator=g)
    fd = matmul_fd()
    out = fd.execute([a, b], options={"enable": ["interpret", "matmul_few_rows"]})[0]
    assert fd.last_run.schedulers == ("matmul",), fd.last_run
    assert rel_error(out, a.double() @ b.double()) < 1e-2


# Batches: 3-D tensor maps ----------------------------------------------------------------------
@pytest.mark.parametrize("case", ["bmm_mn", "bmm_k", "linear_3d", "a3_b2", "a2_b3",
                                  "linear_3d_residual"])
def test_interpreted_batched(case):
    from kir_testing import interpret_against_float64, schedule_and_lower
    g = torch.Generator().manual_seed(len(case))
    bf = torch.bfloat16

    def rnd(*shape):
        return torch.randn(*shape, dtype=bf, generator=g)
    B, M, N, K = 3, 130, 136, 72
    if case == "bmm_mn":
        inputs = [rnd(B, M, K), rnd(B, K, N)]
    elif case == "bmm_k":
        inputs = [rnd(B, M, K), rnd(B, N, K).transpose(1, 2)]
    elif case == "a3_b2":
        inputs = [rnd(B, M, K), rnd(K, N)]
    elif case == "a2_b3":
        inputs = [rnd(M, K), rnd(B, K, N)]
    else:
        inputs = [rnd(B, M, K), rnd(N, K)]
    with FusionDefinition(case) as fd:
        ta, tb = (fd.from_pytorch(t) for t in inputs)
        if case.startswith("linear"):
            y = fd.ops.linear(ta, tb)
            if case.endswith("residual"):
                inputs.append(rnd(B, M, N))
                y = y + fd.from_pytorch(inputs[-1])
        else:
            y = fd.ops.matmul(ta, tb)
        fd.add_output(y)
    ok, why = matmul.can_schedule(fd.fusion)
    assert ok, why
    from kir_testing import setup
    p = matmul.compute_heuristics(*(lambda st: (st.fusion, st.info))(setup(fd, inputs,
                                                                           "h100-4sm")))
    p = dataclasses.replace(p, stages=2, grid=3)
    st, _, p, kernel = schedule_and_lower(fd, inputs, params=p, scheduler=matmul,
                                          device="h100-4sm")
    assert any(m.batch for m in kernel.tensor_maps.values())
    interpret_against_float64(fd, st, kernel, inputs, context=(case, p))


# More batch dims: tensor maps of 4 and 5 dims, the batch coordinates from the linear batch.
@pytest.mark.parametrize("case", ["bmm4_mn", "bmm4_heads", "a4_b2", "linear4_epilogue", "bmm5"])
def test_interpreted_batch_dims(case):
    """Operands and outputs of 2 and 3 batch dims: contiguous; attention-style heads (q of
    [B, S, H, D] seen as [B, H, S, D]: batch strides not nested); a 2-D operand shared by every
    batch; an epilogue reading a bias, a per-head scale broadcast over the other dims and a
    residual of the output's 4 dims (read through the staging boxes); 3 batch dims (a 5-D
    map)."""
    from kir_testing import interpret_against_float64, schedule_and_lower, setup
    g = torch.Generator().manual_seed(len(case) + 7)

    def rnd(*shape):
        return torch.randn(*shape, dtype=torch.bfloat16, generator=g)
    M, N, K = 70, 72, 136
    if case == "bmm4_mn":
        inputs = [rnd(2, 3, M, K), rnd(2, 3, K, N)]
    elif case == "bmm4_heads":
        inputs = [rnd(2, M, 3, K).transpose(1, 2), rnd(2, N, 3, K).permute(0, 2, 3, 1)]
    elif case == "a4_b2":
        inputs = [rnd(2, 3, M, K), rnd(K, N)]
    elif case == "bmm5":
        inputs = [rnd(2, 2, 2, M, K), rnd(2, 2, 2, K, N)]
    else:
        inputs = [rnd(2, 3, M, K), rnd(N, K), rnd(N), rnd(1, 3, 1, 1), rnd(2, 3, M, N)]
    with FusionDefinition(case) as fd:
        ts = [fd.from_pytorch(t) for t in inputs]
        if case == "linear4_epilogue":
            y = fd.ops.linear(ts[0], ts[1], ts[2]) * ts[3] + ts[4]
        else:
            y = fd.ops.matmul(ts[0], ts[1])
        fd.add_output(y)
    ok, why = matmul.can_schedule(fd.fusion)
    assert ok, why
    st = setup(fd, inputs, "h100-4sm")
    p = dataclasses.replace(matmul.compute_heuristics(st.fusion, st.info), stages=2, grid=3)
    st, _, p, kernel = schedule_and_lower(fd, inputs, params=p, scheduler=matmul,
                                          device="h100-4sm")
    rank = inputs[0].dim()
    assert {len(m.batch) for m in kernel.tensor_maps.values()} >= {rank - 2}, kernel.tensor_maps
    assert (p.staged_input >= 0) == (case == "linear4_epilogue"), p
    interpret_against_float64(fd, st, kernel, inputs, context=(case, p))


@pytest.mark.parametrize("case", ["mask", "per_head", "full"])
@pytest.mark.parametrize("roles", [1, 2])
def test_interpreted_staged_input_of_broadcast_batch_dims(case, roles):
    """scores * scale + x through the staging boxes, x's batch dims the output's or broadcasts
    of one element: a mask of [B, 1, S, S] (every head's tile loads batch b's box), [1, H, S, S],
    and [B, H, S, S]; cooperative and ping-pong."""
    from kir_testing import interpret_against_float64, schedule_and_lower, setup
    g = torch.Generator().manual_seed(5)

    def rnd(*shape):
        return torch.randn(*shape, dtype=torch.bfloat16, generator=g)
    M, N, K = 70, 136, 72
    x = {"mask": rnd(2, 1, M, N), "per_head": rnd(1, 3, M, N), "full": rnd(2, 3, M, N)}[case]
    inputs = [rnd(2, M, 3, K).transpose(1, 2), rnd(2, N, 3, K).permute(0, 2, 3, 1), x]
    with FusionDefinition(case) as fd:
        ts = [fd.from_pytorch(t) for t in inputs]
        fd.add_output(fd.ops.matmul(ts[0], ts[1]) * 0.125 + ts[2])
    st = setup(fd, inputs, "h100-4sm")
    p = matmul.compute_heuristics(st.fusion, st.info)
    assert p.staged_input == 2, p
    p = dataclasses.replace(p, stages=2, grid=3, compute_roles=roles)
    st, _, p, kernel = schedule_and_lower(fd, inputs, params=p, scheduler=matmul,
                                          device="h100-4sm")
    interpret_against_float64(fd, st, kernel, inputs, context=(case, p))


def test_batches_broadcast_against_each_other_run_torch():
    a = meta(1, 128, 64)
    b = meta(3, 64, 128)
    with FusionDefinition("bcast_batch") as fd:
        fd.add_output(fd.ops.matmul(fd.from_pytorch(a), fd.from_pytorch(b)))
    e = fd.explain([a, b], device="h100")
    assert any(s.kind == "library" for s in e.segments) or refused_to_library(e), e


def test_fewer_batch_dims_than_the_output_run_torch():
    """b [H, K, N] against a [B, H, M, K]: a batch broadcast (not built) goes to the library,
    with the reason; 4 and 5 dims of equal batches are the kernel's."""
    a, b = meta(2, 3, 128, 64), meta(3, 64, 128)
    with FusionDefinition("bcast_heads") as fd:
        fd.add_output(fd.ops.matmul(fd.from_pytorch(a), fd.from_pytorch(b)))
    ok, why = matmul.can_schedule(fd.fusion)
    assert not ok and "1 batch dims against the output's 2" in why, why
    e = fd.explain([a, b], device="h100")
    assert any(s.kind == "library" for s in e.segments) or refused_to_library(e), e
    for shape in ((2, 3, 128, 64), (2, 2, 3, 128, 64)):
        a, b = meta(*shape), meta(*shape[:-2], 64, 128)
        with FusionDefinition("bmm") as fd:
            fd.add_output(fd.ops.matmul(fd.from_pytorch(a), fd.from_pytorch(b)))
        assert only_segment(fd.explain([a, b], device="h100")).kernel.scheduler == "matmul"


def test_tile_box_rules_of_a_batch():
    from pyfuser.schedule.tma_rules import check_tile_box
    ok = check_tile_box([3, 100, 64], [6400, 64, 1], 16, 2, 2, 1, 64, 64, 128, batch=0)
    assert ok == []
    bad = check_tile_box([3, 100, 64], [6404, 64, 1], 16, 2, 2, 1, 64, 64, 128, batch=0)
    assert len(bad) == 1 and "batch dim 0 stride 6404" in bad[0], bad
    # One matrix in the batch: no batch stride to keep.
    assert check_tile_box([1, 100, 64], [7, 64, 1], 16, 2, 2, 1, 64, 64, 128, batch=0) == []


# The pipeline's wgmma rules (lower/pipeline.py) -------------------------------------------------
def _slot_body(extra_read: bool, pending: int = 1):
    from pyfuser.lower.pipeline import BufferedTensor
    slot = K.Buffer("slot", BF16, "shared", K.Const(8192), align=1024)
    acc = K.Buffer("acc", DataType.Float, "local", K.Const(32))
    other = K.Buffer("r", DataType.Float, "local", K.Const(1))
    body = [K.WgmmaFence(),
            K.Wgmma(acc, K.TensorIndex(slot, K.Const(0)), K.TensorIndex(slot, K.Const(0)), 64,
                    BF16, K.Const(True, "bool")),
            K.WgmmaCommit()]
    if extra_read:
        body.append(K.InitValue(other, K.TensorIndex(slot, K.Const(5))))
    body.append(K.WgmmaWait(pending))
    return body, [BufferedTensor(None, slot, None, 8192, [])]


def test_slots_read_by_wgmma_alone_are_released_per_warp_group_and_late():
    from pyfuser.lower.pipeline import release_lag, slots_read_by_wgmma_only
    body, buffered = _slot_body(extra_read=False)
    assert slots_read_by_wgmma_only(body, buffered) and release_lag(body, buffered) == 1
    body, buffered = _slot_body(extra_read=False, pending=0)
    assert release_lag(body, buffered) == 0
    body, buffered = _slot_body(extra_read=True)
    assert not slots_read_by_wgmma_only(body, buffered)
    from pyfuser.lower.context import LoweringError
    with pytest.raises(LoweringError, match="also reads its slots outside wgmma"):
        release_lag(body, buffered)


def test_a_bias_computed_from_an_input_is_computed_before_the_matmul_element():
    """fuzz 20262004:107: linear(x, w, cast(b8)) with b8 a float8 input: the bias's cast is an
    op of the epilogue that does not read the matmul; it comes before the matmul's element (it
    was emitted after, and lowering failed on the bias it had not computed yet)."""
    from pyfuser.testing import rel_error
    g = torch.Generator().manual_seed(107)
    x = torch.rand(1, 136, generator=g).half() + 0.5
    w = torch.randn(288, 136, generator=g).half()
    b8 = (torch.rand(288, generator=g) + 0.5).to(torch.float8_e4m3fn)
    with FusionDefinition("bias8") as fd:
        tx = fd.define_tensor(shape=[-1, -1], dtype=DataType.Half)     # M = 1 at run time
        tw = fd.define_tensor(shape=[-1, -1], dtype=DataType.Half)
        tb = fd.define_tensor(shape=[-1], dtype=DataType.Float8_e4m3fn)
        fd.add_output(fd.ops.linear(tx, tw, fd.ops.cast(tb, DataType.Half)))
    out = fd.execute([x, w, b8], options={"enable": ["interpret", "matmul_few_rows"]})[0]
    assert fd.last_run.schedulers == ("matmul",) and not fd.last_run.internal_error
    ref = x.double() @ w.double().t() + b8.double()
    assert rel_error(out, ref) < 1e-2


def test_a_cast_to_another_16_bit_type_stages_that_type():
    """fuzz 20262006:18: fp16 operands, the output cast to bf16: the staging boxes hold bf16
    (they were fp16, and the interpreter refused bf16 stmatrix values into them)."""
    from pyfuser.testing import rel_error
    g = torch.Generator().manual_seed(18)
    a = torch.randn(70, 96, generator=g).half()
    b = torch.randn(96, 200, generator=g).half()
    with FusionDefinition("cast_out") as fd:
        ta = fd.define_tensor(shape=[-1, -1], dtype=DataType.Half)
        tb = fd.define_tensor(shape=[-1, -1], dtype=DataType.Half)
        fd.add_output(fd.ops.cast(fd.ops.matmul(ta, tb), DataType.BFloat16))
    out = fd.execute([a, b], options={"enable": ["interpret"]})[0]
    assert fd.last_run.schedulers == ("matmul",) and out.dtype == torch.bfloat16
    assert rel_error(out, a.double() @ b.double()) < 1e-2


def test_the_schedulers_tile_facts_are_the_kernel_irs():
    # schedule/schedulers/matmul.py keeps its own copies (importing no kernel IR).
    assert matmul.WARP_GROUP_ROWS == K.WGMMA_M
    assert matmul.TILE_K == matmul.EPILOGUE_BOX == K.SWIZZLED_ROW_16BIT


# A's M dim a broadcast: fd.from_pytorch of a [1, K] row (a decode step's x) -------------------
@pytest.mark.parametrize("case", ["linear", "matmul_mn", "bias_gelu", "residual"])
@pytest.mark.parametrize("roles", [1, 2])
def test_a_row_of_one_broadcast_m_is_a_matmul_kernel(case, roles):
    # The map of A has one row; every other row of the tile is zero-filled and never stored.
    from kir_testing import interpret_against_float64, schedule_and_lower
    g = torch.Generator().manual_seed(7)
    x = torch.randn(1, 200, dtype=BF16_T, generator=g)
    w = torch.randn(264, 200, dtype=BF16_T, generator=g)
    inputs = [x, w.t().contiguous()] if case == "matmul_mn" else [x, w]
    with FusionDefinition("row") as fd:
        tx, tw = fd.from_pytorch(inputs[0]), fd.from_pytorch(inputs[1])
        if case == "matmul_mn":
            fd.add_output(fd.ops.matmul(tx, tw))
        elif case == "linear":
            fd.add_output(fd.ops.linear(tx, tw))
        elif case == "bias_gelu":
            bias = torch.randn(264, dtype=BF16_T, generator=g)
            inputs.append(bias)
            fd.add_output(fd.ops.gelu(fd.ops.linear(tx, tw, fd.from_pytorch(bias)),
                                      approximate="tanh"))
        else:
            r = torch.randn(1, 264, dtype=BF16_T, generator=g)
            inputs.append(r)
            fd.add_output(fd.ops.add(fd.ops.linear(tx, tw), fd.from_pytorch(r)))
    assert fd.fusion.inputs[0].domain.logical[0].is_broadcast
    ok, why = matmul.can_schedule(fd.fusion)
    assert ok, why
    p = matmul.MatmulParams(tile_m=128, tile_n=128, stages=3, grid=2, compute_roles=roles,
                            b_major="MN" if case == "matmul_mn" else "K")
    st, _, p, kernel = schedule_and_lower(fd, inputs, params=p, scheduler=matmul,
                                          device="h100-4sm")
    interpret_against_float64(fd, st, kernel, inputs, context=(case, p))


def test_other_broadcast_operand_dims_run_torch():
    # A [1, K] weight of a linear (N = 1 broadcast): the kernel stores rows of N elements.
    x, w = meta(256, 64), meta(1, 64)
    with FusionDefinition("bcast_n") as fd:
        fd.add_output(fd.ops.linear(fd.from_pytorch(x), fd.from_pytorch(w)))
    ok, why = matmul.can_schedule(fd.fusion)
    assert not ok and "broadcast dim other than A's M" in why, why


def test_branchy_math_in_a_pingpong_epilogue_compiles_in_seconds():
    """Fuzz case 20263601:1 as generated: a ping-pong epilogue (128 accumulators a thread, each
    role its own copy, two stored outputs) with powf inline took NVRTC 125 s on this CPU (the
    GPU fuzzer's per-case limit killed it); the device library calls it (math.cuh
    PF_OUTLINED): about 8 s. The bound is loose on purpose (a shared 2-core CI machine)."""
    import time

    def meta(shape, strides, dtype):
        return torch.empty(4096, dtype=dtype, device="meta").as_strided(shape, strides)
    inputs = [meta((1, 144, 72), (72, 72, 1), torch.half),
              meta((1, 72, 16), (1152, 16, 1), torch.half),
              meta((1, 144, 16), (4736, 2, 296), torch.int64),
              meta((1, 1, 16), (1, 1, 7), torch.float32),
              meta((1, 144, 16), (16, 0, 1), torch.float32)]
    with FusionDefinition("fuzz_20263601_1") as fd:
        t0 = fd.define_tensor(shape=[-1, -1, 72], contiguity=[True, True, True],
                              dtype=DataType.Half, stride_order=[1, 2, 0])
        t1 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True],
                              dtype=DataType.Half)
        t2 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, False, False],
                              dtype=DataType.Int, stride_order=[2, 0, 1])
        t3 = fd.define_tensor(shape=[-1, 1, -1], contiguity=[False, None, True],
                              dtype=DataType.Float, stride_order=[0, 1, 2])
        t4 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, None, True],
                              dtype=DataType.Float, expanded=[False, True, False])
        v0 = fd.ops.matmul(t0, t1)
        v4 = fd.ops.add(fd.ops.abs(fd.ops.sigmoid(fd.ops.mul(v0, 0.00048828125))), 0.5)
        v7 = fd.ops.pow(v4, fd.ops.mul(fd.ops.cast(t2, dtype=DataType.Float), 0.25))
        v10 = fd.ops.cast(fd.ops.mul(fd.ops.mul(v7, t3), t4), dtype=DataType.Half)
        fd.add_output(v0)
        fd.add_output(v10)
    start = time.monotonic()
    seg = only_segment(fd.explain(inputs, device="h100", compile=True))
    seconds = time.monotonic() - start
    assert seg.kind == "kernel" and seg.kernel.scheduler == "matmul", seg
    assert seg.kernel.params.compute_roles == 2 and seg.kernel.params.outputs == 2
    assert "0 B spill stores" in seg.kernel.ptxas, seg.kernel.ptxas
    assert seconds < 60, f"NVRTC took {seconds:.0f} s"


# Clusters of CTAs along M, B multicast (MatmulParams.cluster_m) -------------------------------
def _cluster_kernel(m, n, k, params, b_major="K", extra=None, fd=None, inputs=None):
    from kir_testing import schedule_and_lower
    if fd is None:
        g = torch.Generator().manual_seed(m + 5 * n + k)
        a = torch.randn(m, k, dtype=torch.bfloat16, generator=g)
        b = torch.randn(*((k, n) if b_major == "MN" else (n, k)), dtype=torch.bfloat16,
                        generator=g)
        inputs = [a, b]
        with FusionDefinition("mm") as fd:
            ta, tb = fd.from_pytorch(a), fd.from_pytorch(b)
            fd.add_output(fd.ops.matmul(ta, tb) if b_major == "MN" else fd.ops.linear(ta, tb))
    st, _, p, kernel = schedule_and_lower(fd, inputs, params=params, scheduler=matmul,
                                          device="h100-4sm")
    return fd, st, p, kernel, inputs


@pytest.mark.parametrize("mnk, tile, roles, grid, b_major, along", [
    ((130, 136, 136), (128, 128), 1, 2, "K", "m"),  # one pair: the second tile row mostly past M
    ((300, 264, 136), (128, 128), 2, 2, "K", "m"),  # 3 tile rows: the last pair's second empty
    ((520, 264, 200), (128, 256), 1, 4, "K", "m"),  # 2 clusters, tiles across the stage counter
    ((129, 200, 72), (128, 128), 1, 2, "MN", "m"),  # B's 64-row boxes shared out, one per CTA
    ((390, 264, 72), (128, 256), 1, 2, "MN", "m"),  # two boxes per CTA
    ((300, 200, 136), (128, 64), 2, 2, "K", "n"),   # A shared: 4 tile columns, 3 rows
    ((130, 136, 200), (128, 128), 1, 4, "MN", "n"),  # 2 tile columns past N by 8
    ((260, 72, 72), (128, 64), 2, 2, "K", "n"),     # the second tile column past N but 8
])
def test_interpreted_cluster_multicast(mnk, tile, roles, grid, b_major, along):
    from kir_testing import interpret_against_float64
    p = matmul.MatmulParams(tile_m=tile[0], tile_n=tile[1], stages=2, grid=grid,
                            compute_roles=roles, b_major=b_major,
                            cluster_m=2 if along == "m" else 1, cluster_n=2 if along == "n" else 1)
    fd, st, p, kernel, inputs = _cluster_kernel(*mnk, p, b_major=b_major)
    assert kernel.launch.cluster == (2, 1, 1) and kernel.launch.persistent
    casts = [s for s in K.walk(kernel.body) if isinstance(s, K.TensorMapLoad) and s.multicast > 1]
    # B alone is shared along M, A alone along N.
    assert casts and all(s.map.index == (1 if along == "m" else 0) for s in casts)
    interpret_against_float64(fd, st, kernel, inputs, context=p)


@pytest.mark.parametrize("kind", ["residual", "bias_gelu"])
def test_interpreted_cluster_fused_epilogue(kind):
    """A residual read through the staging boxes (each CTA's own TMA boxes, not multicast)
    and a bias beside the cluster's shared B."""
    from kir_testing import interpret_against_float64
    fd = _epilogue_fd(kind)
    inputs = _epilogue_inputs(kind, 260, 264, 136)
    p = matmul.MatmulParams(tile_m=128, tile_n=256, stages=2, grid=2, cluster_m=2,
                            staged_input=2 if kind == "residual" else -1)
    fd, st, p, kernel, inputs = _cluster_kernel(0, 0, 0, p, fd=fd, inputs=inputs)
    interpret_against_float64(fd, st, kernel, inputs, context=(kind, p))


def test_interpreted_cluster_along_n_column_major_a():
    """A MN-major (a column-major [M, K]) shared along N: its two 64-row boxes one per CTA."""
    from kir_testing import interpret_against_float64
    g = torch.Generator().manual_seed(11)
    a = torch.randn(136, 200, dtype=torch.bfloat16, generator=g).t()      # [200, 136], (1, 200)
    b = torch.randn(264, 136, dtype=torch.bfloat16, generator=g)
    with FusionDefinition("mm") as fd:
        fd.add_output(fd.ops.linear(fd.from_pytorch(a), fd.from_pytorch(b)))
    p = matmul.MatmulParams(tile_m=128, tile_n=128, stages=2, grid=2, a_major="MN", cluster_n=2)
    fd, st, p, kernel, inputs = _cluster_kernel(0, 0, 0, p, fd=fd, inputs=[a, b])
    interpret_against_float64(fd, st, kernel, inputs, context=p)


def test_interpreted_cluster_batched():
    from kir_testing import interpret_against_float64
    g = torch.Generator().manual_seed(7)
    a = torch.randn(3, 130, 72, dtype=torch.bfloat16, generator=g)
    b = torch.randn(3, 72, 136, dtype=torch.bfloat16, generator=g)
    with FusionDefinition("bmm") as fd:
        fd.add_output(fd.ops.matmul(fd.from_pytorch(a), fd.from_pytorch(b)))
    p = matmul.MatmulParams(tile_m=128, tile_n=128, stages=2, grid=4, cluster_m=2, b_major="MN")
    fd, st, p, kernel, inputs = _cluster_kernel(0, 0, 0, p, fd=fd, inputs=[a, b])
    interpret_against_float64(fd, st, kernel, inputs, context=p)


def test_interpreted_cluster_batch_dims():
    """A 4-D batch in clusters of 2 along M: B's shares multicast through 4-D maps."""
    from kir_testing import interpret_against_float64
    g = torch.Generator().manual_seed(11)
    a = torch.randn(2, 2, 130, 72, dtype=torch.bfloat16, generator=g)
    b = torch.randn(2, 2, 72, 136, dtype=torch.bfloat16, generator=g)
    with FusionDefinition("bmm4") as fd:
        fd.add_output(fd.ops.matmul(fd.from_pytorch(a), fd.from_pytorch(b)))
    p = matmul.MatmulParams(tile_m=128, tile_n=128, stages=2, grid=4, cluster_m=2, b_major="MN")
    fd, st, p, kernel, inputs = _cluster_kernel(0, 0, 0, p, fd=fd, inputs=[a, b])
    interpret_against_float64(fd, st, kernel, inputs, context=p)


@pytest.mark.parametrize("shape, features", [
    ((2, 3, 2048, 512), ["matmul_cluster"]),          # 4-D maps, B multicast
    ((2, 2, 2, 1024, 512), []),                       # 5-D maps
    ((2, 3, 64, 4096), ["matmul_stream_k", "matmul_few_rows"]),
])
def test_batch_dims_kernels_compile(shape, features):
    """The kernels of 2 and 3 batch dims (an epilogue op fused) compile for sm_90a with the
    tensor-map copies of their rank, no spill and no serialized wgmma."""
    from pyfuser import options
    a, b = meta(*shape), meta(*shape[:-2], shape[-1], 1024)
    with FusionDefinition("bmm") as fd:
        fd.add_output(fd.ops.relu(fd.ops.matmul(fd.from_pytorch(a), fd.from_pytorch(b))))
    with options.override(enable=features, disable=["matmul_pingpong"]):
        seg = only_segment(fd.explain([a, b], device="h200", compile=True))
    report = seg.kernel.ptxas
    assert "0 B spill stores" in report and "serializ" not in report.lower(), report
    src = seg.kernel.kernel.source
    body = src[src.index('extern "C"'):]
    rank = len(shape)
    assert f"pf::tma_load_{rank}d" in body and f"pf::tma_store_{rank}d" in body
    p = seg.kernel.params
    assert ("matmul_cluster" in features) == (p.cluster > 1), p
    assert ("matmul_stream_k" in features) == (p.stream_k > 0), p


def _drop(kernel, pick):
    """The kernel with the statements `pick` selects removed (everywhere in its tree)."""
    from pyfuser.kir.rewrite import Rewriter

    class Drop(Rewriter):
        def rewrite(self, stmts):
            return [x for s in stmts if not pick(s) for x in [self.stmt(s)]]
    kernel.body = Drop().rewrite(kernel.body)
    return kernel


@pytest.mark.parametrize("broken", ["peer_release", "release_count", "expected_bytes"])
def test_the_interpreter_catches_a_broken_cluster_pipeline(broken):
    """Each half of the multicast handshake is needed: without the releases sent to the peer
    its producer waits forever; with the empty barriers counting one CTA's releases their
    phases run ahead of the producer's parities; expecting only this CTA's share leaves the
    full barrier's bytes pending."""
    from kir_testing import interpret_against_float64
    from pyfuser.runtime.interpreter import InterpreterError
    p = matmul.MatmulParams(tile_m=128, tile_n=128, stages=2, grid=2, cluster_m=2)
    fd, st, p, kernel, inputs = _cluster_kernel(300, 136, 200, p)
    if broken == "peer_release":
        _drop(kernel, lambda s: isinstance(s, K.MBarrierArrive) and s.cta is not None
              and s.cta.value == 1)
        want = "deadlock"
    elif broken == "release_count":
        for s in K.walk(kernel.body):
            if isinstance(s, K.MBarrierInit) and s.bar.bars.name.startswith("pf_empty"):
                s.arrivals = K.Const(s.arrivals.value // 2)
        want = "more arrivals than its count|deadlock"     # phases complete at half the count
    else:
        for s in K.walk(kernel.body):
            if isinstance(s, K.TensorMapLoad) and s.multicast > 1:
                s.bytes = K.Const(s.bytes.value // 2)
        want = "bytes|deadlock"
    with pytest.raises(InterpreterError, match=want):
        interpret_against_float64(fd, st, kernel, inputs, context=p)


def test_cluster_kernel_compiles_clean_with_multicast_and_peer_releases():
    from kir_testing import compile_clean
    from pyfuser.codegen.cuda import generate_cuda
    p = matmul.MatmulParams(tile_m=128, tile_n=256, stages=4, grid=4, cluster_m=2)
    _, _, _, kernel, _ = _cluster_kernel(1000, 1000, 1000, p)
    src = generate_cuda(kernel)
    assert "pf::tma_load_2d_multicast(" in src and "(unsigned short)3u" in src
    assert src.count("pf::mbarrier_arrive_peer(") >= 2 and src.count("pf::cluster_sync();") == 2
    # B's box is half the tile's columns; A's box is the CTA's own.
    maps = sorted((m.index, m.box) for m in kernel.tensor_maps.values() if m.role == "input")
    assert maps == [(0, (64, 128)), (1, (64, 128))]
    compile_clean(src)


def test_a_multicast_copy_needs_a_cluster_launch():
    from pyfuser.kir.verifier import KernelIRError, verify_kernel
    p = matmul.MatmulParams(tile_m=128, tile_n=128, stages=2, grid=2, cluster_m=2)
    fd, st, p, kernel, inputs = _cluster_kernel(300, 136, 200, p)
    del kernel.fusion.launch_hints["cluster"]
    with pytest.raises(KernelIRError, match="without a thread-block cluster"):
        verify_kernel(kernel, after="test")


@pytest.mark.parametrize("mnk, feature, cluster", [
    ((8192, 8192, 8192), None, 2),       # cooperative 128x256 over many waves
    ((4096, 4096, 4096), None, 2),
    ((16384, 256, 4096), None, 1),       # 128 tiles: under a wave of 132 SMs
    ((8192, 8192, 512), None, 1),        # 8 k blocks a tile: measured no faster
    ((8192, 8192, 64), True, 2),
    ((1024, 1024, 1024), None, 1),       # ping-pong 128x64, rows on sectors
    ((1000, 1000, 1000), True, 2),       # forced: along M
    ((8192, 8192, 8192), False, 1),
    # Rows 16 bytes into a sector (K = 8 mod 16): the L2's requests bound the k loop.
    ((3000, 2056, 1032), None, 2),       # 128x192 tiles
    ((3000, 2056, 1040), None, 1),       # the same on sectors
    ((2048, 2048, 1000), None, 2),       # 128 tiles of 128x256: under a wave
    ((1000, 1000, 1000), None, (1, 2)),  # ping-pong 128x64: along N, A shared
    ((512, 2048, 1000), None, (1, 2)),
    ((3000, 2056, 520), None, 1),        # 9 k blocks
    ((3000, 2056, 1032), False, 1),
])
def test_heuristic_cluster_rule(mnk, feature, cluster):
    from pyfuser.options import Options
    fusion, info = _info(*mnk)
    if feature is not None:
        info.options = Options(**{"enable" if feature else "disable":
                                  frozenset(["matmul_cluster"])})
    p = matmul.compute_heuristics(fusion, info)
    along = cluster if isinstance(cluster, tuple) else (cluster, 1)
    assert (p.cluster_m, p.cluster_n) == along, p
    assert p.grid % p.cluster == 0 and p.grid <= DEVICE_TABLE["h100"].sm_count


def test_rows_start_mid_sector():
    from pyfuser.schedule.tma_rules import rows_start_mid_sector
    assert rows_start_mid_sector((3000, 1032), (1032, 1), 2)          # 2064-byte rows
    assert not rows_start_mid_sector((3000, 1040), (1040, 1), 2)
    # A row pitch padded past the row: the stride decides, not K.
    assert rows_start_mid_sector((3000, 1024), (1032, 1), 2)
    assert not rows_start_mid_sector((3000, 1032), (1040, 1), 2)
    # MN-major (column-major) and batched: every stride but the unit one; size-1 dims aside.
    assert rows_start_mid_sector((1032, 3000), (1, 1032), 2)
    assert rows_start_mid_sector((3, 64, 1024), (64 * 1024 + 8, 1024, 1), 2)
    assert not rows_start_mid_sector((1, 64, 1024), (8, 1024, 1), 2)
    # 4-byte elements: rows of 1032 are 4128 bytes, on sectors; of 1028, 4112, not.
    assert not rows_start_mid_sector((100, 1032), (1032, 1), 4)
    assert rows_start_mid_sector((100, 1028), (1028, 1), 4)


def test_tile_maps_take_the_same_sector_rule():
    """The runtime's L2 promotion of a tile map and the heuristic's rule read one predicate
    (tma_rules.on_sectors); the map also looks at its pointer."""
    from pyfuser.runtime import tensor_map as tm
    mid, on = tm.TILE_L2_PROMOTION_MID_SECTOR, tm.TILE_L2_PROMOTION
    assert tm.tile_l2_promotion(1 << 20, (2064,)) == mid        # K = 1032 bf16 rows
    assert tm.tile_l2_promotion(1 << 20, (2080,)) == on         # K = 1040
    assert tm.tile_l2_promotion((1 << 20) + 16, (2080,)) == mid  # a pointer mid-sector
    assert tm.tile_l2_promotion(1 << 20, (2080, 2080 * 7 + 16)) == mid   # a batch stride


def test_clusters_refuse_split_k():
    p = matmul.MatmulParams(tile_m=128, tile_n=128, stages=2, grid=2, cluster_m=2, split_k=2)
    with pytest.raises(SchedulerError, match="clusters of 2 CTAs along M need no split-K"):
        _cluster_kernel(300, 136, 400, p)


def test_a_b_tile_of_three_boxes_is_not_clustered():
    """B MN-major in 128x192 tiles is three 64-row boxes a stage: no halves to share out."""
    shape = next(c for c in matmul.TILE_CANDIDATES if c.tile_n == 192)
    assert matmul.cluster_choice(shape, "K", "MN", 1, 500, 64, 132, True) == (1, 1)
    assert matmul.cluster_choice(shape, "K", "K", 1, 500, 64, 132, True) == (2, 1)
    # Nor where rows start mid-sector.
    assert matmul.cluster_choice(shape, "K", "MN", 1, 500, 64, 132, None, True) == (1, 1)


def test_clusters_along_both_dims_are_refused():
    p = matmul.MatmulParams(tile_m=128, tile_n=128, stages=2, grid=4, cluster_m=2, cluster_n=2)
    with pytest.raises(SchedulerError, match="clusters along one dim"):
        _cluster_kernel(300, 136, 400, p)


@pytest.mark.parametrize("where", ["in_a_role", "under_a_branch"])
def test_a_cluster_barrier_every_thread_must_reach(where):
    """The cluster kernel's cluster barriers stand outside the warp roles and every branch:
    inside a role or an `if`, the verifier refuses them (the other threads would never come)."""
    from pyfuser.kir.verifier import KernelIRError, verify_kernel
    p = matmul.MatmulParams(tile_m=128, tile_n=128, stages=2, grid=2, cluster_m=2)
    _, _, _, kernel, _ = _cluster_kernel(300, 136, 200, p)
    syncs = [s for s in kernel.body if isinstance(s, K.ClusterSync)]
    assert len(syncs) == 2                  # after the barriers' init, before their teardown
    kernel.body.remove(syncs[0])
    if where == "in_a_role":
        split = next(s for s in K.walk(kernel.body) if isinstance(s, K.RoleSplit))
        split.roles[1].body.append(syncs[0])
        want = "ClusterSync inside the compute role"
    else:
        kernel.body.insert(0, K.IfThenElse(K.eq(K.Special("threadIdx.x"), 0), [syncs[0]]))
        want = "ClusterSync is inside the predicated branch"
    with pytest.raises(KernelIRError, match=want):
        verify_kernel(kernel, after="test")


def test_the_interpreter_hangs_a_cluster_barrier_some_threads_skip():
    from kir_testing import interpret_against_float64
    from pyfuser.runtime.interpreter import InterpreterError
    p = matmul.MatmulParams(tile_m=128, tile_n=128, stages=2, grid=2, cluster_m=2)
    fd, st, p, kernel, inputs = _cluster_kernel(300, 136, 200, p)
    at = next(k for k, s in enumerate(kernel.body) if isinstance(s, K.ClusterSync))
    kernel.body[at] = K.IfThenElse(K.eq(K.Special("blockIdx.x"), 0), [kernel.body[at]])
    with pytest.raises(InterpreterError, match="cluster barrier reached by 0 of 384 threads"):
        interpret_against_float64(fd, st, kernel, inputs, context=p)
