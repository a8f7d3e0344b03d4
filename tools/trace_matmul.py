"""Where a cooperative matmul kernel's time goes, per CTA (GPU machine):

    PYTHONPATH=. PYFUSER_DISABLE_DISK_CACHE=1 python tools/trace_matmul.py M N K TM,TN,SPLIT,STREAM_K ...

y = x @ w^T (bf16) with the parameters forced (matmul.fitted_params of a cooperative TMxTN tile,
split-K SPLIT, stream-K over at most STREAM_K CTAs per tile; 0: off). The printed CUDA is
patched, by pattern, with %globaltimer stamps of compute warp group 0's thread 0 and of the
producer thread into a __device__ array: the start (after the barriers' init), the producer's
first and last TMA issue, the first full barrier passed, the end of the first and of the last
k loop, a split's arrival, stream-K's end of the wait for the other runs, the epilogue's start,
its last store issued and the end. After 30 CUDA-graph replays (no L2 clearing: the
operands stay in L2 where they fit), the last replay's stamps are printed in microseconds from
the first CTA's start: min / median / max over the CTAs, per-phase durations, and a sample of
CTAs with their SM. A pattern that does not match (the kernel's form changed, or a phase the
variant has not) is reported as PATCH MISS. Launch latency and the prologue before the stamps
are not seen. Session 35 (docs/performance.md) read the fixup's costs from it."""
import ctypes
import re
import sys
import statistics

import torch

sys.path.insert(0, "tools")
import pyfuser.codegen.cuda as cg
from bench_issue20 import _graphed, linear_fusion
from pyfuser.schedule.schedulers import matmul
from pyfuser.runtime.device import query_device
from pyfuser.runtime import launch

KERNEL = {"enable": ["matmul_few_rows"]}
_orig = cg.generate_cuda
SLOTS = 16


def stamp(slot, who):
    return (f"if ({who}) {{ unsigned long long pf_t_; asm volatile(\"mov.u64 %0, %%globaltimer;\" "
            f": \"=l\"(pf_t_)); pf_trace[blockIdx.x * {SLOTS} + {slot}] = pf_t_; }}")


def patched(kernel):
    src = _orig(kernel)
    if "pf_wgmma" not in src or "pf_trace" in src:
        return src
    c0 = "(threadIdx.x == 0 && threadIdx.y == 0)"
    prod = "(threadIdx.x == 0 && threadIdx.y == 2)"
    n = [0]

    def sub(pat, rep, count=1, flags=0):
        nonlocal src
        new, k = re.subn(pat, rep, src, count=count, flags=flags)
        if k == 0:
            print("PATCH MISS:", pat[:60])
        src = new
    src = src.replace('extern "C" __global__',
                      f'__device__ unsigned long long pf_trace[256 * {SLOTS}];\nextern "C" __global__', 1)
    # 0: after barrier init; 15: smid
    sub(r"(\n  __syncthreads\(\);\n)(  const index_t pf_ws_trips_j0)",
        r"\1  " + stamp(0, c0).replace("\\", "\\\\") +
        f"\n  if ({c0}) {{ unsigned s_; asm volatile(\"mov.u32 %0, %%smid;\" : \"=r\"(s_)); pf_trace[blockIdx.x * {SLOTS} + 15] = s_; }}\n"
        r"  bool pf_tf1 = true, pf_tf2 = true, pf_tf7 = true;\n\2")
    # producer: first (7) and last (8) load issue
    sub(r"(pf::tma_load_2d\(pf::smem_addr\(&T4\[[^\n]*\n)",
        lambda m: m.group(1) + "          if (pf_tf7) { " + stamp(7, prod) + " pf_tf7 = false; }\n          "
        + stamp(8, prod) + "\n")
    # compute: first full barrier passed (1)
    sub(r"(\n        pf::mbarrier_wait_parity\(pf::smem_addr\(&pf_full_j1[^\n]*\n)",
        lambda m: m.group(1) + "        if (pf_tf1) { " + stamp(1, c0) + " pf_tf1 = false; }\n")
    # end of the k loop: first unit (2), last unit (3)
    sub(r"(\n      pf::wgmma_wait<0>\(\);\n)",
        lambda m: m.group(1) + "      if (pf_tf2) { " + stamp(2, c0) + " pf_tf2 = false; }\n      "
        + stamp(3, c0) + "\n")
    # stream-K: partial stored + arrived (10), fixup wait done (9)
    sub(r"(\n            pf_split_last = false;\n)", lambda m: m.group(1) + "            " + stamp(10, c0) + "\n")
    sub(r"(\n              \*pf_sk_count = 0;[^\n]*\n            \}\n)",
        lambda m: m.group(1) + "            " + stamp(9, "threadIdx.y == 0 && threadIdx.x == 0") + "\n")
    # split-K: after arrival (10)
    sub(r"(\n          pf_split_last = pf_sk_last\[threadIdx.y\] != 0;\n)",
        lambda m: m.group(1) + "          " + stamp(10, c0) + "\n")
    # epilogue start (4): before the first 'if (pf_split_last) {' followed by the bulk wait
    sub(r"(\n        if \(pf_split_last\) \{\n          if \(\(pf_tidx == 0\)\) \{\n)",
        lambda m: "\n        " + stamp(4, c0) + m.group(1))
    # end (5) before the final bulk wait, (6) after
    sub(r"(\n    if \(\(pf_tidx == 0\)\) \{\n      pf::bulk_wait_group<0>\(\);\n    \}\n)",
        lambda m: "\n    " + stamp(5, c0) + m.group(1) + "    " + stamp(6, c0) + "\n")
    return src


cg.generate_cuda = patched


def read_trace(grid):
    from cuda.bindings import driver
    out = None
    for key, lk in launch._loaded.items():
        mod = driver.CUmodule(int(lk.cu_module))
        err, ptr, size = driver.cuModuleGetGlobal(mod, b"pf_trace")
        if err != driver.CUresult.CUDA_SUCCESS:
            continue
        buf = (ctypes.c_ulonglong * (256 * SLOTS))()
        torch.cuda.synchronize()
        driver.cuMemcpyDtoH(ctypes.addressof(buf), ptr, size)
        out = [list(buf[b * SLOTS:(b + 1) * SLOTS]) for b in range(grid)]
    return out


def main():
    dev = query_device()
    m, n, k = map(int, sys.argv[1:4])
    print("device:", torch.cuda.get_device_name())
    fd = linear_fusion()
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g)
    ref = x.float() @ w.float().t()
    for v in sys.argv[4:]:
        tm, tn, s, sk = map(int, v.split(","))
        tiles = -(-m // tm) * -(-n // tn)
        p = matmul.fitted_params(tm, tn, 1, tiles, dev, 2, "K", (2,), s, "K", stream_k=sk)
        launch._loaded.clear()
        opts = {"heuristic": p, **KERNEL}
        y = fd.execute([x, w], options=opts)[0]
        err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
        gfn = _graphed(lambda: fd.execute([x, w], options=opts))
        for _ in range(30):
            gfn()
        torch.cuda.synchronize()
        tr = read_trace(p.grid)
        print(f"## {m}x{n}x{k} {p.describe()} err {err:.1e}")
        if tr is None:
            print("no trace")
            continue
        t0 = min(r[0] for r in tr if r[0])
        names = {0: "start", 1: "first data", 2: "kloop1 end", 3: "kloop end", 10: "arrived",
                 9: "fixup wait done", 4: "epilogue start", 5: "epi issued", 6: "end",
                 7: "prod first", 8: "prod last"}
        rows = []
        for b, r in enumerate(tr):
            rows.append({s: (r[s] - t0) / 1e3 if r[s] >= t0 else None for s in names})
        for s, nm in names.items():
            vals = [r[s] for r in rows if r[s] is not None]
            if vals:
                print(f"  {nm:16s} n={len(vals):3d} min {min(vals):6.2f} med {statistics.median(vals):6.2f} "
                      f"max {max(vals):6.2f} us")
        # per-CTA durations
        def dur(a, b):
            d = [r[b] - r[a] for r in rows if r[a] is not None and r[b] is not None]
            return f"min {min(d):5.2f} med {statistics.median(d):5.2f} max {max(d):5.2f}" if d else "-"
        print("  start->first data", dur(0, 1), "| first data->kloop end", dur(1, 3),
              "| kloop end->epilogue start", dur(3, 4), "| epilogue", dur(4, 6))
        for b in list(range(0, p.grid, max(1, p.grid // 8))):
            r = rows[b]
            print("   cta", b, "sm", tr[b][15], " ".join(f"{names[s][:6]}={r[s]:.2f}" for s in names if r[s] is not None))


main()
