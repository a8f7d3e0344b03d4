"""Profile a new process's first execute from the disk cache (run twice: fill, then measure)."""
import cProfile, os, pstats, sys, time
import torch
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
t0 = time.perf_counter()
pr = cProfile.Profile(); pr.enable()
import pyfuser
from pyfuser import catalogue
from pyfuser.runtime import nvrtc, kernel_cache
fd = catalogue.define("rmsnorm_fwd", "bf16")
inputs = catalogue.make_inputs("rmsnorm_fwd", 8, 1024, "bf16", device="cuda")
fd.execute(inputs); torch.cuda.synchronize()
pr.disable()
print(f"import+define+execute {1e3 * (time.perf_counter() - t0):.1f} ms", fd.last_run.kind)
t = time.perf_counter(); ident = nvrtc.nvrtc_library_identity(); print("identity", ident, f"{1e3*(time.perf_counter()-t):.2f} ms")
t = time.perf_counter(); kernel_cache.source_hash(); print(f"source_hash again {1e3*(time.perf_counter()-t):.2f} ms")
if sys.argv[1:] == ["show"]:
    pstats.Stats(pr).sort_stats("cumtime").print_stats(45)
