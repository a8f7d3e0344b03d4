"""The launch path against a recording stand-in for libcuda.so.1 (no GPU needed).

fake_libcuda.c is built with the C compiler, and fake_driver_checks.py runs in a subprocess whose
LD_LIBRARY_PATH finds the fake first, so pyfuser's driver calls (cuda_driver.py) bind to it. What this proves: the bytes
the driver would copy for each parameter (at the cubin's own offsets), grid/block/stream/shared
memory, launch attributes for clusters and cooperative launches, function attributes set once,
context handling, error messages, and the arguments of cuTensorMapEncodeTiled. What it cannot
prove: that a real driver and GPU accept them; the gpu-marked tests do that.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CHECKS = re.findall(r"^def (check_\w+)\(", (HERE / "fake_driver_checks.py").read_text(), re.M)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF/dlopen only")


@pytest.fixture(scope="module")
def fake_driver_results(tmp_path_factory):
    pytest.importorskip("cuda.bindings.nvrtc")       # the checks compile their kernels
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        pytest.skip("no C compiler to build the fake driver")
    folder = tmp_path_factory.mktemp("fake_libcuda")
    library = folder / "libcuda.so.1"
    build = subprocess.run(
        [compiler, "-O2", "-shared", "-fPIC", "-o", str(library), str(HERE / "fake_libcuda.c")],
        capture_output=True, text=True,
    )
    assert build.returncode == 0, build.stderr
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(folder),
                                                           env.get("LD_LIBRARY_PATH")]))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["CUDA_VISIBLE_DEVICES"] = ""  # keep torch, if it initializes CUDA, away from the fake
    result = subprocess.run(
        [sys.executable, str(HERE / "fake_driver_checks.py")],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=600,
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("check", CHECKS)
def test_against_fake_driver(fake_driver_results, check):
    outcome = fake_driver_results[check]
    assert outcome == "ok", outcome


def test_checks_ran_without_torch(fake_driver_results):
    assert fake_driver_results["torch_imported"] is False


def test_per_call_cost(fake_driver_results):
    """Python cost of a launch with a driver that returns at once (the real driver adds its
    own few microseconds). Loose bounds: only a pathological regression should fail here."""
    timings = fake_driver_results["timings_ns"]
    print("per-call cost (ns):", timings)
    assert timings["pack"] < 5_000
    assert timings["launch"] < 20_000 and timings["cluster_launch"] < 20_000
