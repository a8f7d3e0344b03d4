import cProfile, pstats, torch
from pyfuser import catalogue
fd = catalogue.define("rmsnorm_fwd", "bf16")
inputs = catalogue.make_inputs("rmsnorm_fwd", 8, 1024, "bf16", device="cuda")
for _ in range(100):
    fd.execute(inputs)
torch.cuda.synchronize()
pr = cProfile.Profile()
pr.enable()
for _ in range(20000):
    fd.execute(inputs)
pr.disable()
torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(22)
