"""512-thread chained blocks against the scan heuristic's clusters and full chained blocks, on
cumsum rows, same process as eager and torch.compile, on the GPU:

    PYTHONPATH=. python tools/sweep_scan_chain.py

"chain512" forces schedulers/scan.py's CHAIN_SPLIT_ROWS rule on for every shape (any input
width, any number of rows); "default" turns it off. The rule the heuristic keeps was read from
this sweep (bench/results/2026-11-27/h100-sweep-scan-chain512.txt). torch.compile recompiles
per shape; past its recompile limit (8 by default) its figures are eager's.
"""
from __future__ import annotations

import torch

from pyfuser import FusionDefinition
from pyfuser.benchmark.harness import _bench
from pyfuser.schedule.schedulers import scan

SHAPES = [((64, 128256), torch.float32), ((8, 131072), torch.float32),
          ((256, 32768), torch.float32), ((1024, 16384), torch.float32),
          ((64, 128256), torch.bfloat16), ((2, 40000), torch.float32),
          ((512, 262144), torch.float32), ((64, 1 << 20), torch.float32),
          ((4, 1 << 24), torch.float32), ((16, 2000000), torch.bfloat16),
          ((4096, 20000), torch.float32), ((128, 65536), torch.bfloat16)]


def _variant(chain512: bool) -> None:
    scan.CHAIN_SPLIT_ROWS = chain512
    scan.CHAIN_MIN_ROWS_PER_SM = 0.0 if chain512 else RULE[1]
    scan._row_input_bytes = (lambda *a: 4) if chain512 else RULE[2]


RULE = (scan.CHAIN_SPLIT_ROWS, scan.CHAIN_MIN_ROWS_PER_SM, scan._row_input_bytes)


def main() -> int:
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("case | variant | pyfuser GB/s | eager | compile | heuristic")
    print("--- | --- | --- | --- | --- | ---")
    for shape, dtype in SHAPES:
        x = torch.randn(shape, device="cuda").to(dtype)
        nbytes = 2 * x.numel() * x.element_size()
        compiled = torch.compile(lambda t: torch.cumsum(t, 1), dynamic=False)
        compiled(x)
        eager, comp = _bench(lambda: torch.cumsum(x, 1)), _bench(lambda: compiled(x))
        for chain512 in (False, True):
            _variant(chain512)
            with FusionDefinition() as fd:
                fd.add_output(fd.ops.cumsum(fd.from_pytorch(x), 1))
            out, = fd.execute([x])
            want = torch.cumsum(x.double(), 1)
            err = ((out.double() - want).norm() / want.norm()).item()
            t = _bench(lambda: fd.execute([x]))
            p = fd.last_run.heuristics[0]
            print(f"{list(shape)} {str(dtype)[6:]} | {'chain512' if chain512 else 'default'} | "
                  f"{nbytes / t / 1e6:.0f} | {nbytes / eager / 1e6:.0f} | "
                  f"{nbytes / comp / 1e6:.0f} | cluster {p.cluster} chain {p.chain} "
                  f"bdimx {p.bdimx} err {err:.1e}", flush=True)
        scan.CHAIN_SPLIT_ROWS, scan.CHAIN_MIN_ROWS_PER_SM, scan._row_input_bytes = RULE
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
