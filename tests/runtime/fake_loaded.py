"""A stand-in for launch.LoadedKernel in CPU tests of the executor's CUDA path: the plan is built
as on a GPU (NVRTC compiles the kernel) and each launch is recorded instead of calling the
driver, as (grid, block, packed parameter bytes, keywords); a launch through a plan's
`launcher` (its cached call's plain launch) records keywords with how="launcher"."""


class FakeLoaded:
    def __init__(self):
        self.launches = []

    def check_layout(self, layout):
        pass

    def launch(self, grid, block, params, **kw):
        self.launches.append((grid, block, params, kw))

    def launcher(self, grid, block, layout, shared_mem=0):
        return lambda values: self.launches.append(
            (grid, block, layout.pack(values), {"shared_mem": shared_mem, "how": "launcher"}))


def install_fake_gpu(monkeypatch, stream: int = 0) -> dict:
    """Every FusionKernel's loaded kernel a FakeLoaded (id(kernel) -> it, the dict returned),
    the device table's H100 as the live device, and `stream` as PyTorch's current stream
    (launch._stream_getter: a test may set it again)."""
    from pyfuser.runtime import device as device_mod
    from pyfuser.runtime import fusion_kernel
    from pyfuser.runtime import launch
    monkeypatch.setattr(launch, "_stream_getter", lambda index: stream)
    loaded = {}
    monkeypatch.setattr(fusion_kernel.FusionKernel, "loaded",
                        lambda self, index: loaded.setdefault(id(self), FakeLoaded()))
    monkeypatch.setattr(device_mod, "get_device_properties",
                        lambda *_: device_mod.DEVICE_TABLE["h100"])
    return loaded
