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


def test_time_forced_heuristic_checks_before_timing(monkeypatch):
    """The sweeps' step: checked against float64 first, timed only when right (CPU inputs run
    the reference evaluator here; the timer is stubbed), and a wrong result is never timed."""
    import warnings

    from pyfuser import catalogue
    from pyfuser.benchmark import harness

    timed = []
    monkeypatch.setattr(harness, "_bench", lambda fn, reps=3: (timed.append(fn()), 0.5)[1])
    fd = catalogue.define("rmsnorm_bwd", "fp32")
    sets = [catalogue.make_inputs("rmsnorm_bwd", 4, 64, "fp32", seed=k) for k in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        line = harness.time_forced_heuristic(fd, sets, None, "v", 1_000_000)
        assert line == "v: 2 GB/s  500.0 us  [reference  x0]" and len(timed) == 1
        import pyfuser.runtime.reference as ref
        real = ref.evaluate
        monkeypatch.setattr(ref, "evaluate", lambda *a, **k: [2 * x for x in real(*a, **k)])
        line = harness.time_forced_heuristic(fd, sets, None, "v", 1_000_000)
    assert line.startswith("v: WRONG rel err") and len(timed) == 1


def test_the_issue_bench_scripts_plan_every_case_without_the_reference():
    """tools/bench_issue17.py and bench_issue18.py --explain (CPU, meta tensors): each runs,
    and no case of theirs plans a reference segment, so the GPU run times kernels and library
    calls only."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for script in ("bench_issue17.py", "bench_issue18.py"):
        r = subprocess.run([sys.executable, str(root / "tools" / script), "--explain"],
                           capture_output=True, text=True, env=env, cwd=root / "tools",
                           timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.count("== ") >= 4 and "segment 0: kernel" in r.stdout
        assert ": reference" not in r.stdout, r.stdout
