"""The README's promises: its example runs as written (here on the CPU, where it shows both the
reference evaluator and the kernel-IR interpreter), and its commands are the ones CI runs."""
import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README, flags=re.S | re.M)


pytestmark = pytest.mark.usefixtures("isolated_cache")   # tests/conftest.py


def test_the_example_runs_as_written():
    import torch
    blocks = _python_blocks()
    assert len(blocks) == 1 and "FusionDefinition" in blocks[0]
    out = io.StringIO()
    ns: dict = {"__name__": "__readme__"}
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[0], "README.md", "exec"), ns)
    printed = out.getvalue()
    if torch.cuda.is_available():
        return
    # On a CPU: the comments' claims, the reference run, then the interpreter run.
    assert "RunInfo(kind='reference'" in printed
    assert "reason='inputs are not on a CUDA device (PYFUSER_ENABLE=interpret runs the generated "\
           "kernels on CPU tensors)'" in printed
    assert printed.splitlines()[-1] == "kernels interpreter ('inner_persistent',)"
    assert "# kernels interpreter ('inner_persistent',)" in blocks[0]
    y, x, w = ns["y"], ns["x"], ns["w"]
    xf = x.float()
    want = (xf * torch.rsqrt((xf * xf).mean(1, keepdim=True) + 1e-6) * w.float()).bfloat16()
    torch.testing.assert_close(y, want)


def test_the_commands_are_the_ones_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "```\npython -m pytest -q\n```" in README
    assert "python3 -m pytest -q" in ci
    main = re.search(r'^pip install "torch==(\S+)" -e "\.\[test\]" && '
                     r"python -m pyfuser explain (\w+) --compile$", README, flags=re.M)
    assert main, "the README's main command"
    assert f'"torch=={main.group(1)}"' in ci
    from pyfuser import catalogue
    assert main.group(2) in catalogue.names()
