"""``profile.png``: stage rates against the ideal, and the CPU / disk timeline of every phase."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from stallfree.stage_runtime.profile.report import NOT_INPUT_BOUND, headline

__all__ = ["colours", "draw_profile", "title"]


def title(result: dict[str, Any], width: int = 100) -> str:
    """The chart's title, wrapped to ``width``: what ran the step, the batch, and the report's headline.

    The step is the model on its device, or the simulated device (``--accelerator sim:R``) when there was one: the
    model then never ran.
    """
    device = result.get("accelerator")
    ran = (f"a simulated device of {device['images_per_s']:g} img/s ({device['name']})" if device else
           f"{result['model']} on {result['device']}")
    return textwrap.fill(f"{ran}, batch {result['batch_size']}: {headline(result['stalls'])}", width)


def colours(values: list[float], ideal: float, input_bound: bool) -> list[str]:
    """A bar is red only where the run waited for input and the bar is slower than the step; else neutral.

    On a compute-bound run a stage slower than the ideal step stalls nothing (the real run kept up), so it is not
    drawn as a fault.
    """
    if not input_bound:
        return ["tab:blue"] * len(values)
    return ["tab:red" if v < ideal else "tab:green" for v in values]


def draw_profile(result: dict[str, Any], path: str | Path) -> Path:
    """Draw ``profile.json``'s content (``result``) to ``path`` with matplotlib's Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = result["phases"]
    images = max(1, phases["storage"]["files"])
    per_file = phases["storage"]["bytes"] / images
    rates = [("storage, cold", phases["storage"]["cold_bytes_per_s"] / per_file),
             ("storage, warm", phases["storage"]["warm_bytes_per_s"] / per_file)]
    rates += [(f"prepare, {p['threads']} thr", p["images_per_s"]) for p in phases["preparation"]["points"]]
    rates += [("real run", phases["real_run"]["samples_per_s"]),
              ("real run, from memory", phases["cached_run"]["samples_per_s"])]
    for name, run in result.get("compare", {}).items():
        rates.append((f"{name} DataLoader", run["samples_per_s"]))
    ideal = phases["compute"]["images_per_s"]

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 8), gridspec_kw={"height_ratios": [1.2, 1]})
    names = [n for n, _ in rates]
    values = [v for _, v in rates]
    input_bound = result["stalls"]["measured_stall_share"] >= NOT_INPUT_BOUND
    top.barh(names, values, color=colours(values, ideal, input_bound))
    step = "simulated device" if result.get("accelerator") else "model on synthetic data"
    top.axvline(ideal, color="black", linestyle="--", label=f"ideal ({step}): {ideal:.0f} img/s")
    if max(values + [ideal]) > 20 * max(1e-9, min(values + [ideal])):
        top.set_xscale("log")  # storage and compute rates often differ by orders of magnitude
    top.invert_yaxis()
    top.set_xlabel("images / s")
    top.set_title(title(result), fontsize=9, loc="left")
    top.legend(loc="lower right")

    samples = result["resources"]
    if samples:
        t = [s["t"] for s in samples]
        cpu = [sum(s["cpu_percent_per_core"]) / max(1, len(s["cpu_percent_per_core"])) for s in samples]
        bottom.plot(t, cpu, color="tab:blue", label="CPU, mean of cores (%)")
        bottom.plot(t, [100 * s["process_cores"] / result["cores"] for s in samples], color="tab:purple",
                    label="this process + workers (% of its cores)")
        bottom.set_ylim(0, 105)
        bottom.set_ylabel("CPU %")
        bottom.set_xlabel("seconds")
        disk = bottom.twinx()
        disk.plot(t, [s["disk_read_bytes_per_s"] / 2**20 for s in samples], color="tab:orange",
                  label="disk read (MiB/s)")
        disk.set_ylabel("disk read MiB/s")
        spans: dict[str, list[float]] = {}
        for s in samples:
            spans.setdefault(s["phase"], [s["t"], s["t"]])[1] = s["t"]
        for i, (phase, (a, b)) in enumerate(spans.items()):
            bottom.axvspan(a, b, color=f"C{i % 10}", alpha=0.08)
            bottom.text((a + b) / 2, 102 - 6 * (i % 2), phase, ha="center", va="top", fontsize=7)  # short phases
        lines = bottom.get_legend_handles_labels()
        more = disk.get_legend_handles_labels()
        bottom.legend(lines[0] + more[0], lines[1] + more[1], loc="lower right", fontsize=8)
    bottom.set_title("resources per phase (psutil)")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

