"""`python -m pyfuser explain ...`: the fusion IR of a catalogue fusion and its reference run."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pyfuser import catalogue
from pyfuser.__main__ import main
from pyfuser.runtime.reference import evaluate

ROOT = Path(__file__).resolve().parents[1]


def _expected_output_lines(name, M, N):
    fd = catalogue.define(name)
    inputs = catalogue.make_inputs(name, M, N, "bf16", seed=0)  # explain uses seed 0
    outs = evaluate(fd.fusion, inputs)
    return [f"  output {k} (T{v.name}): shape {tuple(o.shape)} {o.dtype}, "
            f"mean {o.float().mean().item():+.5f}, max |x| {o.float().abs().max().item():.5f}"
            for k, (v, o) in enumerate(zip(fd.fusion.outputs, outs))], fd


def _check_rmsnorm_bwd_text(text):
    assert text.startswith("# rmsnorm_bwd: RMSNorm backward")
    assert "# shape 64x256, dtype bf16" in text
    ir = text[text.index("## Fusion IR"):]
    assert "Inputs:\n  T0_g_bfloat16[iS0{i0}, iS1{i1}]\n  T1_g_bfloat16[iS2{i2}, iS3{i3}]" in ir
    assert "  T3_g_float[iS5{i5}, bS6{1}]" in ir
    assert re.search(r"T\d+_l_float\[iS\d+\{i2\}, rS\d+\{i3\}\]\n   = reduction\(", ir)
    assert "%kernel_math {" in ir and "} // %kernel_math" in ir
    ref = text[text.index("## Reference evaluator"):]
    lines, fd = _expected_output_lines("rmsnorm_bwd", 64, 256)
    assert str(fd.fusion) in text
    for line in lines:
        assert line in ref, (line, ref)
    assert "shape (64, 256) torch.bfloat16" in lines[0] and "shape (256,)" in lines[1]


def test_explain_in_process(capsys):
    assert main(["explain", "rmsnorm_bwd", "--shape", "64x256"]) == 0
    _check_rmsnorm_bwd_text(capsys.readouterr().out)


def test_explain_list_in_process(capsys):
    assert main(["explain", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines] == catalogue.names()
    assert any(ln.startswith("rmsnorm_bwd") and "RMSNorm backward" in ln for ln in lines)


def test_explain_no_run(capsys):
    assert main(["explain", "softmax", "--shape", "8x32", "--no-run"]) == 0
    out = capsys.readouterr().out
    assert "## Fusion IR" in out and "## Reference evaluator" not in out


def test_bad_shape_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["explain", "softmax", "--shape", "64by256"])
    assert e.value.code == 2
    assert "shape must look like 16384x4096, got '64by256'" in capsys.readouterr().err


def test_unknown_fusion_is_a_usage_error(capsys):
    """A misspelt name gets the catalogue's names and exit code 2, not a traceback."""
    assert main(["explain", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown fusion 'nope'" in err and "rmsnorm_fwd" in err and "Traceback" not in err


def _run(*args):
    return subprocess.run([sys.executable, "-m", "pyfuser", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.slow
def test_explain_subprocess():
    r = _run("explain", "rmsnorm_bwd", "--shape", "64x256")
    assert r.returncode == 0, r.stderr
    _check_rmsnorm_bwd_text(r.stdout)
    r = _run("explain", "list")
    assert r.returncode == 0, r.stderr
    assert [ln.split()[0] for ln in r.stdout.splitlines()] == catalogue.names()


def test_bench_of_an_unknown_fusion_is_a_usage_error(capsys):
    # Checked before looking for a GPU, so on this machine too.
    assert main(["bench", "softmax", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown fusion 'nope'" in err and "'softmax'" not in err
