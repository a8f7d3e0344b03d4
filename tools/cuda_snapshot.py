"""Write the generated CUDA of every catalogue fusion, at a few shapes and dtypes, to a folder.

A change meant to leave the catalogue's kernels alone (a scheduling fix for a fuzz case, a
refactor) is checked by diffing two snapshots:

    PYTHONPATH=. python tools/cuda_snapshot.py /tmp/before   # on the base commit
    PYTHONPATH=. python tools/cuda_snapshot.py /tmp/after
    diff -r /tmp/before /tmp/after

No GPU needed: heuristics read the device table (--device), nothing is compiled.
"""
from __future__ import annotations

import argparse
import os

SHAPES = [(4096, 4096), (2048, 1024), (16384, 1000), (7, 1000), (8, 65536), (33, 1003)]
DTYPES = ["bf16", "fp32"]
# Forced features whose kernels the default heuristics do not choose (options.FEATURES).
VARIANTS = ["tma_inner_persistent", "tma_inner_persistent+tma_tensor_map", "ws_inner_persistent",
            "ws_inner_persistent+tma_tensor_map", "ws_normalization"]


def main() -> int:
    from pyfuser import options

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--device", default="h100")
    ap.add_argument("--variants", action="store_true",
                    help="also each forced feature of VARIANTS (pipelined TMA, tensor-map, "
                         "cp.async and warp-specialized kernels), in files tagged by it")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for variant in [""] + (VARIANTS if args.variants else []):
        with options.override(enable=variant.split("+") if variant else []):
            _write(args, variant)
    print(f"wrote {len(os.listdir(args.out))} files to {args.out}")
    return 0


def _write(args, variant: str) -> None:
    from pyfuser import catalogue
    from pyfuser.runtime.device import get_device_properties
    from pyfuser.runtime.executor import index_type_for
    from pyfuser.runtime.fusion_kernel import build_kernel
    from pyfuser.runtime.inputs import heuristic_info
    from pyfuser.schedule.schedulers import registry

    for name in catalogue.names():
        for dt in DTYPES:
            for M, N in SHAPES:
                tag = f"{name}-{dt}-{M}x{N}" + (f"-{variant}" if variant else "")
                fd = catalogue.define(name, dt)
                inputs = catalogue.make_inputs(name, M, N, dt, device="meta")
                choice = registry.choose(fd.fusion)
                if choice.scheduler is None:
                    text = f"no scheduler: {choice.reason}\n"
                else:
                    try:
                        clone, info = heuristic_info(fd.fusion, inputs,
                                                     get_device_properties(args.device))
                        params = choice.scheduler.compute_heuristics(clone, info)
                        fk = build_kernel(clone, choice.scheduler, params,
                                          index_type_for(inputs), tag.replace("-", "_"),
                                          compile_now=False)
                        text = f"// {params!r}\n" + fk.source[fk.source.index("typedef"):]
                    except Exception as e:  # noqa: BLE001 - recorded, compared like a kernel
                        text = f"error: {type(e).__name__}: {e}\n"
                with open(os.path.join(args.out, tag + ".cu"), "w") as f:
                    f.write(text)


if __name__ == "__main__":
    raise SystemExit(main())
