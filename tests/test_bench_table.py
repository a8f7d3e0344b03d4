"""The bench table (CPU): the norm backward's forced variants and workspace bytes beside the
automatic choice; a peer that could not be imported shows as missing, never dropped."""
from pyfuser.benchmark.harness import Result, format_table


def test_backward_rows_show_variants_workspace_and_missing_peers():
    r = Result("rmsnorm_bwd", 16384, 4096, 402653184,
               {"pyfuser": 2600.0, "pyfuser-multi-wave": 2600.0,
                "pyfuser-warp-specialized": 2400.0, "eager": 1200.0, "quack": None},
               {}, {"pyfuser": "kernels: inner_outer_persistent (multi-wave); workspace "
                               "17301504 bytes", "quack": "missing: no module named quack"})
    fwd = Result("rmsnorm_fwd", 16384, 4096, 268435456, {"pyfuser": 2800.0, "eager": 2000.0,
                                                          "quack": 2700.0}, {}, {"pyfuser": "kernels"})
    head, _, row, row2 = format_table([r, fwd], 3000.0, ["eager", "quack"]).splitlines()
    assert head.split(" | ")[3:5] == ["multi-wave GB/s", "warp-specialized GB/s"]
    assert head.endswith("workspace MB")
    cells = row.split(" | ")
    assert cells[3:8] == ["2600", "2400", "2600", "1200", "missing"]
    assert cells[-1] == "17.3" and cells[-2] == "2.167"
    # A row without variants keeps its columns aligned.
    assert row2.split(" | ")[3:5] == ["-", "-"] and row2.split(" | ")[-1] == "0"
