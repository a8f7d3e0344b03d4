"""`python -m pyfuser bench`: pyfuser against its peers on a GPU, in one run."""
from __future__ import annotations

import sys

from . import catalogue

# Shapes per fusion kind: the rows of ../shared/ANCHORS.md, and the issue-4 bars.
DEFAULT_SHAPES = {
    "gelu_bias": [(16384, 8192)], "silu_mul": [(16384, 8192)],
    "row_sum": [(16384, 8192)], "col_sum": [(16384, 8192)],
    "mse_mean": [(8192, 4096)], "amax_scale": [(8192, 8192)],   # issue 16's bars
    "softmax": [(16384, 1024), (16384, 4096), (4096, 65536)],
    "softmax_dim0": [(2048, 8192)],
    # (pixels, channels): [32, 256, 56, 56] NCHW (catalogue._image_shape)
    "nchw_to_nhwc": [(100352, 256)], "scale_shift_relu_cl": [(100352, 256)],
    "log_softmax": [(16384, 1024), (16384, 4096), (4096, 65536)],
    "rmsnorm_fwd": [(16384, 1024), (16384, 4096), (16384, 16384), (4096, 65536), (2048, 131072)],
    "add_rmsnorm_fwd": [(16384, 4096)],
    "layernorm_fwd": [(16384, 1024), (16384, 4096), (16384, 16384)],
    "rmsnorm_bwd": [(16384, 1024), (16384, 2048), (16384, 4096), (16384, 8192), (16384, 16384),
                    (16384, 32768), (4096, 65536), (2048, 131072)],
    "layernorm_bwd": [(16384, 1024), (16384, 4096), (16384, 16384), (4096, 65536)],
}


def bench_main(args) -> int:
    import torch
    if catalogue.unknown(args.names):
        print(f"python -m pyfuser bench: {catalogue.unknown(args.names)}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench needs a CUDA GPU; `python -m pyfuser explain NAME` works without one")
        return 2
    from .benchmark.harness import run
    names = args.names or catalogue.names()
    peers = tuple(p for p in args.peers.split(",") if p)

    def shapes(name):
        return args.shapes or DEFAULT_SHAPES.get(name, [(16384, 4096)])
    run(names, shapes, args.dtype, peers, args.out)
    return 0
