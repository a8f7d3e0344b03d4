"""Matmul scheduler: a persistent, warp-specialized Hopper GEMM (wgmma, TMA tiles, 128-byte
swizzle) for a lone matmul or linear of two 16-bit float matrices.

The kernel (lower/matmul.py builds its loop nest, lower/pipeline.py its warp roles):

    producer warp group (one elected thread):    compute warp groups (tile_m / 64 of them):
      for tile t (persistent: blockIdx.x, += gridDim.x):
        for k block kb:                             for k block kb:
          wait empty[c % S]                           wait full[c % S]
          TMA A box [tile_m, 64] and B box            wgmma m64n{tile_n}k16 x 4 (one per 16 of K)
          [tile_n, 64] into slot c % S                 from the slot, fp32 accumulators
                                                      wait, arrive empty[c % S]
                                                    epilogue: accumulators -> 16-bit, stmatrix
                                                    into 128-byte-swizzled 64x64 staging boxes,
                                                    TMA store (double-buffered per warp group)

with c the stage counter running across tiles (the pipeline never drains between tiles). Tiles
are visited in bands of `raster_group` tile rows (consecutive CTAs share A rows and B columns
in L2). Ragged M, N and K need no predicates: TMA zero-fills the boxes' out-of-bounds elements
and clips the stores.

Taken: one MatmulOp (a [M, K] @ b [K, N]) or LinearOp (x [M, K], w [N, K], a bias [N]) of two
fusion inputs, bf16 or fp16, and the element-wise ops after it (a fused epilogue: bias, GELU,
SiLU, a residual or a row scale read from global memory at each accumulator's row and
column, casts), and up to MAX_OUTPUTS fusion outputs [M, N] of bf16, fp16 or fp32 computed by
them (a pre-activation beside its activation: each output its own staging boxes and TMA
store; an fp32 one through 8-byte shared stores and two boxes of 64 x 32 per 64 x 64). Refused
by the heuristic (the op then runs as torch.matmul, a library segment): strides or pointers
TMA cannot take (a row not a multiple of 16 bytes: K, or M of an MN-major A, or N, not a
multiple of 8; neither dim of an operand of stride 1), K = 0, a device that is not Hopper. A
may be K-major (x [M, K]) or MN-major (a column-major A, x.t() of a row-major [K, M]: boxes of
64 M x 64 K, read by wgmma with imm-trans-a); B K-major (w [N, K], or b = w.t()) or MN-major
(b row-major [K, N]: boxes of 64 N x 64 K, imm-trans-b). A's M dim may be a broadcast
(fd.from_pytorch of a [1, K] row); other broadcast operand dims are refused by can_schedule.
Not built yet (issues 20 and 21): a batch broadcast against another (an operand with fewer
batch dims than the output, other than a shared 2-D one), clusters of more than 2 CTAs chosen by the heuristic (4 along M run: slower where measured),
stream-K with ping-pong tiles or clusters. Split-K is built (MatmulParams.split_k) and
chosen only when the feature matmul_split_k asks. Stream-K (MatmulParams.stream_k: the last
waves' tiles cut into runs of k blocks, the same count for every SM's CTA) is chosen where the
best data-parallel kernel leaves SMs idle and K is long (STREAM_K_TILES, stream_k_us). Batches (operands of up to MAX_BATCH_DIMS
batch dims, [batch dims.., rows, cols], each dim of any stride TMA takes; a 2-D operand shared
by every batch) go through tensor maps of 3 to 5 dims, the batch the tile index's outermost
part.

The tile and kind (cooperative 128x256 or 128x192, ping-pong 128x128 or 128x64) minimize a
cost model measured on the H200 (`estimated_us`): waves of tiles over the CTAs' compute roles,
each tile's k blocks at the measured rate for few or most SMs busy or one ping-pong tile per
CTA (the smaller tiles are bound by L2 -> SM traffic), plus fixed costs per tile and per
launch, plus a fused epilogue's work, exposed per tile in a cooperative kernel and hidden under
the other role's MMAs in ping-pong (two stored outputs: ping-pong; 128x64 ping-pong tiles where
they are one per CTA). The feature matmul_pingpong forces the kind. Cooperative 128x256 tiles
over at least a wave of the SMs and 16 k blocks (K > 960) run in clusters of 2 CTAs along M,
the B tile the two share loaded half by each and multicast to both; where operand rows start
mid-sector (K = 8 mod 16 in 16-bit elements: two L2 requests per box row), every cooperative
tile of 16 k blocks does, and ping-pong 128x64 tiles run in clusters along N, A shared
(cluster_choice; the feature matmul_cluster forces it on or off).
"""
from __future__ import annotations

import dataclasses
import math

from ...ir.dtype import DataType
from ...ir.exprs import (BinaryOp, BroadcastOp, ExpandOp, LinearOp, LoadKind, LoadStoreOp,
                         MatmulOp, UnaryOp, WhereOp)
from ...ir.id_graph import IdGraph
from ...ir.iter_domain import ParallelType as PT
from ...ir.tensor import MemoryType, TensorView, WarpSpecialized
from ..cache import cache_after
from ..circular_buffer import circular_buffer
from ..tma_rules import MAX_BATCH_DIMS, check_tile_box, rows_start_mid_sector
from .base import RuntimeInfo, SchedulerError

NAME = "matmul"          # offered the fusions with a matmul alone (op_support.DEDICATED_OPS)

MMA_DTYPES = (DataType.BFloat16, DataType.Half)
# The wgmma's and the swizzle's facts (kir.nodes.WGMMA_M, SWIZZLED_ROW_16BIT; tests pin them
# equal), not imported: a new process whose kernels come from the disk cache imports no
# kernel IR (tests/runtime/test_plan_cache.py).
WARP_GROUP_ROWS = 64     # rows of one wgmma: a compute warp group's slice of a tile
TILE_K = 64              # K elements of one box row: the 128-byte swizzle span of 16-bit data
EPILOGUE_BOX = 64        # the staging box: 64 x 64 elements (rows of 128 bytes)


@dataclasses.dataclass(frozen=True)
class TileShape:
    """A tile the heuristic may choose, with its measured cost: microseconds per 64-deep k block
    of one tile, with most SMs busy (`busy_us`: the L2 shared by every SM) and with at most half
    of them busy (`alone_us`); ping-pong's busy figure is a role's, the other role computing
    beside it. Measured on an H200 (tools/sweep_matmul.py, bench/results/2026-11-28/
    h200-sweep-matmul-tiles.txt); the per-k-block time of the smaller tiles is set by the
    L2 -> SM traffic, not by their flops."""

    tile_m: int
    tile_n: int
    compute_roles: int
    busy_us: float
    alone_us: float
    # Ping-pong with one tile per CTA over most SMs: a role alone, the L2 shared (by default
    # cooperative 128x128's busy figure).
    one_tile_us: float = 0.507


# A 64-row tile (one compute warp group) is not offered: with 256 threads the entry register
# count (248) is above what the compute role may ask (240), so the warp roles' split fails.
TILE_CANDIDATES = (
    TileShape(128, 256, 1, busy_us=0.82, alone_us=0.55),
    # Every box of its epilogue staged (fitted_params) took 9-10% off its time per k block
    # without an epilogue: 0.56-0.59 us at 8192^3 and 4096x14336x5120, 0.72-0.74 of 128x256's
    # (h200-sweep-staging-boxes.txt); with bias + GELU at 8192x16384x4096 0.64 us, 1.897 ms
    # against 128x256's 1.836 in an earlier call (h200-matmul-session15.txt). The larger is
    # kept: 128x256 stays where both tile the GPU alike.
    TileShape(128, 192, 1, busy_us=0.64, alone_us=0.48),
    TileShape(128, 128, 2, busy_us=0.876, alone_us=0.35),
    # Ping-pong 128x64 where its tiles are one per CTA: twice the CTAs of 128x128 tiles, each
    # fetching 24 KB a k block instead of 32 (the L2 -> SM traffic sets these tiles' rate).
    # H200, us per k block from tools/sweep_matmul.py (h200-matmul-clusters-n-session29.txt,
    # less 8 us of fixed costs): 0.19 at 1024^3 and 0.22 at 1024x1024x2048 (11.1 and 14.9 us
    # against 128x128 ping-pong's 12.8 and 17.9), but 0.51 with two tiles per CTA at
    # 2048x1024x4096 (40.6 us against 128x128's 29.8): busy_us keeps it out there.
    TileShape(128, 64, 2, busy_us=0.55, alone_us=0.21, one_tile_us=0.21),
)
# Per tile: the pipeline's fill and the epilogue; per launch: the launch and the first loads.
TILE_OVERHEAD_US = 3.0
LAUNCH_OVERHEAD_US = 5.0


# Split-K (MatmulParams.split_k): every CTA of a tile stores its fp32 partial (the tile's valid
# rows) and the last one reads them all back, through L2 at about SPLIT_K_BYTES_PER_US per SM
# (an estimate), after a fixed cost (fences, the arrival counter, the barriers) and a cost per
# split fitted on the H200 (tools/sweep_matmul.py --split, 64x4096x4096, tile 128x256:
# 44.4, 35.9, 34.5, 42.9 us at 1, 2, 4, 8 splits, against 43 and 26, 17, 15 us for the k blocks
# alone: the operand streamed from DRAM at about 1-1.5 TB/s whatever the number of CTAs, the
# cause not found; bench/results/2026-11-29/h200-sweep-split-k.txt). Split-K is measured
# faster than the unsplit kernel on few-row shapes, but slower than cuBLAS there (0.70-0.73)
# and than the unsplit ping-pong tile elsewhere: the heuristic splits only when the feature
# matmul_split_k asks.
SPLIT_K_FIXED_US = 2.0
SPLIT_K_PER_SPLIT_US = 3.5
SPLIT_K_BYTES_PER_US = 100e3
MAX_SPLIT_K = 16
MIN_SPLIT_K_BLOCKS = 2   # k blocks per split at least: fewer is all pipeline fill


# A fused epilogue's work beyond a bare matmul's store, per 128x256 tile (scaled by the tile's
# elements): its ops (EPILOGUE_OPS_US, once there are any) and each stored output after the
# first (EPILOGUE_OUTPUT_US). A cooperative kernel's compute warp groups run it with the
# tensor cores idle; ping-pong runs it under the other role's MMAs, exposed only where it
# outlasts the tile's k loop. Fitted to the H200 (bench/results/2026-11-29/
# h200-bench-issue21-epilogue-kinds.txt, 8192x16384x4096 and 4096x14336x5120): with bias+GELU
# or a residual cooperative measured 2-4% faster, with the pre-activation stored beside its
# GELU ping-pong 3-4% faster.
EPILOGUE_OPS_US = 1.5
EPILOGUE_OUTPUT_US = 3.5


def epilogue_us(shape: TileShape, ops: bool, outputs: int) -> float:
    """The epilogue work of one tile of `shape` beyond a bare store (EPILOGUE_OPS_US)."""
    per_tile = (EPILOGUE_OPS_US if ops else 0.0) + EPILOGUE_OUTPUT_US * max(0, outputs - 1)
    return per_tile * shape.tile_m * shape.tile_n / (128 * 256)


def estimated_us(shape: TileShape, tiles: int, k_blocks: int, sms: int, split_k: int = 1,
                 rows: int | None = None, epilogue: float = 0.0) -> float:
    """The cost model the heuristic minimizes: waves of work units (a tile, or with split-K
    one of its `split_k` shares of K) over the persistent CTAs' compute roles, each unit its k
    blocks at the rate of how many SMs are busy, plus fixed costs; with split-K, the partials
    of `rows` valid rows of each tile stored and summed; `epilogue` (epilogue_us) exposed per
    tile in a cooperative kernel, in ping-pong only beyond the tile's k loop."""
    units = tiles * split_k
    k_blocks = -(-k_blocks // split_k)
    slots = sms * shape.compute_roles
    waves = -(-units // slots)
    if min(units, sms) <= sms // 2:
        per_block = shape.alone_us
    elif shape.compute_roles > 1 and units <= sms:
        per_block = shape.one_tile_us
    else:
        per_block = shape.busy_us
    mainloop = k_blocks * per_block
    exposed = epilogue if shape.compute_roles == 1 else max(0.0, epilogue - mainloop)
    us = waves * (mainloop + TILE_OVERHEAD_US + exposed) + LAUNCH_OVERHEAD_US
    if split_k > 1:
        partial = min(rows or shape.tile_m, shape.tile_m) * shape.tile_n * 4
        us += (SPLIT_K_FIXED_US + SPLIT_K_PER_SPLIT_US * split_k
               + (1 + split_k) * partial / SPLIT_K_BYTES_PER_US)
    return us


# Stream-K (MatmulParams.stream_k): every CTA of the grid takes the same count of k blocks of
# the last waves' tiles; a tile's runs store fp32 partials that its first run's CTA (at the end
# of its own work) waits for and adds. Fitted on the H200 (tools/sweep_matmul.py --stream,
# bench/results/2026-12-01/h200-stream-k-session34.txt), us: a fixed STREAM_K_FIXED_US (the
# launch, the pipeline's fill, the last tile's epilogue and the fixup's wait), each CTA's k
# blocks at the tile's busy rate, and the partials read back by a tile's first CTA; offered
# where the best data-parallel kernel leaves SMs idle (tiles for at most STREAM_K_MAX_BUSY of
# them) and K is long, and measured faster there: 768x768x8192 36.8 -> 33.1 (cuBLAS 26.2),
# 512x1024x8192 36.3 -> 27.7 (cuBLAS 22.8), 256x256x16384 63.5 -> 24.3 (cuBLAS 15.7); slower
# where the tiles fill most SMs (1536x1536x4096 96 tiles of 128x192: 37.0 -> 45.8; 1000^3,
# 2304x2304x2048, 4096^3) or K is 4096 (300x4096x4096).
STREAM_K_TILES = (
    TileShape(128, 256, 1, busy_us=0.82, alone_us=0.55),
    TileShape(128, 192, 1, busy_us=0.64, alone_us=0.48),
    # Cooperative 128x128 and 128x64 tiles are offered for stream-K alone (ping-pong wins where
    # the tiles run whole); us per k block fitted from their stream-K runs (128x128: 47.8 us at
    # 1536x1536x4096 for 70 blocks a CTA; 128x64: 24.3 us at 256x256x16384, 18 blocks a CTA).
    TileShape(128, 128, 1, busy_us=0.50, alone_us=0.35),
    TileShape(128, 64, 1, busy_us=0.45, alone_us=0.21),
)
STREAM_K_FIXED_US = 13.0
STREAM_K_BYTES_PER_US = 150e3
STREAM_K_MAX_BUSY = 0.6
# ... and only for K of 128 blocks or more: with 64 (K = 4096) measured slower than the best
# data-parallel kernel even under 0.6 of the SMs busy (300x4096x4096: 33.3 us against ping-pong
# 128x128's 29.8), and 768x768x8192 and 512x1024x8192 (128 blocks) faster.
STREAM_K_MIN_K_BLOCKS = 128
MIN_STREAM_K_BLOCKS = 4  # k blocks per CTA at least: fewer CTAs take the work


def stream_k_width(tiles: int, k_blocks: int, sms: int, max_ctas: int) -> tuple[int, int]:
    """(data-parallel tiles, k blocks per CTA of the stream-K part): lower/matmul.py
    stream_k_units' partition over `sms` CTAs, a tile over at most `max_ctas` of them."""
    dp = max(tiles // sms - 1, 0) * sms
    blocks = (tiles - dp) * k_blocks
    return dp, max(-(-blocks // sms), -(-k_blocks // (max_ctas - 1)))


def stream_k_choice(shape: TileShape, tiles: int, k_blocks: int, sms: int) -> int:
    """The CTAs per tile (MatmulParams.stream_k) of a stream-K kernel of `tiles` tiles of the
    cooperative `shape` over `sms` CTAs (0 for ping-pong tiles): each CTA takes at least
    MIN_STREAM_K_BLOCKS k blocks, a tile spreads over at most MAX_SPLIT_K CTAs."""
    if shape.compute_roles != 1:
        return 0
    _, width = stream_k_width(tiles, k_blocks, sms, MAX_SPLIT_K)
    return -(-k_blocks // max(width, MIN_STREAM_K_BLOCKS)) + 1


def stream_k_us(shape: TileShape, tiles: int, k_blocks: int, sms: int, max_ctas: int,
                rows: int | None = None, epilogue: float = 0.0) -> float:
    """The estimated time of a stream-K kernel (stream_k_width's partition): the data-parallel
    waves, then each CTA's k blocks at the busy rate, the partials of a tile's other CTAs read
    back, a tile's epilogue, and STREAM_K_FIXED_US."""
    dp, width = stream_k_width(tiles, k_blocks, sms, max_ctas)
    partial = shape.tile_m * shape.tile_n * 4
    ctas = min(max_ctas, -(-k_blocks // width) + 1)
    per_tile = k_blocks * shape.busy_us + TILE_OVERHEAD_US + epilogue
    return (dp // sms * per_tile + width * shape.busy_us + epilogue
            + (ctas - 1) * partial / STREAM_K_BYTES_PER_US + STREAM_K_FIXED_US)


def split_k_choices(shape: TileShape, tiles: int, k_blocks: int, sms: int,
                    forced: bool | None) -> tuple:
    """The split-K factors offered for `tiles` tiles of `shape`: 1, and where the feature
    matmul_split_k asks (`forced` True; unset or off: 1 alone, see SPLIT_K_PER_SPLIT_US), the
    factors whose units fit one wave of the compute roles, each split at least
    MIN_SPLIT_K_BLOCKS k blocks (share s takes blocks s, s + S, ...: none is empty while
    S <= k blocks), those alone where there are any."""
    if not forced:
        return (1,)
    slots = sms * shape.compute_roles
    split = []
    for s in range(2, min(MAX_SPLIT_K, k_blocks) + 1):
        if tiles * s > slots or k_blocks // s < MIN_SPLIT_K_BLOCKS:
            continue
        split.append(s)
    return tuple(split) or (1,)


# Clusters of 2 CTAs along M, B multicast (MatmulParams.cluster_m), on the H200
# (tools/sweep_matmul.py --cluster=1,2, bench/results/2026-11-30/
# h200-matmul-clusters-session29.txt; cuBLAS in the same run): cooperative 128x256 tiles
# 208 -> 200 us at 4096^3 and 1690 -> 1646 at 8192^3 with the grid of 132 CTAs, and 195 and
# 1596 us with 128 (64 clusters fit at once, not 66: the executor fits the grid); 128x128
# tiles (ping-pong or cooperative) no faster or slower (1000^3 ping-pong 13.6 -> 13.7,
# cooperative 13.7 -> 14.8). A cluster's two CTAs wait for each other's releases, so it is
# taken where the tiles fill at least one wave of the SMs, and where a tile has K blocks
# enough: over 8192 x 8192 (h200-matmul-clusters-k-session29.txt), K = 64 and 128 (1 and 2
# blocks) measured 193 and 366 TFLOP/s with clusters against 202 and 379 without, K = 256-1024
# 1-4% faster with them; 4096 x 4096 x 256 and x 512 2% slower; every shape of K >= 1024
# measured faster (the issue-20 bar shapes 1.00-1.05 of cuBLAS with them, 0.94-1.01 without,
# h200-matmul-clusters-session29.txt).
#
# Operand rows that start mid-sector (tma_rules.rows_start_mid_sector: bf16 K = 8 mod 16) take
# two L2 requests per 128-byte box row, and the k loop is bound by the L2's requests: there the
# multicast pays on more shapes (tools/sweep_matmul.py --cluster=1,m2,m4,n2, H200, cuBLAS in
# the same rounds, bench/results/2026-12-01/h200-matmul-mid-sector-session33.txt), us:
# 3000x2056x1032 128x192 33.2 -> 28.6 along M (4 CTAs: 35.2), 128x256 38.5 -> 34.0;
# 2048x2048x1000 (128 tiles of 128x256, under a wave) 21.6 -> 19.9; 4096x4096x4104 128x192
# 282 -> 242. Rows on sectors: 3000x2056x1040 128x192 26.6 -> 27.5, so there only 128x256 over a
# wave. Ping-pong 128x64 tiles along N (A shared): 1000^3 13.6 -> 12.4 (along M 13.3),
# 512x2048x1000 13.8 -> 12.8 (along M 13.7), but on sectors 1024^3 11.1 -> 12.2 and
# 1024x1024x2048 14.9 -> 16.6; ping-pong 128x128 no faster either way (1000^3 13.3 -> 13.8
# along M, 14.0 along N).
CLUSTER_TILE_N = 256
CLUSTER_SIZE = 2
CLUSTER_MIN_K_BLOCKS = 16


def shared_units(tile_rows: int, major: str) -> int:
    """What a cluster shares out of an operand's tile of `tile_rows` rows (B's tile_n along M,
    A's tile_m along N): its rows, K-major (one box each CTA's share), or its 64-row boxes,
    MN-major (whole boxes each)."""
    return tile_rows // (EPILOGUE_BOX if major == "MN" else 1)


def cluster_choice(shape: TileShape, a_major: str, b_major: str, split_k: int, tiles: int,
                   k_blocks: int, sms: int, forced: bool | None,
                   mid_sector: bool = False) -> tuple[int, int]:
    """(CTAs per cluster along M, along N) for `tiles` tiles of `shape` with `k_blocks` 64-deep
    K blocks, without split-K and over CLUSTER_MIN_K_BLOCKS (see CLUSTER_TILE_N): along M for
    cooperative tiles of CLUSTER_TILE_N columns over at least one wave, or any cooperative tile
    where operand rows start mid-sector (`mid_sector`); along N for ping-pong tiles of 64
    columns where rows start mid-sector. The feature matmul_cluster forces it (on: along M
    wherever B splits in two, without split-K)."""
    b_splits = shared_units(shape.tile_n, b_major) % CLUSTER_SIZE == 0
    if forced is False or split_k != 1 or tiles < CLUSTER_SIZE:
        return 1, 1
    if forced:
        return (CLUSTER_SIZE, 1) if b_splits else (1, 1)
    if k_blocks < CLUSTER_MIN_K_BLOCKS:
        return 1, 1
    if shape.compute_roles == 1:
        wide = shape.tile_n == CLUSTER_TILE_N and tiles >= sms
        return (CLUSTER_SIZE, 1) if b_splits and (wide or mid_sector) else (1, 1)
    a_splits = shared_units(shape.tile_m, a_major) % CLUSTER_SIZE == 0
    return (1, CLUSTER_SIZE) if mid_sector and shape.tile_n == 64 and a_splits else (1, 1)


# Matmuls of at most this many rows run torch's matmul unless the feature matmul_few_rows
# asks for the kernel (tools/sweep_matmul.py: 0.63-0.64 of cuBLAS at 1 and 64 rows).
FEW_ROWS = 64
# Stages a cooperative tile keeps when it stages every box of its epilogue (fitted_params):
# with 3 the mainloop lost more than the epilogue gained (128x256 on the H200).
MIN_STAGES_BESIDE_STAGING = 4
SMEM_SLACK = 1024        # the dynamic shared memory's base aligned to 1024 bytes by hand
# Stages fitted_params gives a tile at most (cuBLAS's 128x64 kernel at 1000^3 keeps 8: not
# measured here; tools/sweep_matmul.py --stages forces other counts).
MAX_STAGES = 6


@dataclasses.dataclass(frozen=True)
class MatmulParams:
    tile_m: int = 128            # rows of C per tile: 64 per compute warp group
    tile_n: int = 256            # columns of C per tile: the wgmma's n
    stages: int = 4              # circular-buffer slots of the A and B boxes
    raster_group: int = 8        # tile rows per band of the persistent tile order
    grid: int = 132              # persistent CTAs
    producer_registers: int = 40
    b_major: str = "K"           # "MN": B's N dim is its stride-1 dim (a row-major [K, N])
    a_major: str = "K"           # "MN": A's M dim is its stride-1 dim (a column-major [M, K])
    # 1: cooperative (the compute warp groups split each tile's rows); 2: ping-pong (two compute
    # roles of one warp group each take whole tiles in turn, one's epilogue under the other's
    # MMAs: lower/pipeline.py's compute roles).
    compute_roles: int = 1
    # The element bytes of each fusion output the epilogue stores (MAX_OUTPUTS at most: a
    # 16-bit one 2, an fp32 one 4), each through its own staging boxes.
    output_bytes: tuple = (2,)
    # CTAs per output tile, each over ceil(k blocks / split_k) of K's 64-deep blocks; the last
    # of them to finish adds the fp32 partials in split order and runs the epilogue
    # (lower/matmul.py, kir SplitKReduce).
    split_k: int = 1
    # 64x64 staging boxes of the epilogue per compute warp group, a divisor of the boxes it
    # stores per tile (`boxes_per_tile`: box j of every tile is then box j % staging_boxes);
    # a box is written again once the TMA store of the one before it has read it. 0: 2 when
    # the tile's count is even, else 1.
    epilogue_boxes: int = 0
    # CTAs of a thread-block cluster along M (1: no cluster): they take the tiles of C
    # consecutive tile rows of one tile column at once, each loading its A rows and 1/C of the
    # shared B box, multicast to all C (lower/matmul.py); the grid is a multiple of C.
    cluster_m: int = 1
    # The same along N: C tiles of one tile row at once, A shared out (at most one of the two
    # above 1).
    cluster_n: int = 1
    # The fusion input (its position; -1: none) of the output's shape that the epilogue reads
    # through the staging boxes (a residual): a TMA box of it lands in the box the output is
    # then stored from, and each thread reads its fragment's values with ldmatrix at its
    # stmatrix addresses (lower/matmul.py), instead of one 2-byte global load per element.
    staged_input: int = -1
    # Stream-K (0: off): the tiles of the last waves' worth are cut into runs of k blocks,
    # the same count per CTA, a tile's runs spread over at most `stream_k` CTAs (>= 2) whose
    # fp32 partials its first run's CTA adds in k order (lower/matmul.py stream_k_units, kir
    # SplitKReduce); the waves before run whole tiles. Cooperative tiles alone, without
    # split-K, clusters or a staged input.
    stream_k: int = 0

    @property
    def outputs(self) -> int:
        """Fusion outputs the epilogue stores."""
        return len(self.output_bytes)

    @property
    def warp_groups_per_role(self) -> int:
        return self.tile_m // WARP_GROUP_ROWS if self.compute_roles == 1 else 1

    @property
    def compute_warp_groups(self) -> int:
        return self.warp_groups_per_role * self.compute_roles

    @property
    def accumulators(self) -> int:
        """fp32 accumulator registers per compute thread."""
        return self.tile_m // WARP_GROUP_ROWS // self.warp_groups_per_role * self.tile_n // 2

    @property
    def boxes_per_tile(self) -> int:
        """64x64 boxes of each stored output a compute warp group stores per tile."""
        return self.tile_n // EPILOGUE_BOX * (self.tile_m // WARP_GROUP_ROWS
                                              // self.warp_groups_per_role)

    @property
    def staging_boxes(self) -> int:
        """64x64 staging boxes of the epilogue per compute warp group (epilogue_boxes, or by
        default 2, double-buffered, when a tile's boxes are even in number, else 1)."""
        if self.epilogue_boxes:
            return self.epilogue_boxes
        return 2 if self.boxes_per_tile % 2 == 0 else 1

    def describe(self) -> str:
        kind = ("ping-pong: 2 compute warp groups taking tiles in turn" if self.compute_roles > 1
                else f"cooperative: {self.compute_warp_groups} compute warp group(s)")
        a = "A MN-major, " if self.a_major == "MN" else ""
        return (f"matmul: tile {self.tile_m}x{self.tile_n}x{TILE_K}, {a}B {self.b_major}-major, "
                f"{self.stages} stages, {kind} + 1 producer, persistent grid "
                f"{self.grid}, raster bands of {self.raster_group} tile rows, "
                f"{self.staging_boxes} of {self.boxes_per_tile} epilogue boxes staged"
                + (f", {self.outputs} outputs stored" if self.outputs > 1 else "")
                + (f", split-K over {self.split_k} CTAs per tile" if self.split_k > 1 else "")
                + (f", stream-K (a tile over at most {self.stream_k} CTAs)" if self.stream_k
                   else "")
                + (f", clusters of {self.cluster_m} CTAs along M sharing B (multicast)"
                   if self.cluster_m > 1 else "")
                + (f", clusters of {self.cluster_n} CTAs along N sharing A (multicast)"
                   if self.cluster_n > 1 else "")
                + (f", input {self.staged_input} read through the staging boxes"
                   if self.staged_input >= 0 else ""))

    @property
    def cluster(self) -> int:
        """CTAs per thread-block cluster (along M or N)."""
        return self.cluster_m * self.cluster_n


@dataclasses.dataclass(frozen=True)
class MatmulOperands:
    """What lowering needs of the scheduled matmul (fusion.mma): the operands' shared caches,
    the matmul's output, the fused epilogue, and each operand's dims (M or N rows, K along a
    row)."""

    params: MatmulParams
    a: TensorView                # shared cache of A, rows M
    b: TensorView                # shared cache of B, rows N
    out: TensorView              # the matmul's own output (its dtype: the rounding it defines)
    a_dims: tuple                # (row dim, K dim, batch dims) of A's global input
    b_dims: tuple                # (row dim, K dim, batch dims) of B's global input
    op: object                   # the MatmulOp / LinearOp (a linear's bias: its third input)
    finals: tuple                # the fusion outputs the kernel stores, in the fusion's order
    # The element-wise ops of the epilogue, in order, computed on each accumulator before the
    # store.
    epilogue: tuple = ()
    # Each fusion input the epilogue reads (and a linear's bias): its logical dims' roles,
    # "m", "n", ("b", d) (the output's batch dim d), or None (a broadcast: index 0).
    input_dims: tuple = ()


def _matmul_op(fusion):
    ops = [e for e in fusion.exprs() if isinstance(e, (MatmulOp, LinearOp))]
    return ops[0] if len(ops) == 1 else None


def _operand_dims(op) -> tuple[tuple, tuple]:
    """((A's M dim, K dim, batch dims), (B's N dim, K dim, batch dims)) in the operands'
    logical dims; the batch dims (outermost first) are those before the matrix's, () for a
    2-D operand (shared by every batch)."""
    ra = len(op.inputs[0].domain.logical)
    a = (ra - 2, ra - 1, tuple(range(ra - 2)))
    if isinstance(op, LinearOp):
        return a, (0, 1, ())
    rb = len(op.inputs[1].domain.logical)
    return a, (rb - 1, rb - 2, tuple(range(rb - 2)))


# Ops a fused epilogue computes on each accumulator (element-wise, and views of inputs).
_EPILOGUE = (UnaryOp, BinaryOp, WhereOp, LoadStoreOp, BroadcastOp, ExpandOp)


# What the epilogue stores: 16-bit boxes through stmatrix, fp32 ones (each 64 x 64 box as two
# of 64 x 32) through 8-byte shared stores.
STORED_DTYPES = (*MMA_DTYPES, DataType.Float)
# Fusion outputs one kernel stores (a pre-activation and its activation): each takes its own
# staging boxes from the shared memory of the stages.
MAX_OUTPUTS = 2


def _epilogue(fusion, op) -> tuple[list, tuple, str]:
    """(the epilogue's exprs in order, the outputs the kernel stores, why not: "" if fine)."""
    out = op.outputs[0]
    exprs = [e for e in fusion.exprs() if e is not op and
             any(isinstance(o, TensorView) for o in e.outputs)]
    for e in exprs:
        if not isinstance(e, _EPILOGUE) or (isinstance(e, LoadStoreOp)
                                             and e.load_kind != LoadKind.Set):
            return [], None, f"{type(e).__name__} after the matmul (the epilogue is element-wise)"
        if any(v in op.inputs[:2] for v in e.inputs):
            return [], None, "an epilogue op reads the matmul's operands"
    outs = [o for o in fusion.outputs if isinstance(o, TensorView)]
    if not 1 <= len(outs) <= MAX_OUTPUTS:
        return [], (), f"{len(outs)} outputs (the kernel stores up to {MAX_OUTPUTS})"
    if any(o in fusion.inputs for o in outs):
        return [], (), "an output that is a fusion input (nothing for the kernel to compute)"
    if out not in outs and not exprs:
        return [], (), "the matmul's result is not the fusion's output"
    graph = IdGraph(fusion)
    mn = [i for i in out.domain.logical if not i.is_broadcast]
    # In the order of the exprs (a set's order, by id, named another tensor in each process).
    for t in dict.fromkeys(v for e in exprs for v in [*e.inputs, *e.outputs]
                           if isinstance(v, TensorView)):
        for i in t.domain.logical:
            if not i.is_broadcast and not any(graph.mapped(i, j) for j in mn):
                return [], None, (f"T{t.name}'s dim {i!r} is none of the matmul's output dims "
                                  "(the epilogue is element-wise over the output)")
    for final in outs:
        if final is out:
            continue
        fm = [i for i in final.domain.logical if not i.is_broadcast]
        if len(fm) != len(mn) or not all(graph.mapped(i, j) for i, j in zip(fm, mn)):
            return [], (), f"the stored output T{final.name} is not the matmul's [(batch,) M, N]"
        if final.dtype not in STORED_DTYPES:
            return [], (), (f"the stored output T{final.name} is {final.dtype.short_name} (the "
                            "epilogue stores bf16, fp16 or fp32 boxes)")
    return exprs, tuple(outs), ""


def can_schedule(fusion) -> tuple[bool, str]:
    op = _matmul_op(fusion)
    if op is None:
        return False, "no single matmul"
    a, b = op.inputs[0], op.inputs[1]
    out = op.outputs[0]
    epilogue, finals, why = _epilogue(fusion, op)
    if why:
        return False, why
    for name, t in (("a", a), ("b", b)):
        if t not in fusion.inputs:
            return False, f"operand {name} is not a fusion input"
        rank = len(t.domain.logical)
        if not 2 <= rank <= 2 + MAX_BATCH_DIMS:
            return False, (f"operand {name} has {rank} dims (the kernel takes matrices and "
                           f"batches of them: 2 to {2 + MAX_BATCH_DIMS} dims)")
        if rank not in (2, len(out.domain.logical)):
            return False, (f"operand {name}'s {rank - 2} batch dims against the output's "
                           f"{len(out.domain.logical) - 2} (a batch broadcast is not built)")
        if t.dtype not in MMA_DTYPES:
            return False, f"operand {name} is {t.dtype.short_name}, not bf16 or fp16"
    if a.dtype != b.dtype or out.dtype != a.dtype:
        return False, "operands and output of different dtypes"
    (am, _, _), _ = _operand_dims(op)
    # A's M dim may be a broadcast (fd.from_pytorch of a [1, K] row: a decode step's M = 1): its
    # map has one row. Any other broadcast dim (K, N, a batch) is refused.
    if any(i.is_broadcast for t in (a, b) for d, i in enumerate(t.domain.logical)
           if not (t is a and d == am)):
        return False, "an operand with a broadcast dim other than A's M"
    if any(len(fusion.uses_of(t)) != 1 for t in (a, b)):
        return False, "an operand read by another op too"
    what = "a batched matmul" if len(out.domain.logical) > 2 else "a 2-D matmul"
    if epilogue:
        stored = f", {len(finals)} outputs stored" if len(finals) > 1 else ""
        return True, (f"{what} of 16-bit floats and {len(epilogue)} element-wise op(s) fused"
                      f"{stored}: wgmma with TMA tiles, the ops on the accumulators")
    return True, f"{what} of 16-bit floats: wgmma with TMA tiles"


def _tiles(m: int, n: int, tm: int, tn: int) -> int:
    return -(-m // tm) * -(-n // tn)


def compute_heuristics(fusion, info: RuntimeInfo) -> MatmulParams:
    dev = info.device
    if dev.major != 9:
        raise SchedulerError(f"matmul: wgmma is a Hopper (sm_90) instruction; {dev.name} is "
                             f"sm_{dev.major}{dev.minor}")
    op = _matmul_op(fusion)
    (am, ak, ab), (bn, bk, bb) = _operand_dims(op)
    a, b = op.inputs[0], op.inputs[1]
    fa, fb = info.inputs[fusion.input_position(a)], info.inputs[fusion.input_position(b)]
    m, k = fa.sizes[am], fa.sizes[ak]
    n = fb.sizes[bn]
    if k == 0:
        raise SchedulerError("matmul: K = 0 (nothing to accumulate; torch gives zeros)")
    batches = {tuple(f.sizes[d] for d in dims) for f, dims in ((fa, ab), (fb, bb)) if dims}
    if len(batches) > 1:
        raise SchedulerError(f"matmul: batches of {sorted(batches)} matrices (a batch broadcast "
                             "against another is not built)")
    batch_sizes = batches.pop() if batches else ()
    batch = math.prod(batch_sizes)
    # The layout rules (strides, alignment, extents) do not depend on a box's rows, which the
    # tile chosen below sets (any legal count stands in here; the executor checks the kernel's
    # own maps before each new signature's launch).
    # A K-major (rows of K elements) or MN-major (a column-major [M, K]: x.t() of a row-major
    # [K, M]), whichever of its dims has stride 1.
    a_major = "MN" if fa.strides[am] == 1 and fa.strides[ak] != 1 and fa.sizes[am] > 1 else "K"
    inner, outer = (am, ak) if a_major == "MN" else (ak, am)
    why = check_tile_box(list(fa.sizes), list(fa.strides), fa.alignment, a.dtype.size,
                         inner=inner, outer=outer, box_cols=TILE_K, box_rows=WARP_GROUP_ROWS,
                         swizzle=128, batch=ab)
    if why:
        raise SchedulerError(f"matmul: operand a cannot be read with TMA tiles ({a_major}-major): "
                             + "; ".join(why))
    # B K-major (rows of K elements: a Linear's weight) or MN-major (rows of N: a row-major
    # [K, N]), whichever of its dims has stride 1.
    b_major = "MN" if fb.strides[bn] == 1 and fb.strides[bk] != 1 and fb.sizes[bn] > 1 else "K"
    inner, outer = (bn, bk) if b_major == "MN" else (bk, bn)
    why = check_tile_box(list(fb.sizes), list(fb.strides), fb.alignment, b.dtype.size,
                         inner=inner, outer=outer, box_cols=TILE_K, box_rows=WARP_GROUP_ROWS,
                         swizzle=128, batch=bb)
    if why:
        raise SchedulerError(f"matmul: operand b cannot be read with TMA tiles ({b_major}-major): "
                             + "; ".join(why))
    if (n * a.dtype.size) % 16:
        raise SchedulerError(f"matmul: the output's rows of N = {n} elements are not a multiple "
                             "of 16 bytes (the TMA store needs it)")
    if m <= FEW_ROWS and not info.feature("matmul_few_rows"):
        raise SchedulerError(
            f"matmul: M = {m} rows fill at most half of a 128-row tile: torch's matmul (cuBLAS) "
            f"is faster there until split-K is built (the kernel measured 0.63-0.64 of it at 1 "
            f"and 64 rows on the H200); the feature matmul_few_rows forces the kernel")
    sms = dev.sm_count
    # The tile and kind with the least estimated time; the feature matmul_pingpong forces
    # ping-pong (on) or cooperative (off) tiles.
    pingpong = info.feature("matmul_pingpong")
    offered = [c for c in TILE_CANDIDATES
               if pingpong is None or (c.compute_roles > 1) == pingpong]
    k_blocks = -(-k // TILE_K)

    def tiles_of(c: TileShape) -> int:
        return batch * _tiles(m, n, c.tile_m, c.tile_n)
    # Each tile with each split-K factor offered for it (the feature matmul_split_k forces
    # splitting on or off).
    forced_split = info.feature("matmul_split_k")
    choices = [(c, s, 0) for c in offered
               for s in split_k_choices(c, tiles_of(c), k_blocks, sms, forced_split)]
    # Stream-K's tiles where the best of those leaves SMs idle (or the feature matmul_stream_k
    # forces it: then alone; forced off: never).
    forced_stream = info.feature("matmul_stream_k")
    if forced_stream or (forced_stream is None and pingpong is not True and not forced_split
                         and k_blocks >= STREAM_K_MIN_K_BLOCKS):
        streamed = [(c, 1, sk) for c in STREAM_K_TILES
                    for sk in [stream_k_choice(c, tiles_of(c), k_blocks, sms)] if sk]
        if forced_stream and streamed:
            choices = streamed
        elif choices:
            first, s1, _ = min(choices, key=lambda cs: estimated_us(
                cs[0], tiles_of(cs[0]), k_blocks, sms, cs[1], rows=m))
            if tiles_of(first) * s1 <= STREAM_K_MAX_BUSY * sms:
                choices = choices + streamed
    # The outputs the epilogue stores (can_schedule took them all: _epilogue), and whether it
    # computes ops (any expr besides the matmul; a linear's bias counts as one).
    output_bytes = tuple(o.dtype.size for o in fusion.outputs if isinstance(o, TensorView))
    has_ops = len(op.inputs) > 2 or any(
        e is not op and any(isinstance(o, TensorView) for o in e.outputs) for e in fusion.exprs())
    def cost(choice) -> float:
        c, s, sk = choice
        epi = epilogue_us(c, has_ops, len(output_bytes))
        if sk:
            return stream_k_us(c, tiles_of(c), k_blocks, sms, sk, rows=m, epilogue=epi)
        return estimated_us(c, tiles_of(c), k_blocks, sms, s, rows=m, epilogue=epi)
    best, split_k, stream_k = min(choices, key=cost)
    mid_sector = any(rows_start_mid_sector(f.sizes, f.strides, a.dtype.size) for f in (fa, fb))
    cluster_m, cluster_n = (1, 1) if stream_k else cluster_choice(
        best, a_major, b_major, split_k, tiles_of(best), k_blocks, sms,
        info.feature("matmul_cluster"), mid_sector)
    params = fitted_params(best.tile_m, best.tile_n, best.compute_roles, tiles_of(best), dev,
                           a.dtype.size, b_major, output_bytes, split_k, a_major,
                           cluster_m=cluster_m, cluster_n=cluster_n, stream_k=stream_k)
    out_sizes = (*(batch_sizes or ()), m, n)
    return dataclasses.replace(params, staged_input=staged_input(fusion, info, params,
                                                                 out_sizes))


def staged_input(fusion, info, p: MatmulParams, out_sizes: tuple) -> int:
    """The fusion input the epilogue of `p` reads through its staging boxes, or -1: the first
    input of the first stored output's rank, dtype (16-bit) and sizes that an epilogue op reads
    and a tensor map of 64 x 64 boxes can take (rows of N contiguous), its batch dims the
    output's or broadcasts of one element (a mask of [B, 1, S, S] against scores of [B, H, S,
    S]: every head's tile loads batch B's box), in a kernel without split-K (each warp group
    then loads exactly its tiles' boxes, so their mbarriers' phases follow the tile count).
    `out_sizes`: the output's sizes (its batch dims', M and N).

    Measured before (bench/results/2026-11-30/h200-matmul-epilogue-gelu-session21.txt): x @ W^T
    + r read r with one 2-byte load per element in the accumulator fragment's layout, each
    warp's load touching 8 rows (8 L1 wavefronts for 64 bytes), about 4 us per tile of
    128 x 256 with the tensor cores idle; an L2 prefetch and unclamped addresses did not move
    it."""
    if p.split_k != 1 or p.stream_k:
        return -1
    op = _matmul_op(fusion)
    # The first stored output (can_schedule checked the epilogue: _epilogue's finals are the
    # fusion's tensor outputs).
    out = next(o for o in fusion.outputs if isinstance(o, TensorView))
    if out.dtype.size != 2:
        return -1
    rank = len(out.domain.logical)
    reads = {v for e in fusion.exprs() if e is not op for v in e.inputs}
    for v in fusion.inputs:
        if (not isinstance(v, TensorView) or v not in reads or v.dtype != out.dtype
                or len(v.domain.logical) != rank or v in op.inputs):
            continue
        f = info.inputs[fusion.input_position(v)]
        matrix = v.domain.logical[-2:]
        if any(i.is_broadcast for i in matrix) or tuple(f.sizes[-2:]) != out_sizes[-2:]:
            continue
        if any(size != want and not (size == 1 and i.is_broadcast) for i, size, want in
               zip(v.domain.logical[:-2], f.sizes[:-2], out_sizes[:-2])):
            continue
        why = check_tile_box(list(f.sizes), list(f.strides), f.alignment, v.dtype.size,
                             inner=rank - 1, outer=rank - 2, box_cols=EPILOGUE_BOX,
                             box_rows=EPILOGUE_BOX, swizzle=128,
                             batch=tuple(range(rank - 2)))
        if not why:
            return fusion.input_position(v)
    return -1


def fitted_params(tm: int, tn: int, roles: int, tiles: int, dev, item_bytes: int,
                  b_major: str, output_bytes: tuple = (2,), split_k: int = 1,
                  a_major: str = "K", epilogue_boxes: int | None = None,
                  cluster_m: int = 1, cluster_n: int = 1,
                  max_stages: int = MAX_STAGES, stream_k: int = 0) -> MatmulParams:
    """The parameters of a tm x tn tile (`roles` compute roles) on `dev`: as many stages (up to
    `max_stages`) as its shared memory holds beside the staging boxes (of each stored output, of
    its `output_bytes`), a persistent grid of min(work units, SMs) (a unit: a tile, or with
    `split_k` one of its shares of K; with `stream_k`, every SM). The heuristic's fitting of the tile it chose; sweeps
    force other tiles through it (and `epilogue_boxes`, 0 for the default rule, and other
    stage caps).

    Staging boxes (None: chosen here): a cooperative tile stages every box of a tile where
    MIN_STAGES_BESIDE_STAGING stages still fit beside them, so that its epilogue never waits
    for a store to read a box; ping-pong keeps the default (its epilogue runs under the other
    role's MMAs, and stages pay more there). Measured on the H200 (tools/sweep_matmul.py
    --boxes, bench/results/2026-11-29/h200-sweep-staging-boxes.txt): 128x192 with 3 boxes and
    4 stages against 1 box and 5 stages, 1648 against 1809 us at 8192^3, 916 against 1006 at
    4096x14336x5120; 128x256 with 4 boxes and 3 stages lost to 2 boxes and 4 stages (1715
    against 1675, 951 against 898); ping-pong 128x128 with 4 boxes and 5 stages 30.0 against
    29.1 us with 2 boxes and 6 stages at 2048x1024x4096."""
    tiles *= split_k
    shape = MatmulParams(tile_m=tm, tile_n=tn, compute_roles=roles, split_k=split_k,
                         output_bytes=tuple(output_bytes), stream_k=stream_k)
    stage_bytes = (tm + tn) * TILE_K * item_bytes

    def stages_beside(boxes: int) -> int:
        staging = (sum(output_bytes) * shape.compute_warp_groups * boxes
                   * EPILOGUE_BOX * EPILOGUE_BOX)
        budget = dev.max_shared_memory_per_block_optin - staging - SMEM_SLACK - 1024
        return min(max_stages, budget // stage_bytes)
    if epilogue_boxes is None:
        every = shape.boxes_per_tile
        epilogue_boxes = (every if roles == 1 and every > shape.staging_boxes
                          and stages_beside(every) >= MIN_STAGES_BESIDE_STAGING else 0)
    shape = dataclasses.replace(shape, epilogue_boxes=epilogue_boxes)
    stages = stages_beside(shape.staging_boxes)
    if stages < 2:
        raise SchedulerError(f"matmul: {dev.name}'s shared memory holds fewer than 2 stages of "
                             f"the {tm}x{tn} tile")
    # With clusters of C CTAs, whole clusters: C x (the clusters' tiles, or the SMs' clusters).
    C = cluster_m * cluster_n
    grid = dev.sm_count if stream_k else C * max(1, min(-(-tiles // C), dev.sm_count // C))
    return dataclasses.replace(shape, stages=stages, grid=grid, a_major=a_major,
                               b_major=b_major, cluster_m=cluster_m, cluster_n=cluster_n)


def schedule(fusion, params: MatmulParams) -> None:
    op = _matmul_op(fusion)
    a_dims, b_dims = _operand_dims(op)
    a, b = op.inputs[0], op.inputs[1]
    out = op.outputs[0]
    # The epilogue as defined (before the operand caches join the fusion's exprs).
    epilogue, finals, why = _epilogue(fusion, op)
    if why:
        raise SchedulerError(f"matmul: {why}")
    if params.output_bytes != tuple(f.dtype.size for f in finals):
        raise SchedulerError(f"matmul: the heuristic stages {params.outputs} output(s) of "
                             f"{params.output_bytes} bytes; the fusion stores "
                             f"{[f.dtype.short_name for f in finals]}")
    if params.staged_input >= 0:
        v = (fusion.inputs[params.staged_input]
             if params.staged_input < len(fusion.inputs) else None)
        if (params.split_k != 1 or not isinstance(v, TensorView)
                or v.dtype != finals[0].dtype or finals[0].dtype.size != 2
                or len(v.domain.logical) != len(finals[0].domain.logical)):
            raise SchedulerError(
                f"matmul: input {params.staged_input} cannot be read through the staging boxes "
                "(a 16-bit input of the first output's dtype and rank, in a kernel without "
                "split-K)")
    if params.cluster > 1:
        C = params.cluster
        # The operand the cluster shares: B along M, A along N.
        shared_rows = (shared_units(params.tile_n, params.b_major) if params.cluster_m > 1
                       else shared_units(params.tile_m, params.a_major))
        if (min(params.cluster_m, params.cluster_n) != 1 or params.split_k != 1
                or shared_rows % C or params.grid % C or C > 8):
            raise SchedulerError(
                f"matmul: clusters of {C} CTAs along {'M' if params.cluster_m > 1 else 'N'} "
                f"need no split-K, a grid of whole clusters ({params.grid}), clusters along "
                f"one dim, and a shared tile that splits into {C} shares (tile "
                f"{params.tile_m}x{params.tile_n}, A {params.a_major}-major, B "
                f"{params.b_major}-major)")
    if params.stream_k and (params.stream_k < 2 or params.split_k != 1 or params.cluster > 1
                            or params.compute_roles != 1 or params.staged_input >= 0):
        raise SchedulerError(
            f"matmul: stream-K over {params.stream_k} CTAs per tile needs 2 or more, cooperative "
            "tiles, and no split-K, cluster or staged input")
    if params.staging_boxes < 1 or params.boxes_per_tile % params.staging_boxes:
        raise SchedulerError(f"matmul: {params.staging_boxes} staging boxes per warp group do "
                             f"not divide the {params.boxes_per_tile} boxes it stores per tile")
    kind = WarpSpecialized(PT.TIDy, producer_registers=params.producer_registers,
                           compute_roles=params.compute_roles)
    caches = []
    for t in (a, b):
        c = cache_after(t, LoadKind.TmaTensor, MemoryType.Shared)
        circular_buffer(c, params.stages, params.stages - 1, kind)
        caches.append(c)
    threads = 128
    if params.accumulators > 128:
        raise SchedulerError(f"matmul: {params.accumulators} accumulators per thread (tile "
                             f"{params.tile_m}x{params.tile_n} on {params.compute_warp_groups} "
                             "compute warp groups) do not fit the registers")
    fusion.launch_hints.update(grid_x=params.grid, block_x=threads,
                               block_y=params.warp_groups_per_role)
    if params.cluster > 1:
        # A GPC takes whole clusters: fewer may fit at once than SMs / C (64 of 2 on the
        # H200's 132 SMs), and the executor fits the persistent grid to them.
        fusion.launch_hints.update(cluster=(params.cluster, 1, 1), persistent=True)
    graph = IdGraph(fusion)
    logical = out.domain.logical
    roles = {"m": logical[-2], "n": logical[-1]}
    for d in range(len(logical) - 2):
        roles[("b", d)] = logical[d]

    def dims_of(t):
        return tuple(next((r for r, j in roles.items() if not i.is_broadcast
                           and graph.mapped(i, j)), None) for i in t.domain.logical)
    reads = [v for e in epilogue for v in e.inputs
             if isinstance(v, TensorView) and v in fusion.inputs]
    if isinstance(op, LinearOp) and op.bias is not None:
        reads.append(op.bias)
    input_dims = tuple((t, dims_of(t)) for t in dict.fromkeys(reads))
    fusion.mma = MatmulOperands(params, caches[0], caches[1], out, a_dims, b_dims, op, finals,
                                tuple(epilogue), input_dims)
