"""Command line: `python -m pyfuser explain NAME` and `python -m pyfuser bench [NAME...]`."""
from __future__ import annotations

import argparse
import sys


def _shape(text: str) -> tuple[int, int]:
    try:
        m, n = text.lower().split("x")
        return int(m), int(n)
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape must look like 16384x4096, got {text!r}") from None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pyfuser", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("explain", help="show how pyfuser handles a catalogue fusion (no GPU needed)")
    ex.add_argument("name", help="catalogue fusion, e.g. rmsnorm_fwd; `list` lists them")
    ex.add_argument("--shape", type=_shape, default=(2048, 4096), help="MxN (default 2048x4096)")
    ex.add_argument("--dtype", default="bf16", help="bf16 (default), fp16, fp32")
    ex.add_argument("--device", default="h100", help="device table entry: h100 (default), h200")
    ex.add_argument("--compile", action="store_true", help="compile with NVRTC, print the ptxas report")
    ex.add_argument("--no-run", action="store_true", help="skip running the reference evaluator")
    bench = sub.add_parser("bench", help="measure against torch eager and torch.compile (GPU)")
    bench.add_argument("names", nargs="*", help="catalogue fusions (default: all)")
    bench.add_argument("--shapes", type=_shape, nargs="*", help="MxN shapes (default: per fusion)")
    bench.add_argument("--dtype", default="bf16")
    bench.add_argument("--peers", default="eager,compile,liger,quack",
                       help="comma list of peers to measure beside pyfuser")
    bench.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    if args.command == "explain":
        from .explain import explain
        return explain(args)
    from .bench_cli import bench_main
    return bench_main(args)


if __name__ == "__main__":
    sys.exit(main())
