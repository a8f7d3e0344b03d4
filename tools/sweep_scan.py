"""The scan scheduler's thread shape (bytes of the row per thread, threads per block at most) and
its shared-memory staging of the row (ScanParams.staged) swept on cumsum rows, same process as
eager and torch.compile, on the GPU:

    PYTHONPATH=. python tools/sweep_scan.py

Each variant is forced through the module's constants (the heuristic's inputs), so the chosen
cluster, threads and chunk follow from them as in a normal call. GB/s count the row read and the running sums written once.
"""
from __future__ import annotations

import torch

from pyfuser import FusionDefinition
from pyfuser.benchmark.harness import _bench
from pyfuser.schedule.schedulers import scan

SHAPES = [((64, 128256), torch.float32), ((8, 131072), torch.float32),
          ((256, 32768), torch.float32), ((4096, 4096), torch.float32),
          ((64, 128256), torch.bfloat16), ((1024, 16384), torch.float32),
          ((8192, 1000), torch.float32), ((16384, 256), torch.float32),
          ((32768, 128), torch.bfloat16)]
# (bytes per thread, threads at most, rows staged through shared memory: ScanParams.staged)
# (32 and 64 elements a thread were slower on every shape: h100-sweep-scan-*-bd5aae3.txt.)
VARIANTS = [(64, 1024, False), (64, 1024, True)]


def _cumsum(x):
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.cumsum(fd.from_pytorch(x), 1))
    return fd


def main() -> int:
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("case | variant | pyfuser GB/s | eager | compile | heuristic")
    print("--- | --- | --- | --- | --- | ---")
    default = (scan.BYTES_PER_THREAD, scan.MAX_THREADS, scan.STAGED)
    for shape, dtype in SHAPES:
        x = torch.randn(shape, device="cuda").to(dtype)
        nbytes = x.numel() * x.element_size() + x.numel() * (4 if dtype == torch.bfloat16
                                                             else x.element_size())
        peers = {"eager": _bench(lambda: torch.cumsum(x, 1))}
        compiled = torch.compile(lambda t: torch.cumsum(t, 1), dynamic=False)
        compiled(x)
        peers["compile"] = _bench(lambda: compiled(x))
        for per_thread, threads, staged in VARIANTS:
            scan.BYTES_PER_THREAD, scan.MAX_THREADS, scan.STAGED = per_thread, threads, staged
            fd = _cumsum(x)
            try:
                out, = fd.execute([x])
                want = torch.cumsum(x.double(), 1)
                err = ((out.double() - want).norm() / want.norm()).item()
                t = _bench(lambda: fd.execute([x]))
            except Exception as e:     # noqa: BLE001 - a shape that fails is reported
                print(f"{list(shape)} {str(dtype)[6:]} | {per_thread} x {threads} "
                      f"staged {staged} | failed: "
                      f"{type(e).__name__}: {e}"[:300])
                continue
            p = fd.last_run.heuristics[0] if fd.last_run.heuristics else None
            print(f"{list(shape)} {str(dtype)[6:]} | {per_thread} x {threads} staged {staged} | "
                  f"{nbytes / t / 1e6:.0f} | {nbytes / peers['eager'] / 1e6:.0f} | "
                  f"{nbytes / peers['compile'] / 1e6:.0f} | {fd.last_run.schedulers} "
                  f"cluster {getattr(p, 'cluster', '-')} bdimx {getattr(p, 'bdimx', '-')} "
                  f"chunk {getattr(p, 'per_thread', 0) * getattr(p, 'vector', 0)} err {err:.1e}",
                  flush=True)
        scan.BYTES_PER_THREAD, scan.MAX_THREADS, scan.STAGED = default
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
