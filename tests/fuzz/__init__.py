"""pyfuser's random fusion generator ("the fuzzer"), its checker and its runner.

What it generates (fuzz/gen.py): random fusions written with the public frontend
(FusionDefinition, fd.ops.*), built deterministically from (seed, case index). Patterns cover
every scheduler: pointwise DAGs (ranks 0-4, broadcasts anywhere, scalars, shape ops), several
independent chains over tensors of different sizes (AdamW-like updates), bias + gelu,
reductions (sum/max/min/mean/var/var_mean over any set of dims, keepdim or not, full
reductions), normalizations (softmax, log-softmax, RMSNorm, LayerNorm returning mean/rstd,
random row statistics broadcast back), norm backwards (row and column reductions) and random
mixtures. Inputs vary in dtype (bf16, fp16, fp32, fp64, int32, int64, bool), size (0, 1, odd,
primes, powers of two, rows of several thousand elements), and layout (permuted, strided,
offset views whose pointers are not 16-byte aligned, size-1 and expanded stride-0 dims,
[1] tensors). Each case is a JSON-able spec (fuzz/spec.py) that turns into a stand-alone Python
script (fuzz/build.py): the runner executes exactly the text a failure report prints.

How a case is checked (fuzz/check.py): fd.execute with the generated kernels (the kernel-IR
interpreter on CPU tensors, or the GPU), every output compared with the float64 reference
evaluator, with tolerances by dtype and by how the fusion's own roundings and reductions
condition it; each case lands in one category (right, wrong, internal_error, illegal_access,
timeout, reference_fallback, definition_error, ill_conditioned).

How to run it (fuzz/run_fuzz.py):

    PYTHONPATH=$PWD python tests/fuzz/run_fuzz.py --backend interpret --seed 0 --count 50
    PYTHONPATH=$PWD python tests/fuzz/run_fuzz.py --backend gpu --long --jobs 8 --out /tmp/fz

The CI sample is tests/fuzz/test_fuzz_sample.py; the generator's own tests are
tests/fuzz/test_fuzz_generator.py.
"""
