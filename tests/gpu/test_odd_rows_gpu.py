"""Rows whose length is not a multiple of the vector width, on the GPU against float64: the bar
shapes of issue 16 item 5 (LayerNorm backward fp16 [4096, 5121], RMSNorm forward [16384, 4097])
and odd or 2-mod-4 rows of every norm (2-byte or 4-byte accesses, phase-2 column tiles that do
not divide the row, the last predicated)."""
import pytest
import torch

from pyfuser import catalogue
from pyfuser.schedule.schedulers import inner_outer_persistent as io
from pyfuser.testing import run_and_check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("name,dtype,M,N,vector", [
    ("layernorm_bwd", "fp16", 4096, 5121, 1), ("rmsnorm_fwd", "bf16", 16384, 4097, 1),
    ("rmsnorm_bwd", "bf16", 4096, 4097, 1), ("layernorm_fwd", "fp16", 4096, 5121, 1),
    ("layernorm_bwd", "fp16", 4096, 5122, 2), ("rmsnorm_fwd", "bf16", 16384, 4098, 2),
    ("layernorm_bwd", "bf16", 3, 1001, 1), ("rmsnorm_bwd", "fp16", 1000, 7, 1)])
def test_odd_rows(name, dtype, M, N, vector):
    fd = catalogue.define(name, dtype)
    run_and_check(fd, catalogue.make_inputs(name, M, N, dtype, device="cuda", seed=N),
                  scheduler=catalogue.get(name).kind)
    (params,) = fd.last_run.heuristics
    assert params.vector == vector, params
    if catalogue.get(name).kind == "inner_outer_persistent":
        assert params.col_vector == io.phase2_columns(N, params.grid, params.bdimx,
                                                      bounded=params.blocks_per_sm > 0), params


@pytest.mark.parametrize("name,dtype,M,N", [
    ("softmax", "bf16", 37, 50257), ("log_softmax", "bf16", 37, 50257),
    ("softmax", "bf16", 5, 65537), ("softmax", "fp32", 5, 65537),
    ("layernorm_fwd", "bf16", 9, 50257), ("rmsnorm_fwd", "fp16", 9, 65537),
    ("add_rmsnorm_fwd", "bf16", 3, 50257)])
def test_rows_too_long_for_registers_are_looped(name, dtype, M, N):
    # Odd rows that registers cannot hold and no cluster can split: each pass reads the row
    # again (inner_persistent's looped variant; softmax's max and sum of exp in one pass).
    fd = catalogue.define(name, dtype)
    run_and_check(fd, catalogue.make_inputs(name, M, N, dtype, device="cuda", seed=N),
                  scheduler="inner_persistent")
    (params,) = fd.last_run.heuristics
    assert params.looped and params.vector == 1 and params.bdimx == 1024, params
