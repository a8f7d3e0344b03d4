"""NVRTC compilation to sm_90a cubins and the ptxas report (CPU only: NVRTC needs no GPU)."""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("cuda.bindings.nvrtc")

from pyfuser.runtime.nvrtc import (  # noqa: E402
    CompileError,
    compile_to_cubin,
    nvrtc_version,
    parse_ptxas_log,
)

REPO = Path(__file__).resolve().parents[2]

SIMPLE = r"""
extern "C" __global__ void simple(float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 2.0f * i;
}
"""

# A dynamically indexed local array cannot live in registers: it goes to the stack frame. With
# a 32-register cap, ptxas must also spill live values.
LOCAL_ARRAY = r"""
extern "C" __global__ void local_array(float* out, int n) {
  float a[64];
  for (int j = 0; j < 64; ++j) a[j] = out[j * n];
  out[threadIdx.x] = a[n & 63];
}
"""

SETMAXNREG_BODY = r"""
  if (threadIdx.x < 128) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
  else asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
  out[threadIdx.x] = 1.0f;
"""


def test_small_kernel_report():
    module = compile_to_cubin(SIMPLE, "simple")
    report = module.ptxas
    assert module.cubin[:4] == b"\x7fELF"
    assert report.function == "simple" and module.entry_name == "simple"
    assert report.registers > 0
    assert not report.has_spills and report.stack_frame_bytes == 0
    assert report.warnings == ()
    assert "simple: " in report.summary() and "registers" in report.summary()
    assert module.arch == "sm_90a" and module.nvrtc_version == nvrtc_version() >= (13, 0)
    for option in ("-std=c++17", "--gpu-architecture=sm_90a", "--ptxas-options=-v", "-lineinfo"):
        assert option in module.options


def test_caller_options_are_appended():
    module = compile_to_cubin(SIMPLE, "simple", options=("--use_fast_math",))
    assert module.options[-1] == "--use_fast_math"


def test_spills_under_register_cap():
    module = compile_to_cubin(LOCAL_ARRAY, "local_array", options=("--maxrregcount=32",))
    report = module.ptxas
    assert report.registers <= 32
    assert report.has_spills, report.summary()
    assert report.spill_store_bytes > 0 and report.spill_load_bytes > 0
    assert report.stack_frame_bytes > 0
    assert "spill stores" in report.summary()


def test_dynamic_local_array_is_a_stack_frame_not_a_spill():
    big = LOCAL_ARRAY.replace("64", "256").replace("& 63", "& 255")
    report = compile_to_cubin(big, "local_array").ptxas
    assert report.stack_frame_bytes >= 1024
    assert not report.has_spills


def test_static_shared_memory_and_barriers():
    source = r"""
    namespace pf {
    __global__ void smem(float* out) {
      __shared__ float s[1024];
      s[threadIdx.x] = threadIdx.x;
      __syncthreads();
      out[threadIdx.x] = s[1023 - threadIdx.x];
    }
    }  // namespace pf
    """
    module = compile_to_cubin(source, "pf::smem")
    assert module.entry_name == "_ZN2pf4smemEPf", "a namespaced kernel resolves to its symbol"
    assert module.symbol == module.entry_name
    assert module.ptxas.static_smem_bytes == 4096
    assert module.ptxas.barriers == 1


def test_setmaxnreg_without_launch_bounds_is_reported():
    """ptxas prints C7508 as an *info* line, yet it silently drops the register split."""
    source = f'extern "C" __global__ void ws(float* out) {{{SETMAXNREG_BODY}}}'
    report = compile_to_cubin(source, "ws").ptxas
    assert any("C7508" in line and "setmaxnreg" in line for line in report.warnings), (
        report.warnings
    )


def test_setmaxnreg_with_launch_bounds_is_clean():
    source = (
        f'extern "C" __global__ void __launch_bounds__(384, 1) ws(float* out) '
        f"{{{SETMAXNREG_BODY}}}"
    )
    report = compile_to_cubin(source, "ws").ptxas
    assert report.warnings == (), report.warnings


def test_syntax_error_shows_numbered_source():
    source = 'extern "C" __global__ void broken(float* out) {\n  int x = 1\n  out[0] = x;\n}\n'
    with pytest.raises(CompileError) as info:
        compile_to_cubin(source, "broken")
    message = str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert "'broken'" in message and "NVRTC_ERROR_COMPILATION" in message
    assert 'expected a ";"' in message, "the NVRTC log is included"
    assert ">> 3 |   out[0] = x;" in message, "the first error line is marked"
    assert "   2 |   int x = 1" in message, "with context around it"


def test_error_excerpt_is_limited_to_a_window():
    lines = [f"// filler {i}" for i in range(40)]
    lines[30] = "this is not C++;"
    with pytest.raises(CompileError) as info:
        compile_to_cubin("\n".join(lines), "k")
    message = str(info.value)
    assert ">> 31 | this is not C++;" in message
    assert "// filler 20" not in message and "// filler 27" in message


def test_unknown_kernel_name():
    with pytest.raises(CompileError, match="no __global__ function named 'missing'"):
        compile_to_cubin(SIMPLE, "missing")


def test_invalid_option():
    with pytest.raises(CompileError, match="NVRTC_ERROR_INVALID_OPTION"):
        compile_to_cubin(SIMPLE, "simple", options=("--no-such-option",))


def test_virtual_architecture_is_refused():
    with pytest.raises(ValueError, match="real architecture"):
        compile_to_cubin(SIMPLE, "simple", arch="compute_90a")


def test_parse_picks_the_named_function_and_collects_diagnostics():
    log = "\n".join([
        "ptxas info    : (C7508) Potential Performance Loss: 'setmaxnreg' ignored; unable to"
        " determine register count at entry.",
        "ptxas info    : Compiling entry function 'a' for 'sm_90a'",
        "ptxas info    : Function properties for a",
        "ptxas         .     8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads",
        "ptxas info    : Used 40 registers, used 2 barriers, 96 bytes smem",
        "ptxas warning : Registers are spilled to local memory in function 'a'",
        "ptxas info    : Compiling entry function 'b' for 'sm_90a'",
        "ptxas info    : Function properties for b",
        "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
        "ptxas info    : Used 8 registers, used 0 barriers",
    ])
    a = parse_ptxas_log(log, "a")
    assert (a.registers, a.barriers, a.static_smem_bytes) == (40, 2, 96)
    assert (a.stack_frame_bytes, a.spill_store_bytes, a.spill_load_bytes) == (8, 4, 12)
    assert len(a.warnings) == 2 and a.has_spills
    b = parse_ptxas_log(log, "b")
    assert (b.registers, b.barriers, b.has_spills) == (8, 0, False)
    assert parse_ptxas_log(log).function == "a", "without a name, the first entry"
    assert parse_ptxas_log("").registers == 0


def test_runtime_modules_import_without_cuda_packages():
    """``import pyfuser`` must work where cuda-bindings is missing: imports are lazy."""
    code = (
        "import sys\n"
        "sys.modules['cuda'] = None\n"
        "import pyfuser.runtime.nvrtc, pyfuser.runtime.kernel_cache, pyfuser.runtime.launch\n"
        "import pyfuser.runtime.device, pyfuser.runtime.tensor_map\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, env=_env_with_repo())
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


def _env_with_repo():
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def test_reading_an_empty_log_leaves_the_shared_one_byte_bytes_alone(tmp_path):
    """An empty NVRTC log is one NUL byte. Read into b" " * 1, which is CPython's shared b" "
    where the module was compiled from source, the NUL turned every later b" " of the process
    into b"\\0" and, on Python 3.12, the " " of modules compiled afterwards (generated CUDA
    printed "long longT1[1]": GPU tests after the device-library tests failed to compile).
    Checked in a fresh process whose pyfuser is compiled from source (an empty pycache prefix)."""
    code = (
        "from cuda.bindings import nvrtc\n"
        "from pyfuser.runtime.nvrtc import _read_log\n"
        "err, prog = nvrtc.nvrtcCreateProgram(b'extern \"C\" __global__ void k() {}', b'k.cu',"
        " 0, [], [])\n"
        "opts = [b'--gpu-architecture=sm_90a']\n"           # no ptxas report: an empty log
        "assert nvrtc.nvrtcCompileProgram(prog, 1, opts)[0] == nvrtc.nvrtcResult.NVRTC_SUCCESS\n"
        "assert nvrtc.nvrtcGetProgramLogSize(prog)[1] == 1\n"
        "assert _read_log(prog) == ''\n"
        "assert b' '.hex() == '20', b' '\n"          # [0] would be folded at compile time
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-X", f"pycache_prefix={tmp_path}", "-c", code],
                            cwd=REPO, capture_output=True, text=True, env=_env_with_repo())
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr
