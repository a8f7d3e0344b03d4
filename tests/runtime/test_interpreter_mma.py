"""The interpreter's models of the Hopper matmul nodes (kir/nodes.py): tile tensor-map loads and
stores through the 128-byte swizzle, wgmma (operand descriptors, the accumulator fragment),
stmatrix, and the checks each makes. Kernels are built by hand from kernel-IR nodes (CPU only).
"""
import numpy as np
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.kir import nodes as K
from pyfuser.kir.printer import kernel_str
from pyfuser.kir.verifier import KernelIRError, verify_kernel
from pyfuser.runtime.inputs import check_inputs
from pyfuser.runtime.interpreter import Interpreter, InterpreterError, _round_array

BF16, F32 = DataType.BFloat16, DataType.Float
TID, BIDX, BIDY = K.Special("threadIdx.x"), K.Special("blockIdx.x"), K.Special("blockIdx.y")
FIRST = K.eq(TID, 0)


def swz(byte):
    """The 128-byte swizzle, written out: the 16-byte unit XOR the row within its 8 rows."""
    row, unit, low = byte // 128, (byte // 16) % 8, byte % 16
    return row * 128 + (unit ^ (row % 8)) * 16 + low


def bf16(x):
    return _round_array(BF16, np.asarray(x, dtype=np.float64))


def f32(x):
    return _round_array(F32, np.asarray(x, dtype=np.float64))


# Hand-built kernels -----------------------------------------------------------------------------
def linear_fusion(dtype=BF16):
    """inputs a [M, K], b [N, K]; output [M, N] (only the shapes matter: the kernels are ours)."""
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=dtype)
        b = fd.define_tensor([-1, -1], dtype=dtype)
        fd.add_output(fd.ops.linear(a, b))
    return fd


def copy_fusion(dtype, contiguity=(False, True)):
    """input x [M, N] (any row stride); output [M, N] of the same dtype."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=dtype, contiguity=list(contiguity))
        fd.add_output(fd.ops.neg(x))
    return fd


class Builder:
    """Parameters, shared buffers and the mbarrier of a hand-built kernel."""

    def __init__(self, fd):
        self.fd = fd
        self.params = []
        self.bars = K.MBarriers("bars", 1)
        self.bar = K.MBarrierRef(self.bars, K.Const(0))

    def input(self, k, dtype):
        b = K.Buffer(f"T{k}", dtype, "global")
        self.params.append(K.Param(b.name, "ptr", ("input", k), b))
        return b

    def output(self, k, dtype):
        b = K.Buffer(f"T_out{k}", dtype, "global")
        self.params.append(K.Param(b.name, "ptr", ("output", k), b))
        return b

    def tmap(self, name, tile):
        self.params.append(K.Param(name, "tmap", ("tmap", tile)))
        return K.Var(name)

    def barrier_setup(self):
        return [K.MBarrierAlloc(self.bars),
                K.IfThenElse(FIRST, [K.MBarrierInit(self.bar, K.Const(1))]),
                K.BlockSync()]

    def load(self, dst, tmap, tile, source, coords):
        nbytes = tile.box_rows * tile.box_cols * source.dtype.size
        return K.TensorMapLoad(dst, tmap, tile, source, [K._wrap(c) for c in coords],
                               K.Const(nbytes), self.bar, predicate=FIRST)

    def arrive_and_wait(self, parity=0):
        return [K.IfThenElse(FIRST, [K.MBarrierArrive(self.bar)]),
                K.MBarrierWait(self.bar, K.Const(parity))]

    def kernel(self, body, grid=(1, 1, 1), block=128):
        for j, o in enumerate(self.fd.fusion.outputs):     # every output has its pointer
            if not any(p.source == ("output", j) for p in self.params):
                self.output(j, o.dtype)
        k = K.Kernel("k", self.fd.fusion, body=body, params=self.params,
                     launch=K.LaunchConfig(list(grid), [block, 1, 1]))
        k.tensor_maps = {p.name: p.source[1] for p in self.params if p.kind == "tmap"}
        return k


def shared(name, dtype, n):
    return K.Buffer(name, dtype, "shared", K.Const(n))


def run(kernel, inputs, **kw):
    it = Interpreter(kernel, check_inputs(kernel.fusion, inputs), **kw)
    outs = it.run(inputs)
    return outs, it


def smem_of(it, buf, block=0):
    m = it.mems[id(buf)]
    return m.vals.reshape(-1, m.row)[block], m.written.reshape(-1, m.row)[block]


def regs_of(it, buf):
    m = it.mems[id(buf)]
    return m.vals.reshape(-1, m.row)[:, :m.limit]


# The swizzle ------------------------------------------------------------------------------------
def test_swizzled_byte_is_the_formula_and_a_bijection_of_each_atom():
    byte = np.arange(3 * K.SWIZZLE_ATOM_BYTES)
    got = K.swizzled_byte(byte)
    assert [K.swizzled_byte(int(b)) for b in byte] == [swz(int(b)) for b in byte]
    assert (got == np.array([swz(int(b)) for b in byte])).all()
    for atom in range(3):                       # each 1024 bytes onto themselves
        part = got[atom * 1024:(atom + 1) * 1024]
        assert sorted(part.tolist()) == list(range(atom * 1024, (atom + 1) * 1024))
    assert (got // 128 == byte // 128).all()   # a byte stays in its 128-byte row
    with pytest.raises(ValueError, match="only the 128-byte swizzle"):
        K.swizzled_byte(0, 64)


# Tile tensor-map loads --------------------------------------------------------------------------
def padded_bf16(rows, cols, pad_to):
    """A bf16 [rows, cols] view of rows padded to `pad_to` elements (a 16-byte row stride)."""
    base = torch.randn(rows, pad_to).to(torch.bfloat16)
    return base[:, :cols]


def tile_load_kernel(fd, tile, coords, dst_index=0, smem_elems=None, dtype=BF16):
    b = Builder(fd)
    src = b.input(tile.index, dtype)
    tm = b.tmap("tmX", tile)
    box = tile.box_rows * tile.box_cols
    sm = shared("smX", dtype, smem_elems or box)
    body = b.barrier_setup() + [K.Allocate(sm),
                                b.load(K.TensorIndex(sm, K.Const(dst_index)), tm, tile, src,
                                       coords)] + b.arrive_and_wait()
    return b.kernel(body), sm


@pytest.mark.parametrize("coords", [(64, 64), (0, 0), (-8, -3), (96, 60)])
def test_a_tile_load_of_a_ragged_matrix_lands_swizzled_with_zero_fill(coords):
    x = padded_bf16(70, 100, 104)
    fd = copy_fusion(BF16)
    tile = K.TileBoxMap("input", 0, inner=1, outer=0, box_cols=64, box_rows=64)
    k, sm = tile_load_kernel(fd, tile, coords)
    _, it = run(k, [x], check_output_writes=False)
    vals, written = smem_of(it, sm)
    assert written.all()
    xs = x.double().numpy()
    c0, c1 = coords
    for r in range(64):
        for c in range(64):
            gr, gc = c1 + r, c0 + c
            want = xs[gr, gc] if 0 <= gr < 70 and 0 <= gc < 100 else 0.0
            assert vals[swz((r * 64 + c) * 2) // 2] == want, (r, c)


def test_tile_maps_the_encoder_would_refuse_are_refused():
    tile = K.TileBoxMap("input", 0, inner=1, outer=0, box_cols=64, box_rows=64)
    k, _ = tile_load_kernel(copy_fusion(BF16), tile, (0, 0))
    dense = torch.randn(70, 100).to(torch.bfloat16)          # rows of 200 bytes
    with pytest.raises(InterpreterError,
                       match="outer dim 0 stride 100 x 2 bytes is not a multiple of 16"):
        run(k, [dense], check_output_writes=False)
    shifted = padded_bf16(70, 101, 112)[:, 1:]               # data pointer 2 bytes past 16
    with pytest.raises(InterpreterError, match="data pointer is 2-byte aligned, not 16"):
        run(k, [shifted], check_output_writes=False)
    transposed = torch.randn(104, 70).to(torch.bfloat16).t()  # inner dim of stride 70
    k, _ = tile_load_kernel(copy_fusion(BF16, (False, False)), tile, (0, 0))
    with pytest.raises(InterpreterError, match="the inner dim 1 has stride 70, not 1"):
        run(k, [transposed], check_output_writes=False)
    narrow = K.TileBoxMap("input", 0, inner=1, outer=0, box_cols=32, box_rows=64)
    k, _ = tile_load_kernel(copy_fusion(BF16), narrow, (0, 0))
    with pytest.raises(InterpreterError, match="rows of 128 bytes, not 32 x 2"):
        run(k, [padded_bf16(70, 100, 104)], check_output_writes=False)


def test_a_swizzled_box_not_on_a_1024_byte_boundary_is_refused():
    tile = K.TileBoxMap("input", 0, inner=1, outer=0, box_cols=64, box_rows=64)
    k, _ = tile_load_kernel(copy_fusion(BF16), tile, (0, 0), dst_index=64, smem_elems=8192)
    with pytest.raises(InterpreterError, match=r"tensor-map destination smX\[64\] at element 64 "
                                               r"of smX \(byte 128 of shared memory\) is not "
                                               r"1024-byte aligned"):
        run(k, [padded_bf16(70, 100, 104)], check_output_writes=False)
    k, sm = tile_load_kernel(copy_fusion(BF16), tile, (0, 0), dst_index=512, smem_elems=8192)
    run(k, [padded_bf16(70, 100, 104)], check_output_writes=False)     # 1024 bytes in: fine
    k.smem_offsets = {sm.name: 512}                # the buffer itself half an atom in
    with pytest.raises(InterpreterError, match="byte 1536 of shared memory"):
        run(k, [padded_bf16(70, 100, 104)], check_output_writes=False)


def test_a_tile_load_read_before_its_barrier_wait_fails():
    """The slot tracking of the row-box loads covers tile loads: a wgmma before the wait."""
    fd = linear_fusion()
    a = torch.randn(64, 32).to(torch.bfloat16)
    k, _, _ = wgmma_kernel(fd, 16, wait_for_loads=False)
    with pytest.raises(InterpreterError, match="before every thread of the warp group waited on "
                                               "the barrier phase its copy completes"):
        run(k, [a, torch.randn(16, 32).to(torch.bfloat16)], check_output_writes=False)


# Tile tensor-map stores -------------------------------------------------------------------------
def copy_through_smem_kernel(fd, dtype, box_cols, box_rows, grid, store_from=None):
    """Each block loads the box at (box_cols bx, box_rows by) and stores it back at the same
    coordinates of the output (from `store_from` instead, if given)."""
    b = Builder(fd)
    src = b.input(0, dtype)
    out = b.output(0, dtype)
    t_in = K.TileBoxMap("input", 0, inner=1, outer=0, box_cols=box_cols, box_rows=box_rows)
    t_out = K.TileBoxMap("output", 0, inner=1, outer=0, box_cols=box_cols, box_rows=box_rows)
    tm_in, tm_out = b.tmap("tmX", t_in), b.tmap("tmY", t_out)
    sm = shared("smX", dtype, box_cols * box_rows)
    coords = [K.mul(BIDX, box_cols), K.mul(BIDY, box_rows)]
    body = b.barrier_setup() + [K.Allocate(sm)]
    if store_from is None:
        body += [b.load(K.TensorIndex(sm, K.Const(0)), tm_in, t_in, src, coords)]
    body += b.arrive_and_wait() + [
        K.TensorMapStore(K.TensorIndex(store_from or sm, K.Const(0)), tm_out, t_out, out,
                         coords, predicate=FIRST),
        K.IfThenElse(FIRST, [K.BulkCommit(), K.BulkWait(0, read=False)])]
    if store_from is not None:
        body.insert(0, K.Allocate(store_from))
    return b.kernel(body, grid=grid), sm


def test_a_swizzled_box_stored_clipped_to_a_ragged_output():
    """fp32 boxes of 32 x 64 through shared memory and back: every element of a 70 x 100
    output written once, the parts of the boxes outside it dropped."""
    x = torch.randn(70, 100)
    k, sm = copy_through_smem_kernel(copy_fusion(F32), F32, 32, 64, grid=(4, 2, 1))
    (y,), it = run(k, [x])                       # checks each output element written once
    torch.testing.assert_close(y, x, rtol=0, atol=0)
    assert len(it.writes) == 70 * 100 and set(it.writes.values()) == {1}


def test_a_tensor_map_store_of_unwritten_shared_memory_fails():
    x = torch.randn(70, 100)
    never = shared("smNever", F32, 32 * 64)
    k, _ = copy_through_smem_kernel(copy_fusion(F32), F32, 32, 64, grid=(4, 2, 1),
                                    store_from=never)
    with pytest.raises(InterpreterError, match=r"tensor-map store of smNever\[0\] reads box "
                                               r"element \(0, 0\), which was never written"):
        run(k, [x])


def test_a_store_through_a_map_of_another_tensor_fails():
    x = torch.randn(70, 100)
    k, _ = copy_through_smem_kernel(copy_fusion(F32), F32, 32, 64, grid=(4, 2, 1))
    store = next(s for s in K.walk(k.body) if isinstance(s, K.TensorMapStore))
    store.target = next(p.buffer for p in k.params if p.source == ("input", 0))
    with pytest.raises(InterpreterError, match="global buffer T0 is not the tensor its map "
                                               "describes"):
        run(k, [x])


# wgmma ------------------------------------------------------------------------------------------
def wgmma_kernel(fd, n, wait_for_loads=True, a_index=(0, 16), scale=(False, True), wait=True,
                 block=128):
    """A [64, K <= 64] and B [n, K] loaded as one 64-column box each; two wgmmas (K steps 0 and
    16) into an accumulator of n / 2 registers."""
    b = Builder(fd)
    ta = K.TileBoxMap("input", 0, inner=1, outer=0, box_cols=64, box_rows=64)
    tb = K.TileBoxMap("input", 1, inner=1, outer=0, box_cols=64, box_rows=n)
    A, B = b.input(0, BF16), b.input(1, BF16)
    tma, tmb = b.tmap("tmA", ta), b.tmap("tmB", tb)
    sa, sb = shared("smA", BF16, 64 * 64), shared("smB", BF16, 64 * n)
    acc = K.Buffer("acc", F32, "local", K.Const(n // 2))
    body = b.barrier_setup() + [
        K.Allocate(sa), K.Allocate(sb), K.Allocate(acc),
        b.load(K.TensorIndex(sa, K.Const(0)), tma, ta, A, (0, 0)),
        b.load(K.TensorIndex(sb, K.Const(0)), tmb, tb, B, (0, 0))]
    body += b.arrive_and_wait() if wait_for_loads else []
    body += [K.WgmmaFence()]
    for step, (ai, sc) in enumerate(zip(a_index, scale)):
        ai = ai if isinstance(ai, K.KExpr) else K.Const(ai)
        body.append(K.Wgmma(acc, K.TensorIndex(sa, ai), K.TensorIndex(sb, K.Const(16 * step)),
                            n, BF16, K.Const(sc, "bool")))
    body += [K.WgmmaCommit()] + ([K.WgmmaWait(0), K.AccumulatorFence(acc)] if wait else [])
    return b.kernel(body, block=block), acc, body


def fragment(d):
    """d [64, n] scattered as the accumulator fragment: [128 threads, n / 2 registers]."""
    n = d.shape[1]
    out = np.empty((128, n // 2))
    for t in range(128):
        w, lane = divmod(t, 32)
        for i in range(n // 2):
            out[t, i] = d[16 * w + lane // 4 + 8 * ((i >> 1) & 1),
                          8 * (i >> 2) + 2 * (lane % 4) + (i & 1)]
    return out


@pytest.mark.parametrize("n", [16, 64])
def test_two_wgmma_k_steps_match_float64_in_the_fragment_layout(n):
    torch.manual_seed(n)
    a = torch.randn(64, 32).to(torch.bfloat16)
    bm = torch.randn(n, 32).to(torch.bfloat16)
    k, acc, _ = wgmma_kernel(linear_fusion(), n)
    _, it = run(k, [a, bm], check_output_writes=False)
    A, B = a.double().numpy(), bm.double().numpy()
    first = f32(A[:, :16] @ B[:, :16].T)                     # scale_d false: replaces
    want = f32(first + A[:, 16:32] @ B[:, 16:32].T)           # scale_d true: adds
    assert (regs_of(it, acc) == fragment(want)).all()
    assert np.abs(regs_of(it, acc) - fragment(A @ B.T)).max() < 1e-4


def test_a_wgmma_whose_k_offset_steps_within_the_swizzled_row():
    """K steps 2 and 3 of a 64-wide box (bytes 64 and 96 of each row, swizzled with the row)."""
    a = torch.randn(64, 64).to(torch.bfloat16)
    bm = torch.randn(16, 64).to(torch.bfloat16)
    k, acc, body = wgmma_kernel(linear_fusion(), 16, a_index=(32, 48))
    for w, kb in zip([s for s in body if isinstance(s, K.Wgmma)], (32, 48)):
        w.b = K.TensorIndex(w.b.buffer, K.Const(kb))
    _, it = run(k, [a, bm], check_output_writes=False)
    A, B = a.double().numpy(), bm.double().numpy()
    want = f32(f32(A[:, 32:48] @ B[:, 32:48].T) + A[:, 48:64] @ B[:, 48:64].T)
    assert (regs_of(it, acc) == fragment(want)).all()


def test_a_wgmma_operand_not_uniform_or_misaligned_fails():
    a = torch.randn(64, 32).to(torch.bfloat16)
    bm = torch.randn(16, 32).to(torch.bfloat16)
    fd = linear_fusion()
    uneven = K.mul(K.div(TID, 64), 16)                       # 0 for warps 0-1, 16 for 2-3
    k, _, _ = wgmma_kernel(fd, 16, a_index=(uneven, 16))
    with pytest.raises(InterpreterError, match=r"wgmma operand A smA\[.*\] is not uniform over "
                                               r"the warp group: element 0 for its first thread, "
                                               r"16 at .*threadIdx.x=64"):
        run(k, [a, bm], check_output_writes=False)
    for bad, byte in ((8, 16), (64, 128), (64 * 8 + 8, 1040)):
        k, _, _ = wgmma_kernel(fd, 16, a_index=(bad, 16))
        with pytest.raises(InterpreterError, match=rf"starts at element {bad} of smA \(byte "
                                                   rf"{byte} of shared memory\)"):
            run(k, [a, bm], check_output_writes=False)
    k, _, _ = wgmma_kernel(fd, 16, a_index=(64 * 8, 16))      # rows 8..71: past the buffer
    with pytest.raises(InterpreterError, match=r"64 rows from element 512 reach element \d+, "
                                               r"outside \[0, 4096\) of smA"):
        run(k, [a, bm], check_output_writes=False)


def test_a_wgmma_of_an_incomplete_warp_group_fails():
    a = torch.randn(64, 32).to(torch.bfloat16)
    bm = torch.randn(16, 32).to(torch.bfloat16)
    k, _, body = wgmma_kernel(linear_fusion(), 16)
    j = next(i for i, s in enumerate(body) if isinstance(s, K.Wgmma))
    body[j] = K.IfThenElse(K.lt(TID, 96), [body[j]])
    with pytest.raises(InterpreterError, match="Wgmma is reached by 96 of the 128 threads of a "
                                               "warp group"):
        run(k, [a, bm], check_output_writes=False)
    k, _, _ = wgmma_kernel(linear_fusion(), 16, block=160)   # a second, partial warp group
    with pytest.raises(InterpreterError, match="WgmmaFence is reached by 32 of the 128 threads"):
        run(k, [a, bm], check_output_writes=False)


def test_a_wgmma_reading_unwritten_operands_or_accumulators_fails():
    a = torch.randn(64, 32).to(torch.bfloat16)
    bm = torch.randn(16, 32).to(torch.bfloat16)
    k, _, body = wgmma_kernel(linear_fusion(), 16)
    body[:] = [s for s in body
               if not (isinstance(s, K.TensorMapLoad) and s.dst.buffer.name == "smB")]
    with pytest.raises(InterpreterError, match=r"wgmma operand B smB\[0\] reads its row 0, K "
                                               r"element 0 \(element 0 of smB\), which was never "
                                               r"written"):
        run(k, [a, bm], check_output_writes=False)
    k, _, _ = wgmma_kernel(linear_fusion(), 16, scale=(True, True))
    with pytest.raises(InterpreterError, match=r"wgmma accumulates into acc\[0\], which was "
                                               r"never written"):
        run(k, [a, bm], check_output_writes=False)


def test_accumulators_read_before_the_wgmma_wait_fail():
    a = torch.randn(64, 32).to(torch.bfloat16)
    bm = torch.randn(16, 32).to(torch.bfloat16)
    k, acc, body = wgmma_kernel(linear_fusion(), 16, wait=False)
    sc = shared("smC", BF16, 64 * 16)
    body += [K.Allocate(sc), K.StMatrix(K.TensorIndex(sc, K.mul(K.mod(TID, 32), 8)),
                                        [K.TensorIndex(acc, K.Const(i)) for i in range(8)], BF16)]
    with pytest.raises(InterpreterError, match=r"read of acc\[0\]: accumulator acc of a wgmma "
                                               r"that no wgmma.wait_group has completed"):
        run(k, [a, bm], check_output_writes=False)
    k, _, body = wgmma_kernel(linear_fusion(), 16, wait=False)
    with pytest.raises(InterpreterError, match="the kernel ends with a wgmma into acc never "
                                               "waited for"):
        run(k, [a, bm], check_output_writes=False)
    body += [K.WgmmaWait(1)]                  # the one group may stay pending: still not done
    with pytest.raises(InterpreterError, match="never waited for"):
        run(k, [a, bm], check_output_writes=False)
    body[-1] = K.WgmmaWait(0)
    run(k, [a, bm], check_output_writes=False)


# stmatrix ---------------------------------------------------------------------------------------
def stmatrix_kernel(values=None, dst=None, block=32, pred=None, size=256):
    b = Builder(linear_fusion())
    sm = shared("smS", BF16, size)
    lane = K.mod(TID, 32)
    # matrix l / 8 at element 64 (l / 8), its row l % 8 at 8 (l % 8)
    dst = dst if dst is not None else K.add(K.mul(K.div(lane, 8), 64), K.mul(K.mod(lane, 8), 8))
    values = values or [K.add(K.mul(TID, 8), j) for j in range(8)]
    st = K.StMatrix(K.TensorIndex(sm, dst), values, BF16)
    body = [K.Allocate(sm), st if pred is None else K.IfThenElse(pred, [st])]
    return b.kernel(body, block=block), sm, body


def test_stmatrix_lands_each_lanes_pairs_where_the_formula_says():
    k, sm, _ = stmatrix_kernel()
    a, bm = torch.zeros(1, 16).bfloat16(), torch.zeros(8, 16).bfloat16()
    _, it = run(k, [a, bm], check_output_writes=False)
    vals, written = smem_of(it, sm)
    assert written.all()
    for mat in range(4):
        for row in range(8):
            for col in range(8):
                lane = 4 * row + col // 2               # the lane holding (row, col) of mat
                want = lane * 8 + 2 * mat + col % 2     # its value 2 mat + col % 2
                assert vals[64 * mat + 8 * row + col] == want, (mat, row, col)


def test_stmatrix_checks():
    a, bm = torch.zeros(1, 16).bfloat16(), torch.zeros(8, 16).bfloat16()
    k, _, _ = stmatrix_kernel(pred=K.lt(TID, 16))
    with pytest.raises(InterpreterError, match="StMatrix is reached by 16 of the 32 threads of "
                                               "a warp"):
        run(k, [a, bm], check_output_writes=False)
    never = K.Buffer("never", F32, "local", K.Const(8))
    k, _, body = stmatrix_kernel(values=[K.TensorIndex(never, K.Const(i)) for i in range(8)])
    body.insert(0, K.Allocate(never))
    with pytest.raises(InterpreterError, match=r"stmatrix stores value 0 \(never\[0\]\), "
                                               r"computed from unwritten registers"):
        run(k, [a, bm], check_output_writes=False)
    k, _, _ = stmatrix_kernel(dst=K.add(K.mul(K.mod(TID, 32), 8), 4), size=512)
    with pytest.raises(InterpreterError, match=r"not 16-byte aligned at .*threadIdx.x=0"):
        run(k, [a, bm], check_output_writes=False)
    k, _, _ = stmatrix_kernel(dst=K.mul(K.mod(TID, 32), 8 * 2))   # lane 16's row at 256
    with pytest.raises(InterpreterError, match=r"elements \[256, 264\) outside \[0, 256\) of "
                                               r"smS"):
        run(k, [a, bm], check_output_writes=False)


# A whole tile: TMA loads, wgmma, stmatrix, TMA store ---------------------------------------------
def matmul_kernel(fd, n, k_steps):
    """C[M, N] = A[M, K] @ B[N, K]^T, bf16, one 64 x n tile per block along x (N <= n)."""
    b = Builder(fd)
    ta = K.TileBoxMap("input", 0, inner=1, outer=0, box_cols=64, box_rows=64)
    tb = K.TileBoxMap("input", 1, inner=1, outer=0, box_cols=64, box_rows=n)
    tc = K.TileBoxMap("output", 0, inner=1, outer=0, box_cols=64, box_rows=64)
    A, B, C = b.input(0, BF16), b.input(1, BF16), b.output(0, BF16)
    tma, tmb, tmc = b.tmap("tmA", ta), b.tmap("tmB", tb), b.tmap("tmC", tc)
    sa, sb, sc = (shared("smA", BF16, 64 * 64), shared("smB", BF16, 64 * n),
                  shared("smC", BF16, 64 * n))
    acc = K.Buffer("acc", F32, "local", K.Const(n // 2))
    m0 = K.mul(BIDX, 64)
    body = b.barrier_setup() + [
        K.Allocate(sa), K.Allocate(sb), K.Allocate(sc), K.Allocate(acc),
        b.load(K.TensorIndex(sa, K.Const(0)), tma, ta, A, (0, m0)),
        b.load(K.TensorIndex(sb, K.Const(0)), tmb, tb, B, (0, 0))]
    body += b.arrive_and_wait() + [K.WgmmaFence()]
    for step in range(k_steps):
        body.append(K.Wgmma(acc, K.TensorIndex(sa, K.Const(16 * step)),
                            K.TensorIndex(sb, K.Const(16 * step)), n, BF16,
                            K.Const(step > 0, "bool")))
    body += [K.WgmmaCommit(), K.WgmmaWait(0), K.AccumulatorFence(acc)]
    # stmatrix: lane l of warp w addresses row 16 w + 8 (p % 2) + l % 8 (p = l / 8) at column
    # 16 q + 8 (p / 2) of the 64-column box, whose 16-byte unit is swizzled with the row.
    lane = K.mod(TID, 32)
    p = K.div(lane, 8)
    row = K.add(K.add(K.mul(K.div(TID, 32), 16), K.mul(K.mod(p, 2), 8)), K.mod(lane, 8))
    for q in range(n // 16):
        unit = K.add(2 * q, K.div(p, 2))
        col = K.mul(K.Bin("^", unit, K.mod(row, 8)), 8)
        body.append(K.StMatrix(K.TensorIndex(sc, K.add(K.mul(row, 64), col)),
                               [K.TensorIndex(acc, K.Const(8 * q + e)) for e in range(8)], BF16))
    body += [K.FenceProxyAsync(), K.BlockSync(),
             K.TensorMapStore(K.TensorIndex(sc, K.Const(0)), tmc, tc, C, [K.Const(0), m0],
                              predicate=FIRST),
             K.IfThenElse(FIRST, [K.BulkCommit(), K.BulkWait(0, read=True)])]
    return b.kernel(body, grid=(2, 1, 1))


def test_a_whole_tile_through_tma_wgmma_stmatrix_and_a_tma_store():
    """A ragged 100 x 56 = [100, 32] @ [56, 32]^T: two blocks of 64 rows, n = 64 (B's rows
    56..63 and A's columns 32..63 zero-filled; C's rows 100.. and columns 56.. dropped)."""
    torch.manual_seed(0)
    a = torch.randn(100, 32).to(torch.bfloat16)
    bm = torch.randn(56, 32).to(torch.bfloat16)
    fd = linear_fusion()
    k = matmul_kernel(fd, 64, 2)
    verify_kernel(k)
    (c,), it = run(k, [a, bm])                  # each element of C written exactly once
    A, B = a.double().numpy(), bm.double().numpy()
    want = bf16(f32(f32(A[:, :16] @ B[:, :16].T) + A[:, 16:] @ B[:, 16:].T))
    assert (c.double().numpy() == want).all()
    torch.testing.assert_close(c, torch.nn.functional.linear(a.float(), bm.float()).bfloat16(),
                               rtol=1e-2, atol=1e-2)
    text = kernel_str(k)
    for line in ("tensor_map_load smA[0] <- tmA[0, (blockIdx.x * 64)] tile of input 0 (rows "
                 "along dim 0, columns along dim 1) box 64x64 swizzle 128",
                 "wgmma.fence", "wgmma.m64n64k16.bfloat16 acc[32] = smA[16] @ smB[16]^T + "
                 "(True ? acc : 0) (swizzle 128)", "wgmma.commit_group", "wgmma.wait_group 0",
                 "accumulator_fence acc", "stmatrix.x4.bfloat16 smC[",
                 "fence.proxy.async.shared::cta",
                 "if (threadIdx.x == 0): tensor_map_store tmC[0, (blockIdx.x * 64)] <- smC[0] "
                 "tile of output 0", "bulk_commit_group", "bulk_wait_group.read 0"):
        assert line in text, (line, text)


def test_a_wrong_stmatrix_swizzle_or_fragment_is_caught_by_the_values():
    """The unswizzled stmatrix address (a lowering bug) stores the tile permuted: the output
    differs (the interpreter runs it; the comparison with the reference catches it)."""
    torch.manual_seed(1)
    a = torch.randn(100, 32).to(torch.bfloat16)
    bm = torch.randn(56, 32).to(torch.bfloat16)
    k = matmul_kernel(linear_fusion(), 64, 2)
    for s in K.walk(k.body):
        if isinstance(s, K.StMatrix):           # drop the XOR: column unit not swizzled
            idx = s.dst.index
            s.dst = K.TensorIndex(s.dst.buffer, K.add(idx.a, K.mul(idx.b.a.a, 8)))
    (c,), _ = run(k, [a, bm])
    ref = torch.nn.functional.linear(a.float(), bm.float())
    assert (c.float() - ref).abs().max() > 0.5


# Printer and verifier ---------------------------------------------------------------------------
def test_the_verifier_refuses_malformed_matmul_nodes():
    fd = linear_fusion()
    k = matmul_kernel(fd, 64, 2)
    wg = next(s for s in k.body if isinstance(s, K.Wgmma))
    wg.n = 60
    with pytest.raises(KernelIRError, match="n is a multiple of 8"):
        verify_kernel(k)
    wg.n = 32
    with pytest.raises(KernelIRError, match="accumulator acc is not 16 float registers"):
        verify_kernel(k)
    k = matmul_kernel(fd, 64, 2)
    st = next(s for s in k.body if isinstance(s, K.TensorMapStore))
    st.coords = st.coords[:1]
    with pytest.raises(KernelIRError, match="1 coordinates for a 2-D box"):
        verify_kernel(k)
    k = matmul_kernel(fd, 64, 2)
    sm = next(s for s in k.body if isinstance(s, K.StMatrix))
    sm.values = sm.values[:4]
    with pytest.raises(KernelIRError, match="8 values per lane, not 4"):
        verify_kernel(k)


def test_a_copy_over_a_wgmma_operand_before_its_wait_fails():
    """The slot is refilled after a block barrier but before the wgmma.wait_group: the wgmma
    may still be reading it."""
    a = torch.randn(64, 32).to(torch.bfloat16)
    bm = torch.randn(16, 32).to(torch.bfloat16)
    k, _, body = wgmma_kernel(linear_fusion(), 16, wait=False)
    load = next(s for s in body if isinstance(s, K.TensorMapLoad) and s.dst.buffer.name == "smA")
    refill = [K.BlockSync(), load, K.IfThenElse(FIRST, [K.MBarrierArrive(load.bar)]),
              K.MBarrierWait(load.bar, K.Const(1))]
    body += refill + [K.WgmmaWait(0)]
    with pytest.raises(InterpreterError, match="a copy overwrote element 0 of smA while a wgmma "
                                               "reading it was in flight"):
        run(k, [a, bm], check_output_writes=False)
    body[-5:] = [K.WgmmaWait(0)] + refill                    # waited first: fine
    run(k, [a, bm], check_output_writes=False)
    body[-4:-3] = []                                         # no barrier after the reads
    with pytest.raises(InterpreterError, match="overwrites data the block read with no barrier"):
        run(k, [a, bm], check_output_writes=False)
