"""One small case per scheduler, run once each, for compute-sanitizer (memcheck, racecheck,
synccheck): `compute-sanitizer --tool racecheck python tools/sanitize_cases.py`;
`--pipelines` runs only the circular-buffered kernels (TMA, tensor-map, cp.async,
warp-specialized with one or two compute roles, the norm backward's two variants, the
matmul); `--matmul` only the matmul;
`--odd-rows` only the odd-row norm kernels (issue 16) and the looped cross-entropy;
`--logsumexp` only the one-pass
logsumexp's key reductions."""
import sys

import torch

from pyfuser import catalogue
from pyfuser.schedule.schedulers.reduction import ReductionParams

# col_sum 16384x256: the few-columns outer reduction, its rows split over 16 blocks whose steps
# interleave (the last steps partial).
CASES = [("gelu_bias", 33, 1000), ("silu_mul", 33, 1001), ("row_sum", 64, 4096), ("col_sum", 4096, 64),
         ("col_sum", 16383, 256),
         ("rmsnorm_fwd", 64, 4096), ("softmax", 37, 1000), ("rmsnorm_bwd", 300, 1024),
         ("layernorm_bwd", 300, 2048)]
PIPELINES_ONLY = "--pipelines" in sys.argv[1:]
if PIPELINES_ONLY:
    CASES = []


def _forced_matmul(what: str, fd, inputs, p, ref) -> None:
    """fd on `inputs` with the matmul parameters `p` forced: one matmul kernel, within 1% of
    `ref` (the norm of the error over the reference's)."""
    y = fd.execute(inputs, options={"heuristic": p})[0]
    torch.cuda.synchronize()
    err = ((y.float() - ref).norm() / ref.norm()).item()
    assert fd.last_run.schedulers == ("matmul",) and err < 1e-2, (fd.last_run, err)
    print(what, p.describe(), f"rel. error {err:.1e}", flush=True)


def matmul_cases() -> None:
    """The warp-specialized matmul (wgmma from swizzled tile boxes, stmatrix, TMA stores): each
    tile shape, cooperative and ping-pong, and in clusters of 2 (B or A multicast), on a grid
    of 2, so that each CTA runs several tiles and the stages wrap around across them; ragged
    M, N and K."""
    from pyfuser import DataType, FusionDefinition
    from pyfuser.schedule.schedulers.matmul import MatmulParams
    with FusionDefinition("linear") as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=DataType.BFloat16)
        w = fd.define_tensor(shape=[-1, -1], dtype=DataType.BFloat16)
        fd.add_output(fd.ops.linear(x, w))
    x = torch.randn(300, 200, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(520, 200, device="cuda", dtype=torch.bfloat16)
    ref = x.float() @ w.float().t()
    # (tile n, compute roles, CTAs per cluster along M (B multicast), along N (A multicast))
    for tn, roles, cm, cn in ((256, 1, 1, 1), (128, 1, 1, 1), (64, 1, 1, 1), (128, 2, 1, 1),
                              (64, 2, 1, 1), (256, 1, 2, 1), (128, 2, 2, 1), (64, 2, 1, 2)):
        p = MatmulParams(tile_m=128, tile_n=tn, stages=3, grid=2, compute_roles=roles,
                         cluster_m=cm, cluster_n=cn)
        _forced_matmul("matmul", fd, [x, w], p, ref)
    # A linear's bias read into registers when each tile starts (RegisterCopy), then GELU:
    # cooperative 128x192, ping-pong 128x64 in clusters along N, and stream-K (15 tiles of 4 k
    # blocks on 4 CTAs: 8 data-parallel, then runs of 7 blocks whose partials the tiles' first
    # runs wait for and add).
    bias = torch.randn(520, device="cuda", dtype=torch.bfloat16)
    with FusionDefinition("linear_bias_gelu") as fd:
        tx, tw, tb = (fd.from_pytorch(t) for t in (x, w, bias))
        fd.add_output(fd.ops.gelu(fd.ops.linear(tx, tw, tb), approximate="tanh"))
    ref = torch.nn.functional.gelu(x.float() @ w.float().t() + bias.float(), approximate="tanh")
    for p in (MatmulParams(tile_m=128, tile_n=192, stages=3, grid=2),
              MatmulParams(tile_m=128, tile_n=64, stages=3, grid=2, compute_roles=2,
                           cluster_n=2),
              MatmulParams(tile_m=128, tile_n=128, stages=3, grid=4, stream_k=3)):
        _forced_matmul("matmul + bias + gelu", fd, [x, w, bias], p, ref)
    # A batched matmul with B MN-major and a fused epilogue (3-D tensor maps, per-element
    # global reads of the residual).
    a = torch.randn(2, 200, 136, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2, 136, 264, device="cuda", dtype=torch.bfloat16)
    r = torch.randn(2, 200, 264, device="cuda", dtype=torch.bfloat16)
    with FusionDefinition("bmm_residual") as fd:
        ta, tb, tr = (fd.from_pytorch(t) for t in (a, b, r))
        fd.add_output(fd.ops.relu(fd.ops.matmul(ta, tb) + tr))
    # ... and the residual read through the staging boxes (TMA loads into them, ldmatrix), with
    # 1, 2 and all staging boxes of a tile, and in ping-pong.
    ref = torch.relu(a.float() @ b.float() + r.float())
    for p in (MatmulParams(tile_m=128, tile_n=128, stages=2, grid=2, b_major="MN"),
              MatmulParams(tile_m=128, tile_n=128, stages=2, grid=2, b_major="MN",
                           staged_input=2),
              MatmulParams(tile_m=128, tile_n=128, stages=2, grid=2, b_major="MN",
                           staged_input=2, epilogue_boxes=1),
              MatmulParams(tile_m=128, tile_n=192, stages=2, grid=2, b_major="MN",
                           staged_input=2, epilogue_boxes=3),
              MatmulParams(tile_m=128, tile_n=128, stages=2, grid=2, b_major="MN",
                           staged_input=2, compute_roles=2),
              MatmulParams(tile_m=128, tile_n=128, stages=2, grid=2, b_major="MN",
                           staged_input=2, cluster_m=2)):
        _forced_matmul("batched matmul + residual + relu", fd, [a, b, r], p, ref)
    # Attention-style scores over two batch dims (4-D tensor maps): q and k of [B, S, H, D]
    # seen per head, scaled, a mask of [B, 1, S, S] added; the mask staged or read per element.
    q = torch.randn(2, 136, 3, 72, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(2, 200, 3, 72, device="cuda", dtype=torch.bfloat16).permute(0, 2, 3, 1)
    mask = torch.randn(2, 1, 136, 200, device="cuda", dtype=torch.bfloat16)
    with FusionDefinition("scores") as fd:
        tq, tk, tm = (fd.from_pytorch(t) for t in (q, k, mask))
        fd.add_output(fd.ops.matmul(tq, tk) * 72 ** -0.5 + tm)
    ref = q.float() @ k.float() * 72 ** -0.5 + mask.float()
    for p in (MatmulParams(tile_m=128, tile_n=128, stages=2, grid=3, b_major="K"),
              MatmulParams(tile_m=128, tile_n=128, stages=2, grid=4, b_major="K",
                           compute_roles=2),
              MatmulParams(tile_m=128, tile_n=128, stages=2, grid=4, b_major="K",
                           cluster_m=2)):
        _forced_matmul("attention scores over [B, H] + mask", fd, [q, k, mask], p, ref)


def odd_row_cases() -> None:
    """Odd rows (issue 16): the norm backward's two-block plan with column partials in shared
    memory and the one-row block all-reduce of a partial warp (321 or 342 threads); RMSNorm
    forward of rows of 4097 with rstd; softmax and LayerNorm forward of rows of 50257, looped
    (each pass reads the row again)."""
    for name, m, n, dtype in (("layernorm_bwd", 1024, 5121, "fp16"),
                              ("rmsnorm_bwd", 1024, 4097, "fp16"),
                              ("rmsnorm_fwd", 2048, 4097, "bf16"),
                              ("softmax", 64, 50257, "bf16"),
                              ("layernorm_fwd", 64, 50257, "bf16")):
        fd = catalogue.define(name, dtype=dtype)
        fd.execute(catalogue.make_inputs(name, m, n, dtype=dtype, device="cuda"))
        torch.cuda.synchronize()
        p = fd.last_run.heuristics[0]
        print(name, dtype, m, n, f"blocks/SM {getattr(p, 'blocks_per_sm', '-')}",
              "looped" if getattr(p, "looped", False) else "", flush=True)
    # Cross-entropy's loss and dlogits over rows of 128256 (looped, its per-row loss and
    # index checks once per thread), with the one-hot an iota compare and a scatter.
    import os
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_issue17
    from pyfuser import DataType, FusionDefinition
    m, v = 64, 128256
    x = torch.randn(m, v, device="cuda", dtype=torch.bfloat16)
    t = torch.randint(0, v, (m,), device="cuda")
    for scatter in (False, True):
        with FusionDefinition("cross_entropy") as fd:
            bench_issue17.define_cross_entropy(fd, fd.from_pytorch(x), fd.from_pytorch(t), m, v,
                                               scatter=scatter)
        fd.execute([x, t])
        torch.cuda.synchronize()
        print("cross_entropy", "scatter" if scatter else "iota", m, v, fd.last_run.schedulers,
              "looped" if fd.last_run.heuristics[0].looped else "", flush=True)


def logsumexp_cases() -> None:
    """The one-pass logsumexp (schedule/logsumexp.py): int64 keys combined in registers, in a
    block reduction, and across blocks (a grid split of few long rows, forced)."""
    from pyfuser import DataType, FusionDefinition
    for m, n, params in ((64, 8192, None), (3, 1 << 18, None),
                         (9, 20000, ReductionParams(True, 8, 128, 1, 2, (0,), grid_split=4))):
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        with FusionDefinition("lse") as fd:
            xf = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
            mx = fd.ops.max(xf, [1], keepdim=True)
            s = fd.ops.sum(fd.ops.exp(fd.ops.sub(xf, mx)), [1], keepdim=True)
            fd.add_output(fd.ops.add(fd.ops.log(s), mx))
        y = fd.execute([x], options={"heuristic": params} if params else None)[0]
        torch.cuda.synchronize()
        err = (y.squeeze(1).double() - torch.logsumexp(x.double(), 1)).abs().max().item()
        assert fd.last_run.schedulers == ("reduction",) and err < 1e-3, (fd.last_run, err)
        print("logsumexp", m, n, fd.last_run.heuristics[0].describe(), f"max error {err:.1e}",
              flush=True)


if "--logsumexp" in sys.argv[1:]:
    logsumexp_cases()
    sys.exit(0)
if "--odd-rows" in sys.argv[1:]:
    odd_row_cases()
    sys.exit(0)


if "--matmul" in sys.argv[1:]:
    matmul_cases()
    sys.exit(0)
if PIPELINES_ONLY:
    matmul_cases()

for name, m, n in CASES:
    fd = catalogue.define(name)
    out = fd.execute(catalogue.make_inputs(name, m, n, device="cuda"))
    torch.cuda.synchronize()
    print(name, m, n, fd.last_run.schedulers, [tuple(o.shape) for o in out], flush=True)
# A grid-split reduction (last-block workspace reduction), forced.
if not PIPELINES_ONLY:
    fd = catalogue.define("col_sum")
    fd.execute(catalogue.make_inputs("col_sum", 2048, 256, device="cuda"),
               options={"heuristic": ReductionParams(False, 8, 32, 8, 2, (0,), 4)})
    torch.cuda.synchronize()
    print("col_sum grid split", fd.last_run.heuristics, flush=True)
# The TMA circular-buffered inner persistent kernel (forced), few blocks so stages wrap around.
for name, m, n in (("rmsnorm_fwd", 300, 2048), ("layernorm_fwd", 77, 1024)):
    fd = catalogue.define(name)
    fd.execute(catalogue.make_inputs(name, m, n, device="cuda"),
               options={"enable": ["tma_inner_persistent"]})
    torch.cuda.synchronize()
    p = fd.last_run.heuristics[0]
    assert p.stages >= 2, p.reason
    print(name, "tma", m, n, f"stages {p.stages} grid {p.grid}", flush=True)
# Rows split over a thread-block cluster (distributed shared memory reductions).
for name, m, n in () if PIPELINES_ONLY else (("rmsnorm_fwd", 8, 65536),
                                             ("layernorm_fwd", 3, 131072)):
    fd = catalogue.define(name)
    fd.execute(catalogue.make_inputs(name, m, n, device="cuda"))
    torch.cuda.synchronize()
    p = fd.last_run.heuristics[0]
    assert p.cluster > 1, p
    print(name, "cluster", p.cluster, m, n, flush=True)
# The warp-specialized TMA kernel (forced): producer warp group, full/empty mbarriers,
# setmaxnreg; few blocks so every slot is released and refilled.
import dataclasses  # noqa: E402

# With ws_pingpong: two compute roles taking the row groups in turn (ordered named barriers).
for name, m, n, pingpong in (("rmsnorm_fwd", 300, 2048, False), ("softmax", 77, 1024, False),
                             ("rmsnorm_fwd", 300, 2048, True), ("layernorm_fwd", 77, 1024, True)):
    fd = catalogue.define(name)
    ins = catalogue.make_inputs(name, m, n, device="cuda")
    fd.execute(ins, options={"enable": ["ws_inner_persistent"] + ["ws_pingpong"] * pingpong})
    p = dataclasses.replace(fd.last_run.heuristics[0], grid=3)
    assert p.warp_specialized and p.compute_roles == 1 + pingpong, p.reason
    fd.execute(ins, options={"heuristic": p})
    torch.cuda.synchronize()
    print(name, "ws" + " ping-pong" * pingpong, m, n, f"stages {p.stages} grid {p.grid}",
          flush=True)
# Tensor-map boxes of whole rows (forced), pipelined and warp-specialized; 77 rows leave the
# last box partly past the tensor.
for feature, name, m, n in (("tma_inner_persistent", "softmax", 77, 1024),
                            ("ws_inner_persistent", "rmsnorm_fwd", 77, 2048)):
    fd = catalogue.define(name)
    ins = catalogue.make_inputs(name, m, n, device="cuda")
    fd.execute(ins, options={"enable": [feature, "tma_tensor_map"]})
    p = dataclasses.replace(fd.last_run.heuristics[0], grid=3)
    assert p.tensor_map and p.stages >= 2, p.reason
    fd.execute(ins, options={"heuristic": p})
    torch.cuda.synchronize()
    print(name, "tensor map", feature, m, n, f"stages {p.stages} grid {p.grid}", flush=True)
if not PIPELINES_ONLY:
    # Sibling grid reductions grouped into one step (lower/grouped_reductions.py): sum(x) and
    # sum(x * x) over the rows of a channels-last image, split over blocks; each sibling's
    # partials in its own plane of one workspace, one arrival (pf::grid_arrive) a block.
    from pyfuser import DataType, FusionDefinition
    x = torch.randn(8, 256, 28, 28, device="cuda").bfloat16().contiguous(
        memory_format=torch.channels_last)
    with FusionDefinition("sibling_sums") as fd:
        xf = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
        fd.add_output(fd.ops.sum(xf, [0, 2, 3]))
        fd.add_output(fd.ops.sum(fd.ops.mul(xf, xf), [0, 2, 3]))
    s1, s2 = fd.execute([x])
    torch.cuda.synchronize()
    p = fd.last_run.heuristics[0]
    assert p.grid_split > 1, p
    refs = (x.float().sum((0, 2, 3)), (x.float() ** 2).sum((0, 2, 3)))
    err = max(((s - r).abs().max() / r.abs().max()).item() for s, r in zip((s1, s2), refs))
    assert err < 1e-5, err
    print("sibling sums", p.describe(), f"rel. error {err:.1e}", flush=True)
# The cp.async circular-buffered kernel (TMA forced on rows of 1004 bf16, 2008 bytes, which a
# bulk copy refuses): each thread copies and reads back its own vectors with no block barrier,
# which racecheck/synccheck check; few blocks so every stage wraps around.
fd = catalogue.define("layernorm_fwd")
ins = catalogue.make_inputs("layernorm_fwd", 300, 1004, device="cuda")
fd.execute(ins, options={"enable": ["tma_inner_persistent"]})
p = dataclasses.replace(fd.last_run.heuristics[0], grid=3)
assert p.cp_async_inputs and not p.tma_inputs, p.reason
fd.execute(ins, options={"heuristic": p})
torch.cuda.synchronize()
print("layernorm_fwd", "cp.async", 300, 1004, f"stages {p.stages} grid {p.grid}", flush=True)
# Norm backward, both variants forced, few blocks so every stage wraps around (the grid sync of
# the warp-specialized kernel runs on the compute threads' named barrier), and rows over a
# cluster (N = 65536).
for name, m, n in (("rmsnorm_bwd", 300, 2048), ("layernorm_bwd", 77, 1024)):
    for flag in ("enable", "disable"):
        fd = catalogue.define(name)
        ins = catalogue.make_inputs(name, m, n, device="cuda")
        fd.execute(ins, options={flag: ["ws_normalization"]})
        p = dataclasses.replace(fd.last_run.heuristics[0], grid=3)
        assert p.stages >= 2 and p.warp_specialized == (flag == "enable"), p.reason
        fd.execute(ins, options={"heuristic": p})
        torch.cuda.synchronize()
        print(name, p.variant, m, n, f"stages {p.stages} grid {p.grid}", flush=True)
for name, m, n in () if PIPELINES_ONLY else (("rmsnorm_bwd", 5, 65536),
                                             ("layernorm_bwd", 3, 65536)):
    fd = catalogue.define(name)
    fd.execute(catalogue.make_inputs(name, m, n, device="cuda"))
    torch.cuda.synchronize()
    p = fd.last_run.heuristics[0]
    assert p.cluster > 1, p
    print(name, "cluster", p.cluster, m, n, flush=True)
