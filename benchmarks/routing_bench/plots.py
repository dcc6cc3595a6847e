"""PNG plots per workload: TTFT p90 and throughput vs offered load, one line per contender."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

PLOTS = (("ttft_p90_s", "TTFT p90 (s)", "ttft_p90"), ("output_tok_s", "output tokens/s", "tput"))


def plot_workloads(rows: Sequence[Mapping[str, Any]], out: Path, simulated: bool) -> list[Path]:
    """Write two PNGs per workload into `out`; return their paths."""
    return list(iter_plots(rows, out, simulated))


def iter_plots(rows: Sequence[Mapping[str, Any]], out: Path, simulated: bool) -> Iterator[Path]:
    """Write the PNGs one by one, yielding each path once its file is complete."""
    # A generator, so that a caller whose plotting fails halfway still knows which files exist.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = sorted({str(r["workload"]) for r in rows if r.get("status") == "ok"})
    suffix = " — simulated fleet" if simulated else ""
    for wl in workloads:
        mine = [r for r in rows if r["workload"] == wl and r.get("status") == "ok"]
        names = sorted({str(r["contender"]) for r in mine})
        for metric, label, stem in PLOTS:
            fig, ax = plt.subplots(figsize=(7, 4.2))
            try:
                # 12+ contenders: the default colour cycle repeats after 10.
                colors = [plt.get_cmap("tab20")(i / 19) for i in range(20)]
                for i, name in enumerate(names):
                    pts = sorted(
                        (float(r["offered_qps"]), float(r[metric]))
                        for r in mine
                        if r["contender"] == name and r.get(metric) is not None
                    )
                    if pts:
                        style = "-" if name.startswith("gateway:") else "--"
                        ax.plot(
                            *zip(*pts, strict=True),
                            style,
                            marker="o",
                            label=name,
                            color=colors[i % len(colors)],
                        )
                ax.set_xlabel("offered load (requests/s)")
                ax.set_ylabel(label)
                if metric == "ttft_p90_s":
                    ax.set_yscale("log")
                ax.set_title(f"{wl}: {label} vs offered load{suffix}", fontsize=10)
                ax.grid(True, alpha=0.3)
                ax.legend(fontsize=7, loc="best")
                fig.tight_layout()
                path = out / f"{wl}_{stem}.png"
                fig.savefig(path, dpi=110)
            finally:
                plt.close(fig)
            yield path
