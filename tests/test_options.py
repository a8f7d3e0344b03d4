"""pyfuser.options: PYFUSER_DUMP / ENABLE / DISABLE parsing, overrides, per-call options, dumps."""
import os

import pytest
import torch

from pyfuser import FusionDefinition
from pyfuser import options as opts
from pyfuser.options import OptionError, Options, from_environment


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for k in ("PYFUSER_DUMP", "PYFUSER_ENABLE", "PYFUSER_DISABLE", "PYFUSER_DUMP_DIR",
              "PYFUSER_CACHE_DIR", "PYFUSER_DISABLE_DISK_CACHE"):
        monkeypatch.delenv(k, raising=False)
    opts.reload_environment()
    yield
    monkeypatch.undo()
    opts.reload_environment()


def test_environment_parsing():
    o = from_environment({"PYFUSER_DUMP": "fusion_ir, cuda,,ptxas ",
                          "PYFUSER_ENABLE": "ws_normalization",
                          "PYFUSER_DISABLE": "tma_inner_persistent,kernel_reuse",
                          "PYFUSER_DUMP_DIR": "/tmp/d", "PYFUSER_CACHE_DIR": "/tmp/c",
                          "PYFUSER_DISABLE_DISK_CACHE": "1"})
    assert o.dump == {"fusion_ir", "cuda", "ptxas"}
    assert o.enable == {"ws_normalization"}
    assert o.disable == {"tma_inner_persistent", "kernel_reuse"}
    assert (o.dump_dir, o.cache_dir, o.disk_cache) == ("/tmp/d", "/tmp/c", False)
    assert o.dumps("cuda") and not o.dumps("kernel_ir")
    assert o.is_enabled("ws_normalization") is True
    assert o.is_enabled("kernel_reuse") is False
    assert o.is_enabled("ws_inner_persistent") is None  # the heuristic decides


def test_empty_environment():
    o = from_environment({})
    assert o == Options()
    assert not o.dumps("fusion_ir") and o.disk_cache and o.dump_dir is None


def test_dump_all():
    o = from_environment({"PYFUSER_DUMP": "all"})
    assert all(o.dumps(s) for s in opts.DUMP_STAGES)


@pytest.mark.parametrize("var, value, what", [
    ("PYFUSER_DUMP", "fusion_ir,kernel_irr", "dump"),
    ("PYFUSER_ENABLE", "ws_normalisation", "enable"),
    ("PYFUSER_DISABLE", "cuda", "disable"),  # a dump stage is not a feature
])
def test_unknown_names_raise(var, value, what):
    bad = value.split(",")[-1]
    with pytest.raises(OptionError) as e:
        from_environment({var: value})
    msg = str(e.value)
    assert msg.startswith(f"unknown {what} option(s) ['{bad}']")
    assert "choose from" in msg


def test_environment_is_read_through_current(monkeypatch):
    monkeypatch.setenv("PYFUSER_DUMP", "heuristics")
    monkeypatch.setenv("PYFUSER_DISABLE", "ws_normalization")
    opts.reload_environment()
    assert opts.current().dump == {"heuristics"}
    assert opts.current().is_enabled("ws_normalization") is False


def test_override_nesting(monkeypatch):
    monkeypatch.setenv("PYFUSER_DISABLE", "ws_normalization")
    opts.reload_environment()
    env = opts.current()
    with opts.override(dump=["cuda"]) as outer:
        assert opts.current() is outer
        assert outer.dump == {"cuda"} and outer.disable == {"ws_normalization"}
        with opts.override({"dump": "ptxas", "enable": ["ws_normalization"]}) as inner:
            assert inner.dump == {"cuda", "ptxas"}
            # The innermost setting wins over the environment's.
            assert inner.is_enabled("ws_normalization") is True
            assert inner.disable == frozenset()
            with opts.override(disable=["ws_normalization"]):
                assert opts.current().is_enabled("ws_normalization") is False
            assert opts.current() is inner
        assert opts.current() is outer
        assert outer.is_enabled("ws_normalization") is False
    assert opts.current() is env


def test_override_restores_after_exception():
    env = opts.current()
    with pytest.raises(RuntimeError):
        with opts.override(dump=["cuda"]):
            raise RuntimeError("boom")
    assert opts.current() is env


def test_override_with_options_instance_replaces():
    with opts.override(dump=["cuda"]):
        with opts.override(Options(enable=frozenset({"kernel_reuse"}))) as o:
            assert o.dump == frozenset() and o.enable == {"kernel_reuse"}


@pytest.mark.parametrize("kwargs, message", [
    ({"dump": ["cudaa"]}, "unknown dump option(s) ['cudaa']"),
    ({"enable": "nope"}, "unknown enable option(s) ['nope']"),
    ({"dumps": ["cuda"]}, "unknown option 'dumps'"),
])
def test_override_rejects_unknown(kwargs, message):
    env = opts.current()
    with pytest.raises(OptionError) as e:
        with opts.override(**kwargs):
            pass
    assert str(e.value).startswith(message)
    assert opts.current() is env


def _fusion():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1])
        fd.add_output(fd.ops.neg(x))
    return fd


def test_per_call_options(monkeypatch):
    from pyfuser.runtime import executor
    seen = []
    real = executor.evaluate

    def recording(*args, **kwargs):
        seen.append(opts.current())
        return real(*args, **kwargs)

    monkeypatch.setattr(executor, "evaluate", recording)
    fd = _fusion()
    x = torch.randn(5)
    (out,) = fd.execute([x], options={"dump": ["fusion_ir"], "enable": ["ws_normalization"]})
    torch.testing.assert_close(out, -x)
    assert seen[-1].dump == {"fusion_ir"} and seen[-1].enable == {"ws_normalization"}
    assert opts.current().dump == frozenset()  # only for that call
    fd.execute([x])
    assert seen[-1].dump == frozenset()
    n = len(seen)
    with pytest.raises(OptionError, match=r"unknown dump option\(s\) \['bogus'\]"):
        fd.execute([x], options={"dump": ["bogus"]})
    assert len(seen) == n


def test_dump_to_directory(tmp_path):
    d = tmp_path / "dumps"
    with opts.override(dump=["fusion_ir", "cuda"], dump_dir=str(d)):
        opts.dump("fusion_ir", "my fusion/1", "T0 = ...")
        opts.dump("cuda", "k0", "__global__ void k0() {}")
        opts.dump("ptxas", "k0", "not asked for")
    assert sorted(os.listdir(d)) == ["k0.cuda.txt", "my_fusion_1.fusion_ir.txt"]
    assert (d / "my_fusion_1.fusion_ir.txt").read_text() == "T0 = ..."
    assert (d / "k0.cuda.txt").read_text() == "__global__ void k0() {}"


def test_dump_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PYFUSER_DUMP", "kernel_ir")
    monkeypatch.setenv("PYFUSER_DUMP_DIR", str(tmp_path))
    opts.reload_environment()
    opts.dump("kernel_ir", "k", "kernel text")
    opts.dump("cuda", "k", "no")
    assert os.listdir(tmp_path) == ["k.kernel_ir.txt"]


def test_dump_to_stderr(capsys):
    with opts.override(dump=["heuristics"]):
        opts.dump("heuristics", "softmax", "threads=128")
        opts.dump("cuda", "softmax", "not asked for")
    err = capsys.readouterr().err
    assert "===== heuristics: softmax =====\nthreads=128" in err
    assert "not asked for" not in err


def test_an_override_holds_on_its_own_thread_only():
    import threading
    seen = {}

    def other():
        seen["inside"] = opts.current().enable
        with opts.override(enable=["streaming_loads"]):
            seen["own"] = opts.current().enable

    with opts.override(enable=["kernel_reuse"]):
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert opts.current().enable == frozenset({"kernel_reuse"})
    assert seen["inside"] == opts.current().enable
    assert "kernel_reuse" not in seen["inside"] and "streaming_loads" in seen["own"]


def test_a_dumped_text_made_by_a_function_is_made_only_when_dumped(capsys):
    """The executor passes its fusion's printing as a function: a process that dumps nothing
    prints no fusion (about a millisecond each, paid per segment by a new process's first
    execute)."""
    made = []

    def text():
        made.append(1)
        return "T0 = ..."
    with opts.override(dump=["cuda"]):
        opts.dump("fusion_ir", "f", text)
        assert made == []
    with opts.override(dump=["fusion_ir"]):
        opts.dump("fusion_ir", "f", text)
    assert made == [1] and "T0 = ..." in capsys.readouterr().err


def test_verify_kernel_ir_checks_after_every_lowering_pass(monkeypatch):
    """With verify_kernel_ir on, lowering runs the verifier after each of its passes (the
    fuzzer's CPU runs turn it on); off, never."""
    import pyfuser.lower as lowering
    from pyfuser.runtime.explain import explain_fusion
    calls = []
    real = lowering.verify_kernel
    monkeypatch.setattr(lowering, "verify_kernel",
                        lambda k, rules, after: calls.append(after) or real(k, rules, after))
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sum(fd.ops.exp(x), [1]))
    inputs = [torch.empty(64, 1000, device="meta")]
    explain_fusion(fd.fusion, inputs)
    assert calls == []
    with opts.override(enable=["verify_kernel_ir"]):
        explain_fusion(fd.fusion, inputs)
    assert calls == [p.__name__ for p in lowering.PIPELINE], calls
