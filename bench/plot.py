"""Plot GB/s against N for pyfuser and each peer from a bench JSON (python -m pyfuser bench --out).

    python bench/plot.py bench/results/2026-11-22-h100-catalogue.json bench/results/
"""
import json
import sys
from pathlib import Path


def main(path: str, out_dir: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = json.loads(Path(path).read_text())
    copy = report["copy_gbps"]
    by_op: dict = {}
    for r in report["results"]:
        by_op.setdefault(r["name"], []).append(r)
    # Several row counts per op (a sweep of M x N): one plot per (op, M).
    split = {}
    for op, rows in by_op.items():
        ms = sorted({r["M"] for r in rows})
        if len(ms) > 1 and sum(sum(1 for r in rows if r["M"] == m) > 1 for m in ms) > 1:
            for m in ms:
                split[f"{op}-M{m}"] = [r for r in rows if r["M"] == m]
        else:
            split[op] = rows
    by_op = split
    for op, rows in by_op.items():
        # The norm backward's forced variants, when the bench timed them, beside the choice.
        variants = [v for v in ("pyfuser-multi-wave", "pyfuser-warp-specialized")
                    if any(r["gbps"].get(v) for r in rows)]
        impls = ["pyfuser"] + variants + report["peers"]
        if len({r["N"] for r in rows}) < 2:
            continue
        rows.sort(key=lambda r: r["N"])
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for impl in impls:
            # pyfuser points only where generated kernels ran (not the reference fallback).
            pts = [(r["N"], r["gbps"].get(impl)) for r in rows if r["gbps"].get(impl)
                   and (not impl.startswith("pyfuser")
                        or r["notes"].get(impl, "").startswith("kernels"))]
            if pts:
                style = ":" if impl in variants else "-"
                ax.plot(*zip(*pts), marker="o", label=impl, linestyle=style,
                        linewidth=2.5 if impl == "pyfuser" else 1.2)
        ax.axhline(copy, color="gray", linestyle="--", linewidth=1, label=f"copy {copy:.0f}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("N (row length)")
        ax.set_ylabel("GB/s (ANCHORS.md byte counts)")
        ax.set_title(f"{op}, bf16, {report['device']}, {report['date']}", fontsize=9)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(Path(out_dir) / f"{Path(path).stem}-{op}.png", dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
