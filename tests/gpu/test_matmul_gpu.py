"""The generated Hopper matmul on the GPU (schedulers/matmul.py, lower/matmul.py): square,
ragged, tall-skinny, small-K and one-tile shapes of linear (x @ w^T) and matmul with a K-major
b, bf16 and fp16, outputs poisoned and compared with float64 (run_and_check); what ran is
asserted (the matmul scheduler, one kernel, no fallback); b MN-major (row-major [K, N]) too.
Batches go through 3-D tensor maps. Layouts the kernel does not take (a column-major a, K not
a multiple of 8, a batch broadcast against another) run torch's matmul in a library segment,
also checked."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.testing import run_and_check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


# Matmuls of 64 rows or fewer run torch's matmul unless the kernel is asked for
# (schedulers/matmul.FEW_ROWS).
FEW_ROWS = {"enable": ["matmul_few_rows"]}


def _few(m, opts=None):
    """`opts` with the feature matmul_few_rows added when m is 64 or fewer."""
    if m > 64:
        return opts
    return {"enable": list((opts or {}).get("enable", [])) + FEW_ROWS["enable"]}


def _linear_fd(x, w):
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.linear(fd.from_pytorch(x), fd.from_pytorch(w)))
    return fd


def _matmul_fd(a, b):
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.matmul(fd.from_pytorch(a), fd.from_pytorch(b)))
    return fd


@pytest.mark.parametrize("m, n, k", [
    (128, 128, 64),          # one tile, one k block
    (129, 264, 72),          # ragged in all three
    (1000, 1000, 1000),
    (1024, 1024, 1024),
    (3000, 2056, 1032),      # 1.6 waves of 128x256 tiles
    (2048, 256, 4096),       # tall-skinny
    (64, 4096, 512),         # tiny M
    (512, 512, 8),           # K shorter than a box: the box's rest zero-filled
    (4096, 4096, 4096),      # 128x256 tiles, the persistent loop over several tiles per CTA
    (300, 4104, 2056),       # N past a 256 multiple by 8
])
def test_linear(m, n, k):
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    run_and_check(_linear_fd(x, w), [x, w], scheduler="matmul", options=_few(m))


def test_fp16_and_a_transposed_weight():
    a = torch.randn(777, 520, device="cuda", dtype=torch.float16)
    w = torch.randn(392, 520, device="cuda", dtype=torch.float16)
    b = w.t()                    # [K, N], K the stride-1 dim: K-major
    run_and_check(_matmul_fd(a, b), [a, b], scheduler="matmul")


def test_the_persistent_tile_order_covers_every_tile():
    # More tiles than CTAs, tile rows not a multiple of the raster band (8): every output tile
    # written once (poisoned outputs would show a missed one).
    x = torch.randn(128 * 13 + 5, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(256 * 23, 256, device="cuda", dtype=torch.bfloat16)
    fd = _linear_fd(x, w)
    run_and_check(fd, [x, w], scheduler="matmul")
    (p,) = fd.last_run.heuristics
    assert p.grid < 14 * 23, p


@pytest.mark.parametrize("m, n, k", [(128, 64, 64), (129, 264, 72), (1000, 1000, 1000),
                                     (300, 4104, 2056), (4096, 4096, 4096), (64, 520, 8)])
def test_mn_major_b(m, n, k):
    # torch.matmul's usual operands: b row-major [K, N].
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    fd = _matmul_fd(a, b)
    run_and_check(fd, [a, b], scheduler="matmul", options=_few(m))
    assert fd.last_run.heuristics[0].b_major == "MN"


@pytest.mark.parametrize("m, n, k, mn, tile", [
    (3000, 2056, 1032, False, (128, 192, 1)),   # 2 waves of 128x192: one staging box
    (3000, 2056, 1032, True, (128, 192, 1)),    # B MN-major: 3 boxes of 64 N per stage
    (1000, 1000, 1000, False, (128, 64, 2)),    # ping-pong 128x64 chosen: one tile per CTA
    (2048, 1024, 4096, False, (128, 128, 2)),   # 128 tiles of 128x128, 256 of 128x64
    (1, 4096, 4096, False, (128, 64, 2)),
])
def test_the_heuristics_tiles(m, n, k, mn, tile):
    # The tile and kind the cost model chooses (schedulers/matmul.estimated_us), run. Symbolic
    # [-1, -1] operands (fd.from_pytorch of a [1, K] tensor makes M a broadcast dim: the next
    # test).
    from pyfuser import DataType
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(*((k, n) if mn else (n, k)), device="cuda", dtype=torch.bfloat16)
    with FusionDefinition() as fd:
        ta, tb = (fd.define_tensor(shape=[-1, -1], dtype=DataType.BFloat16) for _ in range(2))
        fd.add_output(fd.ops.matmul(ta, tb) if mn else fd.ops.linear(ta, tb))
    run_and_check(fd, [a, b], scheduler="matmul", options=_few(m))
    p = fd.last_run.heuristics[0]
    assert (p.tile_m, p.tile_n, p.compute_roles) == tile, p


@pytest.mark.parametrize("case", ["linear", "matmul_mn", "residual"])
def test_a_row_of_one_from_pytorch(case):
    # fd.from_pytorch of x [1, K] (a decode step): A's M dim is a broadcast, one row in its map.
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4104, 4096, device="cuda", dtype=torch.bfloat16)
    inputs = [x, w.t().contiguous()] if case == "matmul_mn" else [x, w]
    with FusionDefinition() as fd:
        tx, tw = fd.from_pytorch(inputs[0]), fd.from_pytorch(inputs[1])
        if case == "matmul_mn":
            fd.add_output(fd.ops.matmul(tx, tw))
        elif case == "linear":
            fd.add_output(fd.ops.linear(tx, tw))
        else:
            r = torch.randn(1, 4104, device="cuda", dtype=torch.bfloat16)
            inputs.append(r)
            fd.add_output(fd.ops.add(fd.ops.linear(tx, tw), fd.from_pytorch(r)))
    run_and_check(fd, inputs, scheduler="matmul", options=FEW_ROWS)
    # Unasked, one row runs as a row reduction of the products (schedule/few_row_matmuls.py),
    # or torch's matmul (a library segment) where the weight is not read along K (matmul_mn:
    # b [K, N] row-major), checked too.
    out = fd.execute(inputs)[0]
    run = fd.last_run
    assert "matmul" not in run.schedulers and run.kind != "reference", run
    if case == "matmul_mn":
        assert any(s.kind == "library" for s in run.segments), run
    else:
        assert run.schedulers == ("reduction",), run
        assert "a row reduction of the products" in run.reason, run.reason
    ref = torch.nn.functional.linear(inputs[0].double(), w.double())
    if case == "residual":
        ref = ref + inputs[2].double()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.parametrize("m, n, k, mn", [(129, 264, 72, False), (1000, 1000, 1000, True),
                                         (4096, 4096, 4096, False), (300, 4104, 2056, True),
                                         (64, 520, 8, False)])
def test_pingpong(m, n, k, mn):
    # Two compute warp groups take whole tiles in turn (options feature matmul_pingpong).
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    if mn:
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        fd = _matmul_fd(a, b)
    else:
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        fd = _linear_fd(a, b)
    run_and_check(fd, [a, b], scheduler="matmul",
                  options=_few(m, {"enable": ["matmul_pingpong"]}))
    assert fd.last_run.heuristics[0].compute_roles == 2


@pytest.mark.parametrize("case", ["column_major_a_odd_m", "k_not_multiple_of_8",
                                  "broadcast_batch"])
def test_layouts_the_kernel_does_not_take_run_torch(case):
    if case == "column_major_a_odd_m":      # K rows of 255 elements: not 16-byte aligned
        a = torch.randn(192, 255, device="cuda", dtype=torch.bfloat16).t()
        b = torch.randn(192, 320, device="cuda", dtype=torch.bfloat16)
    elif case == "k_not_multiple_of_8":
        a = torch.randn(256, 100, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(320, 100, device="cuda", dtype=torch.bfloat16).t()
    else:                    # a batch of one broadcast against a batch of three
        a = torch.randn(1, 256, 192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(3, 192, 320, device="cuda", dtype=torch.bfloat16)
    fd = _matmul_fd(a, b)
    out = fd.execute([a, b])[0]
    run = fd.last_run
    assert run.kind != "reference" and "matmul" not in run.schedulers, run
    ref = torch.matmul(a.double(), b.double())
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2


def _epilogue_case(kind, m, n, k):
    """x @ w^T and an epilogue of `kind`; bias_and_gelu and residual_relu store two outputs
    (the pre-activation beside its activation)."""
    F32 = torch.float32
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 8
    with FusionDefinition() as fd:
        tx, tw = fd.from_pytorch(x), fd.from_pytorch(w)
        if kind == "bias_gelu":
            b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
            y = fd.ops.gelu(fd.ops.linear(tx, tw, fd.from_pytorch(b)), approximate="tanh")
            extra = [b]
        elif kind == "bias_and_gelu":
            b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
            h = fd.ops.linear(tx, tw, fd.from_pytorch(b))
            fd.add_output(h)
            y = fd.ops.gelu(h, approximate="tanh")
            extra = [b]
        elif kind == "residual_relu":
            r = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            h = fd.ops.linear(tx, tw) + fd.from_pytorch(r)
            fd.add_output(fd.ops.relu(h))
            y = h
            extra = [r]
        elif kind == "residual":
            r = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            y = fd.ops.linear(tx, tw) + fd.from_pytorch(r)
            extra = [r]
        else:                                   # row and column scales, SiLU in fp32
            sr = torch.rand(m, device="cuda", dtype=F32) + 0.5
            sc = torch.rand(n, device="cuda", dtype=F32)
            tsr, tsc = fd.from_pytorch(sr), fd.from_pytorch(sc)
            h = fd.ops.cast(fd.ops.linear(tx, tw), tsr.dtype)
            h = h * fd.ops.broadcast(tsr, [False, True]) * fd.ops.broadcast(tsc, [True, False])
            y = fd.ops.cast(fd.ops.silu(h), tx.dtype)
            extra = [sr, sc]
        fd.add_output(y)
    return fd, [x, w] + extra


@pytest.mark.parametrize("kind", ["bias_gelu", "residual", "scales_silu"])
@pytest.mark.parametrize("m, n, k", [(129, 264, 72), (1000, 1000, 1000), (2048, 4096, 512)])
@pytest.mark.parametrize("pingpong", [False, True])
def test_fused_epilogue(kind, m, n, k, pingpong):
    fd, inputs = _epilogue_case(kind, m, n, k)
    opts = {"enable": ["matmul_pingpong"]} if pingpong else None
    run_and_check(fd, inputs, scheduler="matmul", options=opts)


@pytest.mark.parametrize("kind", ["bias_and_gelu", "residual_relu"])
@pytest.mark.parametrize("m, n, k", [(129, 264, 72), (2048, 4096, 512)])
@pytest.mark.parametrize("pingpong", [False, True])
def test_two_stored_outputs(kind, m, n, k, pingpong):
    """A pre-activation stored beside its activation by one matmul kernel (each output its own
    staging boxes and TMA store)."""
    fd, inputs = _epilogue_case(kind, m, n, k)
    opts = {"enable": ["matmul_pingpong"]} if pingpong else None
    run_and_check(fd, inputs, scheduler="matmul", options=opts)
    assert len(fd.fusion.outputs) == 2 and fd.last_run.heuristics[0].outputs == 2


@pytest.mark.parametrize("case", ["bmm", "bmm_k_major", "linear_3d", "a3_b2", "a2_b3",
                                  "linear_3d_bias_gelu"])
def test_batched(case):
    bf = torch.bfloat16
    B, M, N, K = 3, 1000, 1032, 520
    if case == "bmm":
        inputs = [torch.randn(B, M, K, device="cuda", dtype=bf),
                  torch.randn(B, K, N, device="cuda", dtype=bf)]
    elif case == "bmm_k_major":
        inputs = [torch.randn(B, M, K, device="cuda", dtype=bf),
                  torch.randn(B, N, K, device="cuda", dtype=bf).transpose(1, 2)]
    elif case == "a3_b2":
        inputs = [torch.randn(B, M, K, device="cuda", dtype=bf),
                  torch.randn(K, N, device="cuda", dtype=bf)]
    elif case == "a2_b3":
        inputs = [torch.randn(M, K, device="cuda", dtype=bf),
                  torch.randn(B, K, N, device="cuda", dtype=bf)]
    else:
        inputs = [torch.randn(B, M, K, device="cuda", dtype=bf),
                  torch.randn(N, K, device="cuda", dtype=bf) / 16]
    with FusionDefinition() as fd:
        ta, tb = (fd.from_pytorch(t) for t in inputs)
        if case.startswith("linear"):
            if case.endswith("gelu"):
                inputs.append(torch.randn(N, device="cuda", dtype=bf))
                y = fd.ops.gelu(fd.ops.linear(ta, tb, fd.from_pytorch(inputs[-1])),
                                approximate="tanh")
            else:
                y = fd.ops.linear(ta, tb)
        else:
            y = fd.ops.matmul(ta, tb)
        fd.add_output(y)
    run_and_check(fd, inputs, scheduler="matmul")


@pytest.mark.parametrize("case, options", [
    ("bmm4", None),
    ("bmm4", {"enable": ["matmul_cluster"], "disable": ["matmul_pingpong"]}),
    ("bmm4", {"enable": ["matmul_stream_k", "matmul_few_rows"]}),
    ("heads", None),                 # q [B, S, H, D] as [B, H, S, D]: batch strides not nested
    ("heads_scale_mask", None),      # scores * scale + mask [B, 1, S, S]: an attention epilogue
    ("bmm5", None),
    ("linear4_residual", {"enable": ["matmul_pingpong"]}),
])
def test_batch_dims(case, options):
    """Matmuls of 2 and 3 batch dims as one kernel (tensor maps of 4 and 5 dims), fused
    epilogues over the 4-D output, against float64 with outputs poisoned."""
    bf = torch.bfloat16

    def rnd(*shape):
        return torch.randn(*shape, device="cuda", dtype=bf)
    B, H, M, N, K = 2, 3, 1000, 1032, 264
    if case == "bmm4":
        inputs = [rnd(B, H, M, K), rnd(B, H, K, N)]
    elif case.startswith("heads"):
        # q and k of [B, S, H, D] (a projection's output viewed per head), scores q @ k^T.
        inputs = [rnd(B, M, H, K).transpose(1, 2), rnd(B, N, H, K).permute(0, 2, 3, 1)]
        if case.endswith("mask"):
            inputs += [rnd(B, 1, M, N)]
    elif case == "bmm5":
        inputs = [rnd(2, 2, 2, 520, K), rnd(2, 2, 2, K, 264)]
    else:
        inputs = [rnd(B, H, M, K), rnd(N, K) / 16, rnd(B, H, M, N)]
    with FusionDefinition() as fd:
        ts = [fd.from_pytorch(t) for t in inputs]
        if case == "linear4_residual":
            y = fd.ops.relu(fd.ops.linear(ts[0], ts[1]) + ts[2])
        else:
            y = fd.ops.matmul(ts[0], ts[1])
            if case.endswith("mask"):
                y = y * K ** -0.5 + ts[2]
        fd.add_output(y)
    run_and_check(fd, inputs, scheduler="matmul", options=options)
    p = fd.last_run.heuristics[0]
    want = {"matmul_cluster": p.cluster > 1, "matmul_stream_k": p.stream_k > 0,
            "matmul_pingpong": p.compute_roles == 2}
    for feature in (options or {}).get("enable", []):
        assert want.get(feature, True), (feature, p)


def test_scores_of_a_permuted_k_are_a_view_and_one_kernel():
    """q @ permute(k, [0, 1, 3, 2]) * scale + mask in the fusion (as a model's code writes
    attention scores): k's permute is a view segment (no transpose kernel) and the matmul one
    kernel reading it K-major, the mask through the staging boxes."""
    bf = torch.bfloat16
    q, k = (torch.randn(2, 3, 1000, 136, device="cuda", dtype=bf) for _ in range(2))
    mask = torch.randn(2, 1, 1000, 1000, device="cuda", dtype=bf)
    with FusionDefinition() as fd:
        tq, tk, tm = (fd.from_pytorch(t) for t in (q, k, mask))
        scores = fd.ops.matmul(tq, fd.ops.permute(tk, [0, 1, 3, 2]))
        fd.add_output(fd.ops.add(fd.ops.mul(scores, 136 ** -0.5), tm))
    run_and_check(fd, [q, k, mask], kernels=1, segments=(("view", "view"), ("kernel", "matmul")))
    p = fd.last_run.heuristics[0]
    assert p.b_major == "K" and p.staged_input >= 0, p


# Split-K (MatmulParams.split_k, kir SplitKReduce): the feature matmul_split_k forces it where
# the tiles leave CTAs idle; the last CTA of a tile adds the partials in split order, so two
# runs give the same bits whichever CTA finished last.
SPLIT_K = ["matmul_split_k", "matmul_few_rows"]


def _checked_twice(fd, inputs, opts):
    """run_and_check under `opts`, then two more runs with the same bits (partial sums added
    in a fixed order): the heuristic's parameters."""
    run_and_check(fd, inputs, scheduler="matmul", options=opts)
    p = fd.last_run.heuristics[0]
    first = fd.execute(inputs, options=opts)
    again = fd.execute(inputs, options=opts)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    return p


def _split_k_run(fd, inputs, pingpong):
    opts = ({"enable": SPLIT_K + ["matmul_pingpong"]} if pingpong else
            {"enable": SPLIT_K, "disable": ["matmul_pingpong"]})
    p = _checked_twice(fd, inputs, opts)
    assert p.split_k > 1 and (p.compute_roles == 2) == pingpong, p
    return p


@pytest.mark.parametrize("m, n, k, pingpong", [
    (64, 4096, 4096, False),     # the bar's few rows: a tile's second warp group has none
    (64, 4096, 4096, True),
    (1, 4096, 4096, False),      # one row: one valid row of each partial
    (50, 1000, 3000, False),     # ragged: N past a tile, the last split's blocks past K
    (130, 264, 1032, True),      # two tile rows, the second of 2 rows
    (300, 512, 8192, False),     # several tile rows and a long K
])
def test_split_k(m, n, k, pingpong):
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    _split_k_run(_linear_fd(x, w), [x, w], pingpong)


@pytest.mark.parametrize("kind", ["bias_gelu", "bias_and_gelu", "scales_silu"])
@pytest.mark.parametrize("pingpong", [False, True])
def test_split_k_fused_epilogue(kind, pingpong):
    """The epilogue runs once per tile, on the summed accumulators, in the last CTA."""
    fd, inputs = _epilogue_case(kind, 96, 1032, 2048)
    _split_k_run(fd, inputs, pingpong)


def test_split_k_batched_mn_major():
    a = torch.randn(3, 40, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(3, 2048, 520, device="cuda", dtype=torch.bfloat16)
    p = _split_k_run(_matmul_fd(a, b), [a, b], False)
    assert p.b_major == "MN"


def test_split_k_counters_are_left_zeroed_across_shapes():
    """Launches of one compiled kernel at two shapes (each its own workspaces), in turn: the
    counters each launch leaves at zero are the next one's start."""
    w = torch.randn(2048, 4096, device="cuda", dtype=torch.bfloat16)
    for m in (64, 33, 64, 33):
        x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
        _split_k_run(_linear_fd(x, w), [x, w], False)


# Stream-K (MatmulParams.stream_k, lower/matmul.py stream_k_units): the feature matmul_stream_k
# forces it on cooperative tiles; a tile's runs spread over up to stream_k CTAs, whose partials
# the last adds in k order: two runs give the same bits.
STREAM_K = {"enable": ["matmul_stream_k", "matmul_few_rows"], "disable": ["matmul_pingpong"]}


def _stream_k_run(fd, inputs, opts=STREAM_K):
    p = _checked_twice(fd, inputs, opts)
    assert p.stream_k >= 2 and p.compute_roles == 1 and p.split_k == 1, p
    return p


@pytest.mark.parametrize("m, n, k", [
    (1536, 1536, 4096),      # 72 tiles of 128x192 under a wave: runs of about half a tile
    (768, 768, 8192),        # few tiles, long K: a tile over several CTAs
    (3000, 2056, 1032),      # ragged; tiles past a wave: data-parallel tiles, then stream-K
    (4096, 4096, 4096),      # several data-parallel waves before the stream-K part
    (129, 264, 4104),        # one or two tiles spread over many CTAs, K ragged
    (64, 4096, 4096),        # few rows: one valid warp group of each partial
])
def test_stream_k(m, n, k):
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    _stream_k_run(_linear_fd(x, w), [x, w])


@pytest.mark.parametrize("kind", ["bias_gelu", "bias_and_gelu", "scales_silu"])
def test_stream_k_fused_epilogue(kind):
    """The epilogue runs once per tile, on the summed accumulators, in the last CTA."""
    fd, inputs = _epilogue_case(kind, 520, 1032, 4096)
    _stream_k_run(fd, inputs)


def test_stream_k_batched_mn_major():
    a = torch.randn(3, 300, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(3, 2048, 520, device="cuda", dtype=torch.bfloat16)
    p = _stream_k_run(_matmul_fd(a, b), [a, b])
    assert p.b_major == "MN"


@pytest.mark.parametrize("m, n, k", [(768, 768, 8192), (256, 256, 16384)])
def test_stream_k_by_the_heuristic(m, n, k):
    """Few tiles of a long K: the heuristic's own choice is stream-K (no feature asked)."""
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    _stream_k_run(_linear_fd(x, w), [x, w], opts=None)


@pytest.mark.parametrize("tile", [(128, 64), (128, 128)])
def test_stream_k_partials_read_in_batches(tile):
    """The fixup's reads (codegen partial_reads): a 128x64 tile's thread reads two partials at
    once, a 128x128 tile's a whole partial; tiles of an odd and of an even count of partials
    (the last batch half full) are summed right, the same bits twice."""
    from pyfuser.runtime.device import query_device
    from pyfuser.schedule.schedulers import matmul
    m, n, k = 768, 768, 8192
    sms = query_device().sm_count
    tiles, k_blocks = (m // tile[0]) * (n // tile[1]), k // 64
    ctas = matmul.stream_k_choice(matmul.TileShape(*tile, 1, 0, 0), tiles, k_blocks, sms)
    dp, width = matmul.stream_k_width(tiles, k_blocks, sms, ctas)
    partials = {((t + 1) * k_blocks - 1) // width - t * k_blocks // width
                for t in range(tiles - dp)}
    assert {p % 2 for p in partials} == {0, 1}, partials
    p = matmul.fitted_params(*tile, 1, tiles, query_device(), 2, "K", (2,), 1, "K",
                             stream_k=ctas)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    assert _checked_twice(_linear_fd(x, w), [x, w], {"heuristic": p}) == p


def test_stream_k_counters_are_left_zeroed_across_shapes():
    """One compiled kernel at two shapes in turn: each launch leaves the counters at zero."""
    w = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16)
    for m in (512, 300, 512, 300):
        x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
        _stream_k_run(_linear_fd(x, w), [x, w])


# A column-major A (x.t() of a row-major [K, M]: MN-major, read with imm-trans-a).
@pytest.mark.parametrize("m, n, k, b_major, pingpong", [
    (256, 320, 192, "MN", False),    # both operands MN-major (a.t() @ b of row-major tensors)
    (1000, 1032, 520, "K", False),   # ragged
    (136, 264, 1032, "K", True),     # ping-pong
    (4096, 4096, 4096, "MN", False),
])
def test_column_major_a(m, n, k, b_major, pingpong):
    a = torch.randn(k, m, device="cuda", dtype=torch.bfloat16).t()
    if b_major == "MN":
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        fd = _matmul_fd(a, b)
    else:
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        fd = _linear_fd(a, b)
    opts = {"enable" if pingpong else "disable": ["matmul_pingpong"]}
    run_and_check(fd, [a, b], scheduler="matmul", options=opts)
    p = fd.last_run.heuristics[0]
    assert (p.a_major, p.b_major, p.compute_roles) == ("MN", b_major, 2 if pingpong else 1), p


def test_column_major_a_batched_with_an_epilogue():
    x = torch.randn(3, 520, 1000, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    w = torch.randn(1032, 520, device="cuda", dtype=torch.bfloat16) / 16
    bias = torch.randn(1032, device="cuda", dtype=torch.bfloat16)
    with FusionDefinition() as fd:
        y = fd.ops.linear(fd.from_pytorch(x), fd.from_pytorch(w), fd.from_pytorch(bias))
        fd.add_output(fd.ops.gelu(y, approximate="tanh"))
    run_and_check(fd, [x, w, bias], scheduler="matmul")
    assert fd.last_run.heuristics[0].a_major == "MN"


# fp32 outputs (the epilogue's fp32 staging: 8-byte shared stores, boxes of 64 x 32). Entries in
# {-1, 0, 1} with K <= 256 keep the bf16 matmul exact, so the fp32 results are compared with
# float64 at fp32's tolerance.
def _ints(*shape):
    return torch.randint(-1, 2, shape, device="cuda").to(torch.bfloat16)


@pytest.mark.parametrize("m, n, k", [(1000, 1032, 200), (4096, 4096, 256), (136, 72, 64)])
@pytest.mark.parametrize("pingpong", [False, True])
def test_fp32_output(m, n, k, pingpong):
    x, w = _ints(m, k), _ints(n, k)
    with FusionDefinition() as fd:
        y = fd.ops.linear(fd.from_pytorch(x), fd.from_pytorch(w))
        fd.add_output(fd.ops.cast(y, DataType.Float))
    opts = {"enable" if pingpong else "disable": ["matmul_pingpong"]}
    run_and_check(fd, [x, w], scheduler="matmul", options=opts)
    assert fd.last_run.heuristics[0].output_bytes == (4,)


@pytest.mark.parametrize("pingpong", [False, True])
def test_fp32_activation_beside_a_bf16_preactivation(pingpong):
    x, w, b = _ints(520, 128), _ints(1032, 128), _ints(1032)
    with FusionDefinition() as fd:
        h = fd.ops.linear(fd.from_pytorch(x), fd.from_pytorch(w), fd.from_pytorch(b))
        fd.add_output(h)
        fd.add_output(fd.ops.gelu(fd.ops.cast(h, DataType.Float), approximate="tanh"))
    opts = {"enable" if pingpong else "disable": ["matmul_pingpong"]}
    run_and_check(fd, [x, w, b], scheduler="matmul", options=opts)
    assert fd.last_run.heuristics[0].output_bytes == (2, 4)


@pytest.mark.parametrize("tile, roles, boxes, kind", [
    ((128, 192), 1, 3, "bias_gelu"),      # a tile's every box staged
    ((128, 256), 1, 4, "residual"),
    ((128, 256), 1, 1, "bias_gelu"),      # one box: a wait for the store before each chunk
    ((128, 128), 2, 4, "bias_and_gelu"),  # ping-pong, two stored outputs, 4 boxes each
])
def test_staging_boxes(tile, roles, boxes, kind):
    """MatmulParams.epilogue_boxes forced (the heuristic's fitting of the tile with that many
    staging boxes per warp group), on ragged tiles over several tiles per CTA."""
    from pyfuser.runtime.device import query_device
    from pyfuser.schedule.schedulers import matmul
    m, n, k = 1000, 1096, 264
    fd, inputs = _epilogue_case(kind, m, n, k)
    outputs = (2,) * len(fd.fusion.outputs)
    tiles = -(-m // tile[0]) * -(-n // tile[1])
    p = matmul.fitted_params(*tile, roles, tiles, query_device(), 2, "K", outputs,
                             epilogue_boxes=boxes)
    p = matmul.dataclasses.replace(p, grid=min(p.grid, 7))   # several tiles per CTA
    run_and_check(fd, inputs, scheduler="matmul", options={"heuristic": p})
    assert fd.last_run.heuristics[0] == p


# Clusters of 2 CTAs along M, B multicast (MatmulParams.cluster_m; the feature matmul_cluster
# forces it where the heuristic would not): ragged tile rows (the last cluster's second tile
# past M), ping-pong, MN-major B, batches, a staged residual; the launch's clusters and the
# persistent grid fitted to the clusters that fit are asserted.
CLUSTER = ["matmul_cluster"]


def _check_cluster(fd):
    run = fd.last_run
    (p,) = run.heuristics
    assert p.cluster_m == 2 and p.grid % 2 == 0, p
    assert run.clusters == ((2, 1, 1),), run


@pytest.mark.parametrize("m, n, k, pingpong", [
    (129, 264, 72, False),       # one cluster: the second tile row past M but one row
    (300, 1000, 520, False),     # 3 tile rows: the last cluster's second tile all past M
    (1000, 1000, 1000, True),
    (4096, 4096, 4096, False),   # the heuristic's own choice (no feature needed)
    (8192, 2048, 1024, False),
])
def test_cluster_multicast(m, n, k, pingpong):
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    fd = _linear_fd(x, w)
    opts = {"enable": CLUSTER + (["matmul_pingpong"] if pingpong else [])}
    run_and_check(fd, [x, w], scheduler="matmul", options=opts)
    _check_cluster(fd)


def test_cluster_is_the_heuristics_choice_and_fits_the_gpu():
    """4096^3 takes clusters unasked; the persistent grid is fitted to the clusters the GPU
    holds at once (64 of 2 on the H200, not 66)."""
    from pyfuser.runtime.device import query_device
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    fd = _linear_fd(x, w)
    run_and_check(fd, [x, w], scheduler="matmul")
    _check_cluster(fd)
    assert fd.last_run.heuristics[0].grid <= query_device().sm_count


@pytest.mark.parametrize("m, n, k, tile, roles", [
    (129, 264, 72, (128, 256), 1),      # two 64-row boxes each
    (1000, 1024, 520, (128, 128), 2),   # ping-pong: one box each
    (2048, 2048, 520, None, None),      # the heuristic's tile, clusters asked for
])
def test_cluster_mn_major_b(m, n, k, tile, roles):
    from pyfuser.runtime.device import query_device
    from pyfuser.schedule.schedulers import matmul
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    fd = _matmul_fd(a, b)
    if tile:
        tiles = -(-m // tile[0]) * -(-n // tile[1])
        opts = {"heuristic": matmul.fitted_params(*tile, roles, tiles, query_device(), 2, "MN",
                                                  cluster_m=2)}
    else:
        opts = {"enable": CLUSTER}
    run_and_check(fd, [a, b], scheduler="matmul", options=opts)
    _check_cluster(fd)
    assert fd.last_run.heuristics[0].b_major == "MN"


@pytest.mark.parametrize("kind", ["bias_gelu", "residual", "scales_silu"])
def test_cluster_fused_epilogue(kind):
    fd, inputs = _epilogue_case(kind, 1000, 1032, 520)
    run_and_check(fd, inputs, scheduler="matmul", options={"enable": CLUSTER})
    _check_cluster(fd)


def test_cluster_batched():
    a = torch.randn(3, 1000, 520, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(3, 520, 1032, device="cuda", dtype=torch.bfloat16)
    fd = _matmul_fd(a, b)
    run_and_check(fd, [a, b], scheduler="matmul", options={"enable": CLUSTER})
    _check_cluster(fd)


@pytest.mark.parametrize("m, n, k, tile, along", [
    (3000, 2056, 1032, (128, 192, 1), (2, 1)),   # 2064-byte rows: two L2 requests per box row
    (2040, 2048, 1000, (128, 256, 1), (2, 1)),   # 128 tiles, under a wave
    (1000, 1000, 1000, (128, 64, 2), (1, 2)),    # ping-pong 128x64 along N, A shared
    (1000, 1000, 1040, (128, 64, 2), (1, 1)),    # the same on sectors: no cluster
])
def test_rows_mid_sector_take_the_heuristics_clusters(m, n, k, tile, along):
    """Unforced: the tile and clusters schedulers/matmul.cluster_choice gives operands whose
    rows start mid-sector, run and checked."""
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    fd = _linear_fd(x, w)
    run_and_check(fd, [x, w], scheduler="matmul")
    (p,) = fd.last_run.heuristics
    assert (p.tile_m, p.tile_n, p.compute_roles) == tile, p
    assert (p.cluster_m, p.cluster_n) == along, p
    assert fd.last_run.clusters == ((p.cluster, 1, 1) if p.cluster > 1 else None,), \
        fd.last_run.clusters


@pytest.mark.parametrize("m, n, k, tile, roles, a_mn", [
    (1000, 1000, 1000, (128, 64), 2, False),     # 16 tile columns, rows mid-sector
    (300, 1000, 520, (128, 128), 1, False),      # the last cluster's second column past N
    (1000, 1032, 520, (128, 128), 2, True),      # A column-major: its two 64-row boxes shared
])
def test_cluster_along_n(m, n, k, tile, roles, a_mn):
    """Clusters along N (MatmulParams.cluster_n: A shared out, multicast), forced through the
    heuristic option."""
    from pyfuser.runtime.device import query_device
    from pyfuser.schedule.schedulers import matmul
    x = (torch.randn(k, m, device="cuda", dtype=torch.bfloat16).t() if a_mn else
         torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    tiles = -(-m // tile[0]) * -(-n // tile[1])
    p = matmul.fitted_params(*tile, roles, tiles, query_device(), 2, "K",
                             a_major="MN" if a_mn else "K", cluster_n=2)
    fd = _linear_fd(x, w)
    run_and_check(fd, [x, w], scheduler="matmul", options={"heuristic": p})
    assert fd.last_run.clusters == ((2, 1, 1),) and fd.last_run.heuristics[0].cluster_n == 2
