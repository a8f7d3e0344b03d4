"""ptxas's registers and the blocks per SM they leave, for the inner persistent scheduler's
register rows of the catalogue's forward fusions at odd row lengths (bf16, [4096, N], the H200's
table entry), on the CPU (NVRTC):

    PYTHONPATH=. python tools/register_rows_occupancy.py
"""
import sys, re
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "tests" / "lower"))
from kir_testing import empty_inputs
from pyfuser import catalogue
from pyfuser.runtime.explain import explain_fusion
for n in (1001, 2049, 4097, 5121, 6145, 8193, 12289, 16385):
    for name in ("layernorm_fwd", "rmsnorm_fwd", "softmax", "log_softmax", "add_rmsnorm_fwd"):
        fd = catalogue.define(name, "bf16")
        ins = [x.to("meta") for x in empty_inputs(name, 4096, n)]
        (k,) = explain_fusion(fd.fusion, ins, device="h200", compile=True).kernels
        regs = int(re.search(r"(\d+) registers", k.ptxas).group(1))
        spill = int(re.search(r"(\d+) B spill stores", k.ptxas).group(1))
        threads = -(-k.block[0] // 32) * 32 * k.block[1]
        regs_alloc = -(-regs // 8) * 8
        blocks = 65536 // (regs_alloc * threads)
        p = k.params
        print(f"{name:16s} {n:6d} threads {threads:4d} batch {p.persistent_batch}x{p.vector} looped {int(p.looped)} regs {regs:3d} spill {spill:3d} blocks/SM {blocks}", flush=True)
