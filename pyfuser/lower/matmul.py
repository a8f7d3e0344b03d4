"""Pass `build_matmul`: the tensor-core loop nest of a matmul the matmul scheduler took.

Before: a Kernel with parameters only; the fusion's `mma` (schedule/schedulers/matmul.py
MatmulOperands) names A's and B's shared caches (circular-buffered, warp-specialized) and the
output, with the tile sizes.

After (one role still: `pipeline_loads` splits it into a producer and compute warp groups and
gives each load its stage's slot and mbarrier; S stages, tile tm x tn, wg = threadIdx.y is the
compute warp group, rows [64 wg, 64 wg + 64) of the tile):

    A_s[tm * 64], B_s[tn * 64]: shared, 1024-byte aligned (128-byte swizzled boxes)
    stage[wgs * B * 64 * 64]:  shared, B 64x64 staging boxes per compute warp group (2; 1 when
                               a tile has an odd number of 64-column chunks), one such buffer
                               per stored output (a pre-activation beside its activation)
    acc[tn / 2]:               fp32 accumulators, registers
    for t in GridStride(tiles):                        (m0, n0) = raster(t)
      for kb in [0, ceil(K / 64)):
        A_s <- TMA box (kb * 64, m0) of A; B_s <- TMA box (kb * 64, n0) of B   (no barrier yet)
        wgmma.fence
        for ks < 4: wgmma m64n{tn}k16 acc, A_s[64 wg rows, 16 ks], B_s[16 ks], scale_d = kb|ks != 0
        wgmma.commit; wgmma.wait 1                     (kb - 1's wgmmas done: pipeline_loads
                                                        releases kb - 1's slot, and waits for
                                                        all after the loop)
      accumulator fence
      for chunk c < tn / 64:                           (staging box c % B of the warp group)
        thread 0 of the warp group: bulk wait (read) until at most B - 1 stores read its boxes
        barrier of the warp group (named barrier 8 + wg: the warp groups do not wait for each
        other; the epilogue is printed once per warp group)
        4 x stmatrix.x4: accumulators -> 16-bit -> staging box, 128-byte swizzled addresses
          (with a fused epilogue: its ops on each value first, one stmatrix per stored output)
        fence.proxy.async; the warp group's barrier
        thread 0: TMA store of each output's box at (n0 + 64 c, m0 + 64 wg); one bulk commit
    thread 0 of each warp group: bulk wait until its stores are written

Raster: tiles are visited in bands of `raster_group` tile rows, column by column within a
band: consecutive CTAs share A rows and B columns in L2.

B MN-major (params.b_major "MN", a row-major [K, N]): tn / 64 boxes of 64 N x 64 K rows per
stage, one after the other in B_s; each wgmma reads its K step's 16 rows of every box. A
MN-major (params.a_major "MN", a column-major [M, K], e.g. x.t() of a row-major [K, M]): tm /
64 boxes of 64 M x 64 K rows per stage; a warp group's 64-row slice is one box, whose K step's
16 rows its wgmma reads (imm-trans-a).

Batches (an operand or output [batch dims.., rows, cols], up to 3 batch dims of any strides):
tensor maps of 3-5 dims, a box one matrix deep, the batch the tile index's outermost part (t =
batch * tiles of a matrix + tile, the batch linear over the batch dims, the outermost slowest;
each dim's coordinate pf_tile_batch<d> from it); a 2-D operand is shared by every batch.

Clusters (params.cluster_m = C > 1, launched in clusters of C CTAs along x): the C CTAs of a
cluster take the C tiles of one column of C tile rows (tile t: rank t % C of cluster tile
t / C, rastered as above over cluster tiles of C * tm rows); each loads its own A box and the
r-th 1/C of the B rows the C tiles share, multicast into the same slot of every CTA of the
cluster (pipeline_loads then counts the whole cluster's releases of a slot before any CTA
refills it). Each CTA fetches A + B / C per k block from L2 instead of A + B. With
params.cluster_n the same along N: C tile columns of one tile row, A shared out.

Stream-K (params.stream_k, stream_k_units): the tile loop is serial over the CTA's work units
(whole tiles of the waves but the last, then runs of the rest's k-block sequence, the same
count per CTA), the k loop over the unit's [kbeg, kend) with its count_before (the CTA's k
blocks before the unit: pipeline_loads' stage counter); a run that is not a whole tile ends in
a SplitKReduce (the tile's other runs store, its first run adds them).

Limits: 16-bit inputs, 16-bit or fp32 outputs (up to MAX_OUTPUTS of the scheduler), tn a
multiple of 64 up to 256, tm 64 or 128; clusters along M or N (not both), without split-K;
stream-K with one compute role, no cluster and no staged input.
"""
from __future__ import annotations

from ..ir.dtype import DataType, compute_type
from ..ir.tensor import TensorView
from ..kir import nodes as K
from ..kir.rewrite import vars_read
from ..kir.verifier import establishes
from .indexing import scalar_to_kexpr

TILE_K = K.SWIZZLED_ROW_16BIT    # K elements of a stage: one 128-byte swizzled box row
K_STEP = K.WGMMA_K               # K elements of one wgmma
BOX = K.SWIZZLED_ROW_16BIT       # the epilogue's staging box: 64 x 64, rows of 128 bytes
# Registers per compute thread for the epilogue's column inputs read ahead (a 128x256 tile's
# bias: 64, with no spill at the kernel's 168-register bound, NVRTC 13.0).
COLUMN_REGISTERS = 64
# With stream-K, the column registers and the accumulators together at most (its runs keep
# more scalars live across the k loop: a 128x256 tile's bias spilled 96 bytes, NVRTC 13.0).
STREAM_K_REGISTERS = 160
F32_BOX_COLS = BOX // 2          # fp32 columns of a 128-byte swizzle row
# Named barriers of the compute warp groups' epilogues (8 + wg): above those pipeline_loads
# gives the warp roles (1 + role, and ping-pong's turns).
EPILOGUE_BARRIER = 8
_TIDX, _TIDY = K.Special("threadIdx.x"), K.Special("threadIdx.y")
WARP_GROUP_ROWS = K.WGMMA_M      # rows of one wgmma: a warp group's slice of a tile


def _min(a, b) -> K.KExpr:
    return K.Bin("min", a, b)


def tile_origin(t, tiles_m, tiles_n, group: int, tile_m: int, tile_n: int) -> tuple:
    """(m0, n0) of linear tile t: bands of `group` tile rows; within a band, tiles go down
    the band's rows first, then across its columns."""
    band = K.mul(K.Const(group), tiles_n)
    first_m = K.mul(K.div(t, band), group)
    rows = _min(K.sub(tiles_m, first_m), K.Const(group))
    local = K.mod(t, band)
    tm = K.add(first_m, K.mod(local, rows))
    tn = K.div(local, rows)
    return K.mul(tm, tile_m), K.mul(tn, tile_n)


def _split_k_buffers(kernel: K.Kernel, mma, batches, per_batch) -> tuple:
    """Split-K's global workspaces (the executor allocates them per launch shape): the fp32
    partials, [tile][split][tile_m x tile_n] (SplitKReduce's layout within a warp group's
    share), and one arrival counter per warp group of each tile, zeroed once, left zeroed by
    every launch. Their sizes are expressions of the fusion's extents (the launch's) and the
    kernel's (the interpreter's). Stream-K: a slot per tile of its stream-K part (fewer than
    twice the grid), up to params.stream_k partials each."""
    from ..ir import scalar as S
    p = mma.params
    a_in, b_in = mma.a.definition.inputs[0], mma.b.definition.inputs[0]
    m = a_in.domain.logical[mma.a_dims[0]].extent
    n = b_in.domain.logical[mma.b_dims[0]].extent
    batch = 1
    for i in mma.finals[0].domain.logical[:-2]:        # the batch dims, any number
        batch = S.mul(batch, i.extent)
    tiles = S.mul(S.mul(S.ceil_div(m, p.tile_m), S.ceil_div(n, p.tile_n)), batch)
    k_tiles = K.mul(batches, per_batch)
    splits = p.split_k
    if p.stream_k:
        tiles, k_tiles = S.smin(tiles, 2 * p.grid), K.Bin("min", k_tiles, K.Const(2 * p.grid))
        splits = p.stream_k
    wgs = p.warp_groups_per_role
    n_ws = len(kernel.workspaces)
    out = []
    for name, dtype, kind, elems, k_elems in (
            (f"pf_skp{n_ws}", DataType.Float, "split_k_partials",
             S.mul(tiles, splits * p.tile_m * p.tile_n),
             K.mul(k_tiles, splits * p.tile_m * p.tile_n)),
            (f"pf_skc{n_ws}", DataType.Int32, "split_k_counters", S.mul(tiles, wgs),
             K.mul(k_tiles, wgs))):
        buf = K.Buffer(name, dtype, "global", k_elems)
        kernel.params.append(K.Param(name, "ptr", ("workspace", name), buf))
        kernel.workspaces.append((buf, kind))
        kernel.workspace_elements[name] = elems
        out.append(buf)
    return tuple(out)


def stream_k_units(tiles, k_blocks, max_ctas: int) -> dict:
    """Stream-K's partition of a matmul's work over the persistent CTAs (gridDim.x = G), as
    kernel expressions of `tiles`, `k_blocks` and the CTA (blockIdx.x = g):

        whole waves but the last, data-parallel: dp = max(tiles / G - 1, 0) * G tiles, CTA g
          taking tiles g, g + G, ... whole (n_dp = dp / G of them);
        the rest, stream-K: their (tiles - dp) * k_blocks k blocks in one sequence, CTA g
          taking blocks [g W, g W + W) of it (clipped to its end), W = max(ceil(blocks / G),
          ceil(k_blocks / (max_ctas - 1))): a tile's blocks span at most max_ctas CTAs;
          each maximal run of them within one tile is a work unit.

    Returns "units" (CTA g's work units: its data-parallel tiles, then its stream-K runs),
    "defs" (the partition's scalars, defined at the top of each unit), and for unit u,
    functions of u: "tile", its first and past-the-end k blocks "kbeg", "kend", "before" (the
    k blocks of the CTA's units before u), and for a stream-K run "slot" (the
    tile's index within the stream-K part), "split" (which of the tile's CTAs this is, in
    k order), "ctas" (how many CTAs share the tile)."""
    G, g = K.Special("gridDim.x"), K.Special("blockIdx.x")

    def partition(at: dict) -> dict:
        """The partition's scalars, each written with `at`'s earlier ones (expressions, or
        the variables defined for them)."""
        out = dict(at)
        out["dp"] = K.mul(K.Bin("max", K.sub(K.div(tiles, G), 1), K.Const(0)), G)
        blocks = K.mul(K.sub(tiles, at.get("dp", out["dp"])), k_blocks)
        out["width"] = K.Bin("max", K.ceil_div(blocks, G), K.ceil_div(k_blocks, max_ctas - 1))
        out["begin"] = _min(K.mul(g, at.get("width", out["width"])), blocks)
        out["end"] = _min(K.add(at.get("begin", out["begin"]), at.get("width", out["width"])),
                          blocks)
        out["first"] = K.div(at.get("begin", out["begin"]), k_blocks)
        return out
    # The unit count, an expression (the pipeline's trips are defined before the roles split);
    # the rest reads the scalars each unit defines at its top.
    e = partition({})
    runs = K.Select(K.lt(e["begin"], e["end"]),
                    K.add(K.sub(K.div(K.sub(e["end"], 1), k_blocks), e["first"]), 1), K.Const(0))
    units = K.add(K.div(e["dp"], G), runs)
    var = {name: K.Var(f"pf_sk_{name}") for name in e}
    defs = [K.ScalarDef(var[name], x) for name, x in partition(var).items()]
    dp, width, begin, end, first = (var[x] for x in ("dp", "width", "begin", "end", "first"))
    n_dp = K.div(dp, G)

    def data_parallel(u):
        return K.lt(u, n_dp)

    def slot(u):            # the stream-K tile of run u - n_dp
        return K.add(first, K.sub(u, n_dp))

    def tile(u):
        return K.Select(data_parallel(u), K.add(g, K.mul(u, G)), K.add(dp, slot(u)))

    def kbeg(u):
        return K.Select(data_parallel(u), K.Const(0),
                        K.Bin("max", K.sub(begin, K.mul(slot(u), k_blocks)), K.Const(0)))

    def kend(u):
        return K.Select(data_parallel(u), k_blocks,
                        _min(K.sub(end, K.mul(slot(u), k_blocks)), k_blocks))

    def before(u):
        stream = K.add(K.mul(n_dp, k_blocks),
                       K.sub(K.add(K.mul(slot(u), k_blocks), kbeg(u)), begin))
        return K.Select(data_parallel(u), K.mul(u, k_blocks), stream)

    def first_cta(u):
        return K.div(K.mul(slot(u), k_blocks), width)

    def split(u):
        return K.sub(g, first_cta(u))

    def ctas(u):
        last = K.div(K.sub(K.mul(K.add(slot(u), 1), k_blocks), 1), width)
        return K.add(K.sub(last, first_cta(u)), 1)
    return {"units": units, "defs": defs, "tile": tile, "kbeg": kbeg, "kend": kend,
            "before": before, "slot": slot, "split": split, "ctas": ctas}


def _f32_pairs(stage, box, group, frag_row, frag_col, values) -> list:
    """The stores of one stmatrix's 8 values into an fp32 staging box (two 64 x 32 halves,
    each 128-byte swizzled, the second F32_BOX_COLS x BOX elements after the first) instead:
    values 4 g + {0, 1} and 4 g + {2, 3} of 8-column group `group` + g (g < 2, within the box)
    are fragment row frag_row and frag_row + 8, columns 8 (group + g) + frag_col + {0, 1};
    each pair one 8-byte store."""
    out = []
    for g in range(2):
        col_group = group + g
        half = col_group // 4
        # The 16-byte unit of the column pair in its half's row: 2 per 8-column group, plus
        # frag_col / 4 (frag_col = 2 (lane % 4)); the pair's element within it, frag_col % 4.
        unit = K.add(K.Const(2 * (col_group % 4)), K.div(frag_col, 4))
        for half_row in range(2):
            r = K.add(frag_row, 8 * half_row)
            at = K.add(K.add(box, half * F32_BOX_COLS * BOX),
                       K.add(K.mul(r, F32_BOX_COLS),
                             K.add(K.mul(swizzled_unit(unit, r), 4), K.mod(frag_col, 4))))
            v = 4 * g + 2 * half_row
            out.append(K.StSharedPair(K.TensorIndex(stage, at), [values[v], values[v + 1]]))
    return out


def swizzled_unit(unit, row) -> K.KExpr:
    """The 16-byte unit where unit `unit` of box row `row` lies under the 128-byte swizzle
    (kir.nodes.swizzled_byte: XOR with the row's index in its group of 8 rows)."""
    return K.Bin("^", unit, K.mod(row, 8))


@establishes()
def build_matmul(kernel: K.Kernel) -> K.Kernel:
    ctx = kernel.ctx
    fusion = kernel.fusion
    mma = fusion.mma
    p = mma.params
    tm, tn = p.tile_m, p.tile_n
    a_in, b_in = mma.a.definition.inputs[0], mma.b.definition.inputs[0]
    dtype = a_in.dtype
    if dtype not in (DataType.BFloat16, DataType.Half) or tn % BOX or tm not in (64, 128) \
            or tn > 256:
        raise ValueError(f"build_matmul: tile {tm}x{tn} of {dtype.short_name} is not built")
    if p.split_k > 1 and p.cluster > 1:
        raise ValueError("build_matmul: split-K in clusters is not built")
    if p.stream_k and (p.stream_k < 2 or p.split_k > 1 or p.cluster > 1 or p.compute_roles > 1
                       or p.staged_input >= 0):
        raise ValueError(f"build_matmul: stream-K over {p.stream_k} CTAs per tile is built for "
                         "cooperative tiles of 2 CTAs or more, without split-K, clusters or a "
                         "staged epilogue input")

    def extent(tv, d):
        return scalar_to_kexpr(tv.domain.logical[d].extent, ctx.names)

    m, k = extent(a_in, mma.a_dims[0]), extent(a_in, mma.a_dims[1])
    n = extent(b_in, mma.b_dims[0])

    def tensor_map(role, index, inner, outer, cols, rows, buf, batch=()):
        tile_map = K.TileBoxMap(role, index, inner, outer, cols, rows, 128, batch)
        name = f"{buf.name}_tmap"
        kernel.params.append(K.Param(name, "tmap", ("tmap", tile_map)))
        kernel.tensor_maps[name] = tile_map
        return K.Var(name), tile_map

    a_glob, b_glob = ctx.buffers[a_in], ctx.buffers[b_in]
    finals = mma.finals         # as many as p.outputs (schedule checked)
    out_globs = [ctx.buffers[f] for f in finals]
    a_mn, mn_major = p.a_major == "MN", p.b_major == "MN"
    rank = len(finals[0].domain.logical)

    def shared(tv_or_name, elems, of=dtype):
        name = tv_or_name if isinstance(tv_or_name, str) else f"T{tv_or_name.name}"
        buf = K.Buffer(name, of, "shared", K.Const(elems),
                       tv=None if isinstance(tv_or_name, str) else tv_or_name,
                       align=K.SWIZZLE_ATOM_BYTES)
        if not isinstance(tv_or_name, str):
            ctx.buffers[tv_or_name] = buf
        return buf

    # Cooperative (one compute role): the role's warp groups split the tile's rows, 64 each;
    # ping-pong (compute roles 2): each role is one warp group computing whole tiles, 64 rows
    # (a slice) per wgmma, one accumulator buffer per slice.
    wgs = p.warp_groups_per_role
    slices = tm // WARP_GROUP_ROWS // wgs
    a_s, b_s = shared(mma.a, tm * TILE_K), shared(mma.b, tn * TILE_K)
    # p.staging_boxes per warp group, used in turn (box j of every tile is box j % boxes: the
    # count divides the boxes a warp group stores per tile), each written again once the TMA
    # store of its last use has read it. With several compute roles, pipeline_loads gives each
    # role its own copy.
    chunks = tn // BOX
    boxes = p.staging_boxes
    # The staging boxes hold the stored output's type (bf16 out of fp16 operands: a cast in
    # the epilogue); each stored output has its own.
    staging = [shared("pf_mma_stage" + (str(o) if o else ""), wgs * boxes * BOX * BOX, f.dtype)
               for o, f in enumerate(finals)]
    accs = [K.Buffer(f"pf_acc{s}" if slices > 1 else "pf_acc", DataType.Float, "local",
                     K.Const(tn // 2)) for s in range(slices)]

    tiles_m, tiles_n = K.ceil_div(m, tm), K.ceil_div(n, tn)
    t, kb = ctx.new_loop_var(), ctx.new_loop_var()
    # Clusters of C CTAs along M (params.cluster_m): the C tiles of a column of C tile rows run
    # on the C CTAs of a cluster at once, each CTA loading A's rows of its own tile and 1/C of
    # the B box they share, multicast to all C; along N (params.cluster_n), the C tiles of a
    # row of C tile columns, A shared out the same way. Tile t is then tile t % C (the CTA's
    # rank in its cluster: the grid, a multiple of C, strides t by whole clusters) of cluster
    # tile t / C; tile rows (columns) are counted in whole clusters (a last one past M (N) is
    # zero-filled and never stored, so that every CTA of the cluster runs every k block).
    Cm, Cn = p.cluster_m, p.cluster_n
    C = Cm * Cn
    cluster_rows = K.ceil_div(tiles_m, Cm) if Cm > 1 else tiles_m
    cluster_cols = K.ceil_div(tiles_n, Cn) if Cn > 1 else tiles_n
    # A batch's tiles one after the other: the linear tile index is batch * (tiles of one
    # matrix) + the tile within its matrix, rastered as a 2-D matmul's. The batch dims (the
    # output's dims before its M and N, any number) count as one, the outermost slowest.
    per_batch = K.mul(cluster_rows, cluster_cols)
    batch_extents = [extent(finals[0], d) for d in range(rank - 2)]
    batches = K.Const(1)
    for e in batch_extents:
        batches = K.mul(batches, e)
    # The tile's batch and origin, defined once per work unit at the top of the unit loop (the
    # producer's copies and the epilogue read them; pipeline_loads gives the producer its own
    # definitions). With split-K, unit t is share t % S of K of tile t / S.
    splits = p.split_k
    k_blocks = K.ceil_div(k, TILE_K)
    tile_v, split_v = K.Var("pf_tile"), K.Var("pf_tile_split")
    unit_defs = ([K.ScalarDef(tile_v, K.div(t, splits)), K.ScalarDef(split_v, K.mod(t, splits))]
                 if splits > 1 else [])
    tile = tile_v if splits > 1 else t
    # Stream-K (params.stream_k): unit t of the CTA is a tile whole or a run of its k blocks
    # [kbeg, kend) (stream_k_units); the k loop's trips vary by unit, and its count_before
    # keeps the pipeline's stage counter running across them.
    stream = (stream_k_units(K.mul(batches, per_batch), k_blocks, p.stream_k) if p.stream_k
              else None)
    kbeg_v, kend_v = K.Var("pf_unit_kbeg"), K.Var("pf_unit_kend")
    before_v = K.Var("pf_unit_before")
    if stream:
        unit_defs = stream["defs"] + [
            K.ScalarDef(v, stream[name](t)) for v, name in (
                (tile_v, "tile"), (kbeg_v, "kbeg"), (kend_v, "kend"), (before_v, "before"))]
        tile = tile_v
    bt_v, m0, n0 = K.Var("pf_tile_batch"), K.Var("pf_tile_m0"), K.Var("pf_tile_n0")
    cta_v = K.Var("pf_tile_cta")
    if C > 1:
        unit_defs = [K.ScalarDef(cta_v, K.mod(t, C))]
        tile = K.div(t, C)
    m0_at, n0_at = tile_origin(K.mod(tile, per_batch) if rank > 2 else tile, cluster_rows,
                               cluster_cols, p.raster_group, tm * Cm, tn * Cn)
    if Cm > 1:
        m0_at = K.add(m0_at, K.mul(cta_v, tm))
    if Cn > 1:
        n0_at = K.add(n0_at, K.mul(cta_v, tn))
    # The tile's coordinate along each batch dim (outermost first), from its linear batch.
    coord_vs = ([bt_v] if rank == 3 else
                [K.Var(f"pf_tile_batch{d}") for d in range(rank - 2)])
    coord_defs = [K.ScalarDef(bt_v, K.div(tile, per_batch))] if rank > 2 else []
    if rank > 3:
        inner = None                   # the product of the batch dims inside dim d
        for d in reversed(range(rank - 2)):
            q = bt_v if inner is None else K.div(bt_v, inner)
            coord_defs.append(K.ScalarDef(coord_vs[d], K.mod(q, batch_extents[d]) if d else q))
            inner = batch_extents[d] if inner is None else K.mul(inner, batch_extents[d])
    tile_defs = unit_defs + coord_defs + [K.ScalarDef(m0, m0_at), K.ScalarDef(n0, n0_at)]
    batch_coords = coord_vs if rank > 2 else []
    # The epilogue's inputs index their batch dims by these (MatmulOperands.input_dims' roles).
    batch_at = {("b", d): c for d, c in enumerate(batch_coords)}
    # Every unit runs the same k blocks count (pipeline_loads' chain is rectangular): a share's
    # blocks past K are zero-filled boxes (the heuristic leaves no share empty). Share s takes
    # the k blocks s, s + S, s + 2 S, ...: the CTAs of a tile, running side by side, read
    # neighbouring 128-byte pieces of the same operand rows (contiguous ranges of K per share
    # measured the same on the H200: docs/performance.md, "Split-K").
    unit_k_blocks = K.ceil_div(k_blocks, splits) if splits > 1 else k_blocks

    def at_batch(coords, dims):
        """A copy's coordinates: column and row, then the batch's, innermost first (an operand
        with batch dims has the output's: MatmulOperands)."""
        return coords + (batch_coords[::-1] if dims[2] else [])
    box_bytes = lambda rows: K.Const(rows * TILE_K * dtype.size)  # noqa: E731
    k0 = K.mul(K.add(split_v, K.mul(kb, splits)) if splits > 1 else kb, TILE_K)
    def operand_loads(tv_in, dims, smem, glob, rows, origin, mn, cast=1) -> list:
        """The tensor map of operand `tv_in` and the copies of one stage of it into `smem`:
        K-major, one box of `rows` rows x 64 K; MN-major (its rows dim has stride 1), rows / 64
        boxes of 64 rows (a 128-byte swizzle row) x 64 K rows, one after the other. With `cast`
        CTAs sharing it (a cluster's B, or A), the CTA of rank r loads the r-th 1/cast of those rows
        (K-major: a box of rows / cast rows; MN-major: its share of the 64-row boxes) and
        multicasts it to all of them."""
        pos = fusion.input_position(tv_in)
        share = rows // (BOX if mn else 1) // cast     # 64-row boxes (MN-major) or rows
        first = K.mul(cta_v, share) if cast > 1 else K.Const(0)
        if mn:
            tmap = tensor_map("input", pos, dims[0], dims[1], BOX, TILE_K, glob, dims[2])
            return [K.TensorMapLoad(
                K.TensorIndex(smem, K.mul(K.add(first, j), BOX * TILE_K)), *tmap, glob,
                at_batch([K.add(origin, K.mul(K.add(first, j), BOX)), k0], dims),
                box_bytes(BOX), None, multicast=cast) for j in range(share)]
        tmap = tensor_map("input", pos, dims[1], dims[0], TILE_K, share, glob, dims[2])
        return [K.TensorMapLoad(K.TensorIndex(smem, K.mul(first, TILE_K)), *tmap, glob,
                                at_batch([k0, K.add(origin, first)], dims), box_bytes(share),
                                None, multicast=cast)]
    loads = (operand_loads(a_in, mma.a_dims, a_s, a_glob, tm, m0, a_mn, Cn)
             + operand_loads(b_in, mma.b_dims, b_s, b_glob, tn, n0, mn_major, Cm))
    # A staging box is 64 x 64 elements; a 128-byte swizzle row holds 64 16-bit or 32 fp32 ones,
    # so an fp32 output's box is stored as two boxes of 64 rows x 32 (F32_BOX_COLS) columns.
    out_batch = tuple(range(rank - 2))
    c_maps = [tensor_map("output", fusion.outputs.index(f), rank - 1, rank - 2,
                         F32_BOX_COLS if f.dtype.size == 4 else BOX, BOX, g, out_batch)
              for f, g in zip(finals, out_globs)]
    # The first of the warp group's rows of the tile (threadIdx.y: its warp group in the role).
    wg_row0 = K.mul(_TIDY, slices * WARP_GROUP_ROWS) if wgs > 1 else K.Const(0)
    mmas: list = [K.WgmmaFence()]
    for ks in range(TILE_K // K_STEP):
        first_kb = kbeg_v if stream else K.Const(0)
        scale_d = K.Const(True, "bool") if ks else K.Bin("!=", kb, first_kb)
        if mn_major:    # the K step is 16 rows of each 64 x 64 box
            b_at, chunk = K.Const(ks * K_STEP * BOX), BOX * TILE_K * dtype.size
        else:
            b_at, chunk = K.Const(ks * K_STEP), 0
        # A's 64 rows at the K step: K-major, 16 elements along each row; MN-major, 16 K rows
        # of the rows' box (rows / 64 boxes of 64 x 64 before it: rows x 64 elements either way).
        a_step = ks * K_STEP * (BOX if a_mn else 1)
        for sl, acc in enumerate(accs):
            rows = K.add(wg_row0, sl * WARP_GROUP_ROWS)
            mmas.append(K.Wgmma(acc, K.TensorIndex(a_s, K.add(K.mul(rows, TILE_K), a_step)),
                                K.TensorIndex(b_s, b_at), tn, dtype, scale_d,
                                b_major=p.b_major, b_chunk_bytes=chunk, a_major=p.a_major))
    # One k block's wgmmas stay in flight while the next block's are issued: pipeline_loads
    # releases a slot one iteration late (lower/pipeline.release_lag) and waits for all after
    # the loop.
    mmas += [K.WgmmaCommit(), K.WgmmaWait(1)]
    k_loop = (K.ForLoop(kb, kbeg_v, kend_v, K.Const(1), loads + mmas, count_before=before_v)
              if stream else K.ForLoop(kb, K.Const(0), unit_k_blocks, K.Const(1), loads + mmas))

    lane, warp = K.Var("pf_lane"), K.Var("pf_warp")
    row, unit_hi = K.Var("pf_st_row"), K.Var("pf_st_unit")
    frag_row, frag_col = K.Var("pf_frag_row"), K.Var("pf_frag_col")
    thread0 = K.eq(_TIDX, 0)
    fused = bool(mma.epilogue) or len(mma.op.inputs) > 2 or len(finals) > 1
    # A stored output's 8 values of an stmatrix, and one register per other epilogue tensor.
    # A lone 16-bit output no op reads back keeps its values in fp32: the stmatrix's pack
    # rounds them once, as the op's own rounding would (a 16-bit register costs a conversion
    # there and back per element, 2 of the ~13 SASS instructions of a residual add). One that
    # an op reads (a pre-activation feeding its activation) holds the rounded values it reads;
    # with two stored outputs both stay 16-bit (8 more live fp32 registers spilled 4 bytes at
    # the kernel's 168-register bound: bias + GELU beside its pre-activation, NVRTC 13.0).
    wide = {f for f in finals if len(finals) == 1
            and not any(f in e.inputs for e in mma.epilogue)}
    values_bufs = {f: K.Buffer("pf_epi" + (str(o) if o else ""),
                               DataType.Float if f in wide else f.dtype, "local", K.Const(8))
                   for o, f in enumerate(finals)}
    scalar_bufs: dict = {}
    # The input the heuristic reads through the staging boxes (params.staged_input): each box
    # of it lands, by TMA, in the staging box its output values are then written to; each lane
    # reads its fragment's 8 values with ldmatrix at its stmatrix address (into pf_res). One
    # mbarrier per staging box; a warp group's first boxes of a tile are loaded when the tile
    # starts (landing under its k loop), the others when their box is free.
    staged = fusion.inputs[p.staged_input] if p.staged_input >= 0 else None
    if staged is not None:
        res_buf = K.Buffer("pf_res", staged.dtype, "local", K.Const(8))
        # Indexed by the compute warp group (threadIdx.y: the warp group of a cooperative
        # role, the role in ping-pong, whose bodies each declare their own array).
        res_bars = K.MBarriers("pf_res_bar", p.compute_warp_groups * p.staging_boxes)
        res_map = tensor_map("input", p.staged_input, rank - 1, rank - 2, BOX, BOX,
                             ctx.buffers[staged], out_batch)

    def scalar_buf(tv):
        if tv not in scalar_bufs:
            scalar_bufs[tv] = K.Buffer(f"pf_e{tv.name}", tv.dtype, "local", K.Const(1))
        return scalar_bufs[tv]

    dims_of = dict(mma.input_dims)
    # Fusion inputs the epilogue reads by the column alone (a linear's bias, a column scale): each
    # thread's tn / 4 values of them (its fragment's columns) are read into registers when the
    # tile starts (RegisterCopy), so that their loads complete under the k loop; read after it,
    # a tile of few k blocks waited for them (x @ W^T + b at 3000x2056x1032: 30.4 us against
    # the bare matmul's 28.7, and 28.8 with the loads hoisted; H200, bench/results/2026-12-01/
    # h200-matmul-epilogue-session33.txt). At most COLUMN_REGISTERS registers of them.
    # With stream-K, within STREAM_K_REGISTERS beside the accumulators.
    col_slots = tn // 4
    col_budget = (min(COLUMN_REGISTERS, STREAM_K_REGISTERS - p.accumulators) if stream
                  else COLUMN_REGISTERS)
    col_bufs: dict = {}
    for v, roles_of_dims in mma.input_dims:
        if (v is staged or v not in fusion.inputs or "m" in roles_of_dims
                or "n" not in roles_of_dims
                or (len(col_bufs) + 1) * col_slots > col_budget):
            continue
        col_bufs[v] = K.Buffer(f"pf_col{v.name}", compute_type(v.dtype), "local",
                               K.Const(col_slots))

    def input_at(v, at: dict) -> K.TensorIndex:
        """Fusion input v's element at the roles' indices `at` ("m", "n", ("b", d))."""
        strides = ctx.strides[v]
        index = K.Const(0)
        for d, role in enumerate(dims_of[v]):
            if role is not None:
                index = K.add(index, K.mul(at[role], strides[d]))
        return K.TensorIndex(ctx.buffers[v], index)

    def column(slot: int) -> K.KExpr:
        """The clamped global column of a thread's fragment column `slot` (register i's slot is
        2 (i >> 2) + (i & 1): column 8 (i >> 2) + (i & 1) past its pair's first)."""
        return _min(K.add(n0, K.add(frag_col, 8 * (slot >> 1) + (slot & 1))), K.sub(n, 1))

    column_loads = [K.RegisterCopy(K.TensorIndex(buf, K.Const(q)),
                                   input_at(v, {"n": column(q), **batch_at}))
                    for v, buf in col_bufs.items() for q in range(col_slots)]
    # The epilogue ops that read the matmul's result, directly or not.
    after_mm: set = set()
    downstream = {mma.out}
    for e in mma.epilogue:
        if any(v in downstream for v in e.inputs):
            after_mm.add(e)
            downstream.update(e.outputs)

    def epilogue_value(acc, i: int, tile_row, slot: int) -> list:
        """The statements computing the stored value of accumulator register i (row tile_row +
        its fragment row, its fragment column) into pf_epi[slot]: the matmul's element (with a
        linear's bias), then each epilogue op, inputs read at the element's row and column
        (clamped into the matrix: rows and columns past it are computed, never stored)."""
        r = K.add(K.add(tile_row, frag_row), 8 * ((i >> 1) & 1))
        col_slot = 2 * (i >> 2) + (i & 1)
        at = {"m": _min(K.add(m0, r), K.sub(m, 1)), "n": column(col_slot), **batch_at}

        def operand(v):
            if v in values_bufs:
                return K.TensorIndex(values_bufs[v], K.Const(slot))
            if v is staged:
                return K.TensorIndex(res_buf, K.Const(slot))
            if v in col_bufs:
                return K.TensorIndex(col_bufs[v], K.Const(col_slot))
            if v is mma.out or v in scalar_bufs:
                return K.TensorIndex(scalar_buf(v), K.Const(0))
            if isinstance(v, TensorView):
                return input_at(v, at)
            return K.ScalarValue(v, v.dtype)

        def out_of(tv):
            if tv in values_bufs:
                return K.TensorIndex(values_bufs[tv], K.Const(slot))
            return K.TensorIndex(scalar_buf(tv), K.Const(0))

        def op_stmt(e):
            return K.TensorOp(e, out_of(e.outputs[0]), [operand(v) for v in e.inputs])

        # Ops of inputs alone first (a bias computed from an input), then the matmul's element
        # (plus the bias), then the ops after it.
        stmts = [op_stmt(e) for e in mma.epilogue if e not in after_mm]
        ins = [K.TensorIndex(acc, K.Const(i))]
        if len(mma.op.inputs) > 2:
            ins.append(operand(mma.op.inputs[2]))
        stmts.append(K.TensorOp(mma.op, out_of(mma.out), ins))
        return stmts + [op_stmt(e) for e in mma.epilogue if e in after_mm]

    def box_of(wg: int, j: int) -> tuple:
        """(the staging box's first element, the global coordinates: column, row and batch)
        of warp group wg's box j of the tile: slice j / chunks, 64-column chunk j % chunks,
        staging box j % boxes."""
        sl, c = divmod(j, chunks)
        row0 = (wg * slices + sl) * WARP_GROUP_ROWS
        return (K.Const((wg * boxes + j % boxes) * BOX * BOX),
                [K.add(n0, c * BOX), K.add(m0, row0)] + batch_coords[::-1])

    def epilogue_of(wg: int) -> list:
        """Warp group wg's epilogue (of the role): its own staging boxes and, with several warp
        groups in the role, its own named barrier (they do not wait for each other); one warp
        group per role: the role's barrier."""
        sync = K.BlockSync(EPILOGUE_BARRIER + wg, K.Const(128)) if wgs > 1 else K.BlockSync()
        out: list = []
        j = 0                       # the warp group's boxes of this tile, in order
        for sl, acc in enumerate(accs):
            for c in range(chunks):
                box, at = box_of(wg, j)
                row0 = (wg * slices + sl) * WARP_GROUP_ROWS
                if staged is None:
                    out += [K.IfThenElse(thread0, [K.BulkWait(boxes - 1, read=True)]), sync]
                else:
                    # Past the boxes loaded when the tile started: the box free (its last store
                    # read), then the staged input's box into it. The wait on the box's mbarrier
                    # replaces the barrier (the load follows thread 0's bulk wait).
                    if j >= boxes:
                        out.append(K.IfThenElse(thread0, [K.BulkWait(boxes - 1, read=True)]
                                                + staged_load(wg, j)))
                    out.append(K.MBarrierWait(staged_bar(j), staged_parity(j)))
                j += 1
                for jj in range(4):
                    j0 = 8 * c + 2 * jj                    # the first of two 8-column groups
                    unit = K.add(K.Const(2 * jj), unit_hi)  # its 16-byte unit in the row
                    dst = K.add(box, K.add(K.mul(row, BOX), K.mul(swizzled_unit(unit, row), 8)))
                    if fused:
                        if staged is not None:
                            out.append(K.LdMatrix(K.TensorIndex(staging[0], dst), res_buf))
                        for v in range(8):
                            tile_row = (K.add(wg_row0, sl * WARP_GROUP_ROWS) if wgs > 1
                                        else K.Const(row0))
                            out += epilogue_value(acc, 4 * j0 + v, tile_row, v)
                        for f, stage in zip(finals, staging):
                            values = [K.TensorIndex(values_bufs[f], K.Const(v)) for v in range(8)]
                            if f.dtype.size == 4:
                                out += _f32_pairs(stage, box, j0 - 8 * c, frag_row, frag_col,
                                                  values)
                            else:
                                out.append(K.StMatrix(K.TensorIndex(stage, dst), values, f.dtype))
                    else:
                        values = [K.TensorIndex(acc, K.Const(4 * j0 + i)) for i in range(8)]
                        out.append(K.StMatrix(K.TensorIndex(staging[0], dst), values,
                                              finals[0].dtype))
                # Each output's box stored, one bulk group for all (the wait above frees the
                # box of every output at once).
                stores = []
                for f, stage, c_map, g in zip(finals, staging, c_maps, out_globs):
                    if f.dtype.size == 4:       # the box's two halves of 32 columns
                        stores += [K.TensorMapStore(
                            K.TensorIndex(stage, K.add(box, h * F32_BOX_COLS * BOX)), *c_map, g,
                            [K.add(at[0], h * F32_BOX_COLS)] + at[1:]) for h in range(2)]
                    else:
                        stores.append(K.TensorMapStore(K.TensorIndex(stage, box), *c_map, g, at))
                out += [K.FenceProxyAsync(), sync,
                        K.IfThenElse(thread0, stores + [K.BulkCommit()])]
        return out

    def staged_load(wg: int, j: int) -> list:
        """Thread 0 of warp group wg: the staged input's box j of the tile into its staging
        box, on that box's mbarrier."""
        bar = staged_bar(j)
        box, at = box_of(wg, j)
        # Its batch dims are the output's, or of one element (a broadcast: coordinate 0).
        at = at[:2] + [c if role else K.Const(0) for c, role in
                       zip(at[2:], dims_of[staged][:rank - 2][::-1])]
        return [K.TensorMapLoad(K.TensorIndex(staging[0], box), *res_map, ctx.buffers[staged],
                                at, K.Const(BOX * BOX * staged.dtype.size), bar),
                K.MBarrierArrive(bar)]

    def staged_bar(j: int) -> K.MBarrierRef:
        """The mbarrier of the staging box of the warp group's box j."""
        return K.MBarrierRef(res_bars, K.add(K.mul(_TIDY, boxes), j % boxes))

    def staged_parity(j: int) -> K.KExpr:
        """The phase parity of box j's load on its staging box's mbarrier: each tile loads
        every staging box uses = boxes_per_tile / staging_boxes times (the schedule allows
        staging only without split-K: every tile a role takes runs this epilogue; a role takes
        every compute_roles-th iteration of the CTA's grid-stride loop), so the box's loads
        before it number (t / gridDim.x / compute_roles) * uses + j / staging_boxes."""
        uses = slices * chunks // boxes
        if uses % 2 == 0:
            return K.Const(j // boxes % 2)
        taken = K.div(K.div(t, K.Special("gridDim.x")), p.compute_roles)
        return K.mod(K.add(K.mul(taken, uses), j // boxes), 2)

    # When the tile starts: each warp group's thread 0 waits until its last tile's stores have
    # read their boxes, then loads the tile's first staging_boxes boxes of the staged input.
    staged_first: list = []
    if staged is not None:
        def first_loads(wg):
            return [K.IfThenElse(thread0, [K.BulkWait(0, read=True)] + [
                x for j in range(boxes) for x in staged_load(wg, j)])]
        staged_first = (first_loads(0) if wgs == 1 else
                        [K.IfThenElse(K.eq(_TIDY, 0), first_loads(0), first_loads(1))])

    split_bufs = (_split_k_buffers(kernel, mma, batches, per_batch)
                  if splits > 1 or stream else None)

    def unit_epilogue(wg: int) -> list:
        """Warp group wg's epilogue; with split-K, after its partials are summed, by the last
        CTA of the tile only (the others store nothing)."""
        if split_bufs is None:
            return epilogue_of(wg)
        last = K.Var("pf_split_last")
        barrier = (EPILOGUE_BARRIER + wg, 128) if wgs > 1 else None     # else the role's
        if stream:      # a stream-K run's partial (every register: no row bound); a tile
            # taken whole runs its epilogue alone
            whole = K.and_(K.eq(kbeg_v, 0), K.eq(kend_v, k_blocks))
            reduce = K.SplitKReduce(last, tuple(accs), *split_bufs,
                                    K.add(K.mul(stream["slot"](t), wgs), wg), stream["split"](t),
                                    None, (), p.stream_k, barrier,
                                    arrivals=stream["ctas"](t), whole=whole)
        else:
            rows = tuple(K.sub(K.sub(m, m0), (wg * slices + sl) * WARP_GROUP_ROWS)
                         for sl in range(slices))
            reduce = K.SplitKReduce(last, tuple(accs), *split_bufs, K.add(K.mul(tile, wgs), wg),
                                    split_v, frag_row, rows, splits, barrier)
        return [reduce, K.IfThenElse(last, epilogue_of(wg))]

    epilogue: list = [K.AccumulatorFence(acc) for acc in accs]
    if wgs == 1:
        epilogue += unit_epilogue(0)
    else:
        epilogue.append(K.IfThenElse(K.eq(_TIDY, 0), unit_epilogue(0), unit_epilogue(1)))
    tile_body = tile_defs + column_loads + staged_first + [k_loop] + epilogue
    tile_loop = (K.ForLoop(t, K.Const(0), stream["units"], K.Const(1), tile_body) if stream else
                 K.ForLoop(t, K.Const(0), K.mul(K.mul(batches, per_batch), splits * C),
                           K.Const(1), tile_body, parallel="GridStride"))
    # The fusion's loop nests (LoweringContext) are replaced by this nest of its own.
    kernel.replaced_loops.update(id(lp) for lp in ctx.all_loops())
    # The staged input's mbarriers: set up and taken down by each compute role's first thread,
    # its warp groups' (the block barrier becomes the role's when pipeline_loads splits the
    # roles).
    first = K.and_(thread0, K.eq(K.mod(_TIDY, wgs), 0))
    role_bars = [K.MBarrierRef(res_bars, K.add(K.mul(_TIDY, boxes), i))
                 for i in range(wgs * boxes)] if staged is not None else []
    res_setup = [] if staged is None else [
        K.MBarrierAlloc(res_bars),
        K.IfThenElse(first, [K.MBarrierInit(b, K.Const(1)) for b in role_bars]
                     + [K.FenceMBarrierInit()]),
        K.BlockSync()]
    res_teardown = [] if staged is None else [
        K.BlockSync(), K.IfThenElse(first, [K.MBarrierInval(b) for b in role_bars])]
    kernel.body = [
        K.Allocate(a_s), K.Allocate(b_s), *(K.Allocate(s) for s in staging),
        *(K.Allocate(a) for a in accs),
        *([K.Allocate(b) for b in values_bufs.values()]
          + [K.Allocate(b) for b in scalar_bufs.values()] if fused else []),
        *(K.Allocate(b) for b in col_bufs.values()),
        *([K.Allocate(res_buf)] if staged is not None else []),
        *res_setup,
        K.Comment(f"matmul: tile {tm}x{tn}x{TILE_K}, wgmma m64n{tn}k16, {p.compute_roles} "
                  f"compute role(s) of {wgs} warp group(s), {slices} slice(s) of 64 rows each; "
                  "lane l of warp w stores row 16 w + l % 8 + 8 (l / 8 % 2) of its stmatrix "
                  "boxes"),
        K.ScalarDef(lane, K.mod(_TIDX, 32)),
        K.ScalarDef(warp, K.div(_TIDX, 32)),
        # The stmatrix rows (16-bit outputs), and the accumulator fragment: register i of lane
        # l in warp w is row 16 w + l / 4 + 8 ((i >> 1) & 1), column 8 (i >> 2) + 2 (l % 4) +
        # (i & 1) of its 64-row slice (each defined where the epilogue reads it: NVRTC warns of
        # an unused variable).
        *(K.ScalarDef(v, e) for v, e in (
            (row, K.add(K.mul(warp, 16), K.add(K.mod(lane, 8), K.mul(K.mod(K.div(lane, 8), 2),
                                                                     8)))),
            (unit_hi, K.div(lane, 16)),
            (frag_row, K.add(K.mul(warp, 16), K.div(lane, 4))),
            (frag_col, K.mul(K.mod(lane, 4), 2)))
          if v.name in vars_read([tile_loop])),
        tile_loop,
        K.IfThenElse(thread0, [K.BulkWait(0, read=False)]),
        *res_teardown,
    ]
    return kernel
