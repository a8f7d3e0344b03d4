"""Rows whose length is not a multiple of the 16-byte vector (CPU): the widths the row schedulers
choose from the row start's alignment (docs/performance.md, "Rows of odd length"), the phase-2
column tiles of the norm backward that need not divide the row, each kernel interpreted against
float64 at small M, and the bar shapes compiled for sm_90a with a clean ptxas report."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lower"))
from kir_testing import empty_inputs, setup  # noqa: E402
from pyfuser import catalogue  # noqa: E402
from pyfuser.schedule.schedulers import inner_outer_persistent as io  # noqa: E402
from pyfuser.schedule.schedulers import inner_persistent as ip  # noqa: E402
from pyfuser.testing import run_and_check  # noqa: E402

ODD = [1, 7, 1001, 4097, 5121]


def _params(name, M, N, dtype="bf16"):
    fd = catalogue.define(name, dtype)
    st = setup(fd, empty_inputs(name, M, N, dtype))
    mod = io if catalogue.get(name).kind == "inner_outer_persistent" else ip
    return mod.compute_heuristics(st.fusion, st.info)


@pytest.mark.parametrize("name", ["rmsnorm_fwd", "layernorm_bwd"])
@pytest.mark.parametrize("N,vector", [(5121, 1), (4097, 1), (5122, 2), (4098, 2), (4100, 4),
                                      (5128, 8)])
def test_vector_width_follows_the_alignment_every_row_start_has(name, N, vector):
    # A dense [M, N] 16-bit row starts at byte 2 r N: every row is 2^k-aligned only when N is a
    # multiple of 2^(k-1); an odd N leaves every other row 2-byte aligned.
    p = _params(name, 4096, N, "fp16")
    assert p.vector == vector
    assert (p.vector_inputs != ()) == (vector > 1)


@pytest.mark.parametrize("name", ["rmsnorm_bwd", "layernorm_bwd"])
@pytest.mark.parametrize("N,tile", [(5121, 8), (4097, 8), (1001, 2), (2049, 4)])
def test_phase2_tiles_of_odd_rows_are_wide(name, N, tile):
    # 264 blocks: tiles of 8 columns while ceilDiv(N, 8) >= 264, the last one predicated.
    p = _params(name, 4096, N, "fp16")
    assert (p.vector, p.grid, p.col_vector) == (1, 264, tile)
    assert io.phase2_columns(N, 264) == tile
    assert io.phase2_columns(N, 264, whole_tiles=True) == 1


@pytest.mark.parametrize("name,scheduler", [("rmsnorm_fwd", "inner_persistent"),
                                            ("layernorm_fwd", "inner_persistent"),
                                            ("rmsnorm_bwd", "inner_outer_persistent"),
                                            ("layernorm_bwd", "inner_outer_persistent")])
@pytest.mark.parametrize("N", ODD)
def test_odd_rows_on_the_interpreter(name, scheduler, N):
    M = 3 if N > 1000 else 5
    fd = catalogue.define(name, "fp16")
    inputs = catalogue.make_inputs(name, M, N, "fp16", seed=N)
    run_and_check(fd, inputs, scheduler=scheduler, options={"enable": ["interpret"]})
    params = fd.last_run.heuristics[0]
    assert params.vector == 1 and params.vector_inputs == ()
    if scheduler == "inner_outer_persistent":
        assert params.col_vector == io.phase2_columns(N, params.grid, params.bdimx)
