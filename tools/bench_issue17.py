"""The bars of the issue on slicing, concatenation and indexing ops that pyfuser can run today,
same run as eager and torch.compile (GPU machine), or their plans on the CPU:

    PYTHONPATH=. python tools/bench_issue17.py            # GPU: times and GB/s
    PYTHONPATH=. python tools/bench_issue17.py --explain  # CPU: each fusion's plan (H100 table)

The causal softmax of bf16 scores [4, 32, 2048, 2048] with the mask built in the kernel from two
iotas (column <= row), and torch.tril of the same tensor; RoPE through slice and cat, a
chunked SwiGLU through chunk (slices); an embedding lookup and cross-entropy's loss and
dlogits (take_along_axis, an iota one-hot, or a scattered one); an embedding's backward
(index_add). GB/s count the input read and the
output written once (the floor); times are medians of triton's do_bench
(pyfuser.benchmark.harness._bench), which clears the L2 before each run. Each peer's result is
compared with pyfuser's before it is timed.
"""
from __future__ import annotations

import sys

import bench_cases
import torch

from pyfuser import DataType, FusionDefinition

BF16, F32, I32 = DataType.BFloat16, DataType.Float, DataType.Int32
SHAPE = (4, 32, 2048, 2048)


def _scores(device):
    if device == "meta":
        return torch.empty(SHAPE, device=device, dtype=torch.bfloat16)
    g = torch.Generator(device=device).manual_seed(0)
    return torch.randn(SHAPE, device=device, dtype=torch.bfloat16, generator=g)


def causal_softmax(device):
    x = _scores(device)
    with FusionDefinition("causal_softmax") as fd:
        tx = fd.define_tensor([-1, -1, -1, -1], dtype=BF16)
        xf = fd.ops.cast(tx, F32)
        rows, cols = (fd.ops.iota(i.extent, dtype=I32) for i in tx.domain.logical[2:])
        keep = fd.ops.le(fd.ops.broadcast(cols, [True, False]),
                         fd.ops.broadcast(rows, [False, True]))
        xm = fd.ops.where(keep, xf, float("-inf"))
        e = fd.ops.exp(fd.ops.sub(xm, fd.ops.max(xm, [3], keepdim=True)))
        fd.add_output(fd.ops.cast(fd.ops.div(e, fd.ops.sum(e, [3], keepdim=True)), BF16))

    def eager():
        r = torch.arange(x.shape[-1], device=x.device)
        masked = x.masked_fill(r[None, :] > r[:, None], float("-inf"))
        return torch.softmax(masked.float(), -1).to(torch.bfloat16)
    return fd, [x], eager, 2 * x.numel() * x.element_size()


def tril(device):
    x = _scores(device)
    with FusionDefinition("tril") as fd:
        fd.add_output(fd.ops.tril(fd.define_tensor([-1, -1, -1, -1], dtype=BF16)))

    def eager():
        return torch.tril(x)
    return fd, [x], eager, 2 * x.numel() * x.element_size()


def rope(device):
    """q * cos + rotate_half(q) * sin over q [4, 2048, 32, 128] bf16, cos and sin [2048, 128] fp32:
    rotate_half through slice and cat (one kernel: both halves are offsets into q)."""
    shape, half = (4, 2048, 32, 128), 64
    if device == "meta":
        q = torch.empty(shape, device=device, dtype=torch.bfloat16)
        cos = sin = torch.empty(2048, 128, device=device)
    else:
        g = torch.Generator(device=device).manual_seed(0)
        q = torch.randn(shape, device=device, dtype=torch.bfloat16, generator=g)
        cos = torch.randn(2048, 128, device=device, generator=g)
        sin = torch.randn(2048, 128, device=device, generator=g)
    with FusionDefinition("rope") as fd:
        tq = fd.from_pytorch(q, static_sizes=True)
        tc, ts = fd.from_pytorch(cos, static_sizes=True), fd.from_pytorch(sin, static_sizes=True)
        x1 = fd.ops.slice(tq, [0, 0, 0, 0], [4, 2048, 32, half])
        x2 = fd.ops.slice(tq, [0, 0, 0, half], [4, 2048, 32, 128])
        rot = fd.ops.cat([-x2, x1], -1)
        per_position = [True, False, True, False]
        c = fd.ops.broadcast(tc, per_position)
        s = fd.ops.broadcast(ts, per_position)
        y = fd.ops.cast(tq, F32) * c + fd.ops.cast(rot, F32) * s
        fd.add_output(fd.ops.cast(y, BF16))

    def eager():
        rot = torch.cat([-q[..., half:], q[..., :half]], -1)
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        return (q.float() * c + rot.float() * s).to(torch.bfloat16)
    return fd, [q, cos, sin], eager, 2 * q.numel() * q.element_size()


def swiglu(device):
    """silu(a) * b of the two halves of x [8192, 28672] bf16 (a chunked gate and up
    projection), through chunk (slices)."""
    shape = (8192, 28672)
    x = (torch.empty(shape, device=device, dtype=torch.bfloat16) if device == "meta" else
         torch.randn(shape, device=device, dtype=torch.bfloat16,
                     generator=torch.Generator(device=device).manual_seed(0)))
    with FusionDefinition("swiglu") as fd:
        tx = fd.from_pytorch(x, static_sizes=True)
        a, b = fd.ops.chunk(tx, 2, -1)
        fd.add_output(fd.ops.cast(fd.ops.silu(fd.ops.cast(a, F32)) * fd.ops.cast(b, F32), BF16))

    def eager():
        a, b = x.chunk(2, -1)
        return (torch.nn.functional.silu(a.float()) * b.float()).to(torch.bfloat16)
    return fd, [x], eager, x.numel() * x.element_size() * 3 // 2


def embedding(device):
    """Rows of a [128256, 4096] bf16 table at 8192 int64 ids (the bar): the floor is the rows
    read and written once."""
    if device == "meta":
        ids = torch.empty(8192, device=device, dtype=torch.int64)
        table = torch.empty(128256, 4096, device=device, dtype=torch.bfloat16)
    else:
        g = torch.Generator(device=device).manual_seed(0)
        ids = torch.randint(0, 128256, (8192,), device=device, generator=g)
        table = torch.randn(128256, 4096, device=device, dtype=torch.bfloat16, generator=g)
    with FusionDefinition("embedding") as fd:
        fd.add_output(fd.ops.embedding(fd.from_pytorch(ids), fd.from_pytorch(table)))

    def eager():
        return torch.nn.functional.embedding(ids, table)
    return fd, [ids, table], eager, 2 * 8192 * 4096 * 2 + ids.numel() * 8


def define_cross_entropy(fd, tx, tt, m: int, v: int, scatter: bool = False,
                         from_log_probs: bool = False) -> None:
    """Into fd: the per-row loss and dlogits (bf16, scaled by 1 / m) of logits tx [m, v] with
    int64 targets tt [m], through logsumexp, take_along_axis and a one-hot: an iota compare,
    or with `scatter` a scatter of 1 into zeros at the targets (as a framework's backward
    writes it). The softmax in dlogits is exp(x - max) / sum, or with `from_log_probs`
    exp(x - logsumexp), the exponential of the log-probabilities (as aten's log_softmax
    backward computes it: no division)."""
    xf = fd.ops.cast(tx, F32)
    mx = fd.ops.max(xf, [1], keepdim=True)
    e = fd.ops.exp(fd.ops.sub(xf, mx))
    s = fd.ops.sum(e, [1], keepdim=True)
    lse = fd.ops.add(fd.ops.log(s), mx)
    t2 = fd.ops.broadcast(tt, [False, True])
    picked = fd.ops.take_along_axis(xf, t2, 1)
    fd.add_output(fd.ops.squeeze(fd.ops.sub(lse, picked), [1]))
    if scatter:
        one_hot = fd.ops.scatter(fd.ops.zeros([m, v], F32), t2, 1.0, 1)
    else:
        one_hot = fd.ops.cast(fd.ops.eq(fd.ops.broadcast(fd.ops.iota(v), [True, False]), t2), F32)
    probs = fd.ops.exp(fd.ops.sub(xf, lse)) if from_log_probs else fd.ops.div(e, s)
    grad = fd.ops.sub(probs, one_hot)
    fd.add_output(fd.ops.cast(fd.ops.mul(grad, 1.0 / m), BF16))


def cross_entropy(device):
    """The loss and dlogits of bf16 logits [8192, 128256] with int64 targets, for a gradient
    scale of 1/8192 (Liger's fused protocol: dlogits written in the forward), through
    logsumexp, take_along_axis and an iota one-hot. The floor: logits read once, dlogits
    written once. (Liger's fused cross-entropy is the bar's other peer: run it apart, with
    the peer wheels.)"""
    m, v = 8192, 128256
    if device == "meta":
        x = torch.empty(m, v, device=device, dtype=torch.bfloat16)
        t = torch.empty(m, device=device, dtype=torch.int64)
    else:
        g = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(m, v, device=device, dtype=torch.bfloat16, generator=g)
        t = torch.randint(0, v, (m,), device=device, generator=g)
    with FusionDefinition("cross_entropy") as fd:
        define_cross_entropy(fd, fd.from_pytorch(x), fd.from_pytorch(t), m, v)

    def eager():
        xf = x.float()
        lse = torch.logsumexp(xf, 1)
        loss = lse - xf.gather(1, t[:, None])[:, 0]
        grad = torch.softmax(xf, 1)
        grad[torch.arange(m, device=x.device), t] -= 1
        return loss, (grad / m).to(torch.bfloat16)
    return fd, [x, t], eager, 2 * x.numel() * x.element_size()


def embedding_backward(device):
    """dweight of the embedding bar: 8192 bf16 rows of dy [8192, 4096] added into zeros
    [128256, 4096] at int64 ids (index_add: float32 atomic sums, then the cast to bf16). The
    floor: dy read, the gradient written once. Eager: torch's dense embedding backward."""
    rows, n, d = 128256, 8192, 4096
    if device == "meta":
        ids = torch.empty(n, device=device, dtype=torch.int64)
        dy = torch.empty(n, d, device=device, dtype=torch.bfloat16)
    else:
        g = torch.Generator(device=device).manual_seed(0)
        ids = torch.randint(0, rows, (n,), device=device, generator=g)
        dy = torch.randn(n, d, device=device, dtype=torch.bfloat16, generator=g)
    with FusionDefinition("embedding_backward") as fd:
        ti, td = fd.from_pytorch(ids), fd.from_pytorch(dy)
        fd.add_output(fd.ops.index_add(fd.ops.zeros([rows, d], BF16), 0, ti, td))

    def eager():
        return torch.ops.aten.embedding_dense_backward(dy, ids, rows, -1, False)
    return fd, [ids, dy], eager, n * d * 2 + rows * d * 2 + n * 8


def cross_entropy_log_probs(device):
    """cross_entropy with dlogits' softmax as exp(x - logsumexp) (no division per element, as
    aten's log_softmax backward): the same outputs within float32 rounding."""
    fd_div, inputs, eager, nbytes = cross_entropy(device)
    x, t = inputs
    m, v = x.shape
    with FusionDefinition("cross_entropy_log_probs") as fd:
        define_cross_entropy(fd, fd.from_pytorch(x), fd.from_pytorch(t), m, v,
                             from_log_probs=True)
    return fd, inputs, eager, nbytes


def cross_entropy_scatter(device):
    """cross_entropy with its one-hot a scatter of 1 into zeros at the targets (as a
    framework's backward writes it): the same kernel as the iota compare."""
    fd_iota, inputs, eager, nbytes = cross_entropy(device)
    x, t = inputs
    m, v = x.shape
    with FusionDefinition("cross_entropy_scatter") as fd:
        define_cross_entropy(fd, fd.from_pytorch(x), fd.from_pytorch(t), m, v, scatter=True)
    return fd, inputs, eager, nbytes


CASES = {
    "causal softmax [4,32,2048,2048] bf16": causal_softmax,
    "tril [4,32,2048,2048] bf16": tril,
    "rope q [4,2048,32,128] bf16": rope,
    "swiglu chunked [8192,28672] bf16": swiglu,
    "embedding 8192 ids in [128256,4096] bf16": embedding,
    "cross-entropy loss+dlogits [8192,128256] bf16": cross_entropy,
    "cross-entropy, scattered one-hot [8192,128256] bf16": cross_entropy_scatter,
    "cross-entropy, dlogits from log-probs [8192,128256] bf16": cross_entropy_log_probs,
    "embedding backward 8192 ids into [128256,4096] bf16": embedding_backward,
}


if __name__ == "__main__":
    raise SystemExit(bench_cases.explain(CASES) if "--explain" in sys.argv
                     else bench_cases.bench(CASES))
