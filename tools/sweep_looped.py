"""The default heuristic against the inner persistent scheduler's looped variant forced on, and
forced off (rows registers cannot hold then run as reduction kernels, the rows split over
blocks, and a kernel for the outputs), for catalogue fusions over rows (GPU machine), GB/s of
the floor's bytes:

    PYTHONPATH=. python tools/sweep_looped.py softmax,log_softmax 4096x24577,4096x65536
    PYTHONPATH=. python tools/sweep_looped.py softmax 1x4194304,4x1048576,16x262144,64x65536

The second: few long rows, where the looped kernel (a block a row) runs on as many SMs as
there are rows (normalization fuzz case 22:122, one row of 3.7M elements, on one block).
"""
import sys, torch
from pyfuser import catalogue
from pyfuser.benchmark.harness import _bench
names = sys.argv[1].split(",")
shapes = [tuple(map(int, s.split("x"))) for s in sys.argv[2].split(",")]
for (M, N) in shapes:
    for name in names:
        fd = catalogue.define(name)
        nbytes = catalogue.get(name).min_bytes(M, N, 2)
        sets = [catalogue.make_inputs(name, M, N, device="cuda") for _ in range(2)]
        line = f"{name:14s} {M}x{N}"
        for tag, opt in (("default", {}), ("looped", {"enable": ["looped_inner_persistent"]}),
                         ("not looped", {"disable": ["looped_inner_persistent"]})):
            try:
                fd.execute(sets[0], options=opt)
                r = fd.last_run
                h = r.heuristics[0] if r.heuristics else None
                desc = (f"{r.schedulers}" + (f" looped" if getattr(h, "looped", False) else "")
                        + (f" cluster{h.cluster}" if getattr(h, "cluster", 1) > 1 else "")
                        + (f" batch{h.persistent_batch}x{h.vector} bdimx{h.bdimx}" if hasattr(h, "persistent_batch") else ""))
                k = [0]
                def run():
                    k[0] ^= 1
                    return fd.execute(sets[k[0]], options=opt)
                t = _bench(run)
                line += f" | {tag} {nbytes / t / 1e6:6.0f} GB/s {desc}"
            except Exception as e:
                line += f" | {tag} failed {repr(e)[:80]}"
        print(line, flush=True)
