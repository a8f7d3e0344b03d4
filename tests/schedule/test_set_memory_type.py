"""set_memory_type: where a tensor lives, and the memories some tensors may not leave."""
import pytest

from pyfuser import FusionDefinition
from pyfuser.ir import LoadKind, MemoryType, ScheduleError
from pyfuser.ir.printer import tv_str
from pyfuser.schedule import cache_after, set_memory_type


def _fusion():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        a = fd.ops.exp(x)
        fd.add_output(fd.ops.neg(a))
    return fd, x, a, fd.fusion.outputs[0]


@pytest.mark.parametrize("memory, letter", [(MemoryType.Shared, "s"), (MemoryType.Global, "g"),
                                            (MemoryType.Local, "l")])
def test_intermediate_can_live_anywhere(memory, letter):
    fd, x, a, out = _fusion()
    assert set_memory_type(a, memory) is a
    assert a.memory_type == memory
    assert tv_str(a).startswith(f"T1_{letter}_float[")


@pytest.mark.parametrize("memory", [MemoryType.Shared, MemoryType.Local])
def test_inputs_and_outputs_stay_global(memory):
    fd, x, a, out = _fusion()
    for tv in (x, out):
        with pytest.raises(ScheduleError, match=rf"set_memory_type on T{tv.name}: fusion inputs "
                                                r"and outputs stay in global memory"):
            set_memory_type(tv, memory)
        assert tv.memory_type == MemoryType.Global
    set_memory_type(out, MemoryType.Global)  # a no-op, allowed


@pytest.mark.parametrize("kind, what", [(LoadKind.TmaBulk, "TMA"), (LoadKind.TmaTensor, "TMA"),
                                        (LoadKind.CpAsync, "cp.async")])
@pytest.mark.parametrize("memory", [MemoryType.Local, MemoryType.Global])
def test_async_loads_write_shared_memory_only(kind, what, memory):
    fd, x, a, out = _fusion()
    c = cache_after(x, kind)
    with pytest.raises(ScheduleError, match=rf"set_memory_type on T{c.name}: {what} loads write shared "
                                            r"memory only"):
        set_memory_type(c, memory)
    assert c.memory_type == MemoryType.Shared


def test_plain_load_may_move_between_memories():
    fd, x, a, out = _fusion()
    c = cache_after(x)
    set_memory_type(c, MemoryType.Shared)
    assert c.memory_type == MemoryType.Shared
    set_memory_type(c, MemoryType.Local)
    assert c.memory_type == MemoryType.Local
