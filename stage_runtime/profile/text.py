"""The human report of a profile: one row per phase, the headline, each what-if with what it assumes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stallfree.stage_runtime.profile.report import headline

__all__ = ["report", "slowdown_line", "verify_line"]


def _rows(r: Mapping[str, Any]) -> list[tuple[str, float, str]]:
    p = r["phases"]
    storage = p["storage"]
    cold_note = "" if storage["cold_note"] is None else f" ({storage['cold_note']})"
    rows = [("1 storage, cold", storage["cold_images_per_s"], f"{storage['cold_bytes_per_s'] / 2**20:.0f} MiB/s"
             + cold_note),
            ("1 storage, warm", storage["warm_images_per_s"], f"{storage['warm_bytes_per_s'] / 2**20:.0f} MiB/s")]
    rows += [(f"2 prepare, {q['threads']} thread(s)", q["images_per_s"], "decode + augment from memory")
             for q in p["preparation"]["points"]]
    if r.get("accelerator"):
        rows.append(("3 compute (simulated)", p["compute"]["images_per_s"],
                     f"a device training {r['accelerator']['images_per_s']:g} img/s ({r['accelerator']['name']}); "
                     "waits, holds no CPU"))
    else:
        rows.append(("3 compute (ideal)", p["compute"]["images_per_s"],
                     f"{r['model']} on {r['device']}, synthetic, {r['torch_threads']} torch thread(s)"))
    real = p["real_run"]
    real_note = "" if real["cold_note"] is None else f"; {real['cold_note']}"
    rows.append(("4 real run", real["samples_per_s"], _cost(real) + real_note))
    rows.append(("5 real run, from memory", p["cached_run"]["samples_per_s"], _cost(p["cached_run"])))
    for name, run in r.get("compare", {}).items():
        rows.append((f"6 {name} DataLoader", run["samples_per_s"], f"{_cost(run)}; {run['transform']}"))
    return rows


def _cost(run: Mapping[str, Any]) -> str:
    """A run's note: its wait, and its input cost against the step alone (one yardstick for every loader)."""
    return (f"waited {run['stall_share']:.0%}; input cost {run['input_cost_share']:.0%} of its time per batch "
            f"({run['input_cost_verdict']})")


def _what_ifs(w: Mapping[str, Any]) -> list[str]:
    c, pc, m, e = w["cores"], w["page_cache"], w["max_side"], w["echo"]
    lines = [f"note: {n}" for n in w["observed"].get("notes", [])]
    if c["needed_to_remove_prep_stall"] is not None:
        lines.append(f"what if: {c['needed_to_remove_prep_stall']} preparation thread(s) keep up with the step "
                     f"(this process has {c['have']} core(s); {c['how']}).")
    else:
        lines.append(f"what if: more cores: {c['how']}.")
    if pc["fits"]:
        lines.append(f"what if: the dataset ({pc['dataset_bytes'] / 2**30:.2f} GiB) fits the page cache "
                     f"({pc['available_bytes'] / 2**30:.1f} GiB available): epochs after the first read warm "
                     f"(assumes {pc['assumes']}).")
    else:
        lines.append(f"what if: the dataset ({pc['dataset_bytes'] / 2**30:.2f} GiB) does not fit the page cache; "
                     f"{pc['more_memory_needed_bytes'] / 2**30:.1f} GiB more memory would make it "
                     f"(assumes {pc['assumes']}).")
    if "speedup" in m:
        line = (f"what if: ingest --max-side {m['max_side']} keeps {m['pixel_ratio']:.0%} of the pixels: "
                f"predicted {m['speedup']:.2f}x the step rate (assumes {m['assumes']}).")
        if m["warning"]:
            line += f" Warning: {m['warning']}."
        lines.append(line)
    else:
        lines.append(f"what if: ingest --max-side: {m['note']}.")
    r = w.get("ray")
    if r is not None:
        lines.append(f"what if: with {r['workers_needed']} Ray worker(s) of {r['cores_per_worker']} core(s) "
                     f"({r['how']}): predicted {r['speedup']:.2f}x the step rate (assumes {r['assumes']}).")
    if e["k_to_remove_input_stall"] == 1:
        lines.append("what if: echo=k would not help: the input stages already outpace the step.")
    else:
        steps = ", ".join(f"k={k}: {1e3 * t:.1f} ms" for k, t in e["predicted_step_s"].items())
        lines.append(f"what if: echo=k, {e['mode']}: predicted step {steps}; k={e['k_to_remove_input_stall']} "
                     f"removes the input stall (assumes {e['assumes']}). It changes training: "
                     f"{e['changes_training']}.")
    top = w["top"]
    if top is None:
        lines.append("try first: nothing; no what-if predicts a gain over 5%.")
    else:
        setting = ", ".join(f"{k}={v!r}" for k, v in top["setting"].items())
        changes = (" It changes what the model sees (each batch used several times): nothing that leaves training "
                   "as it is predicts a gain over 5%." if top.get("changes_training") else "")
        lines.append(f"try first: {top['what_if']} ({setting}): predicted {top['speedup']:.2f}x "
                     f"(check it: stallfree profile --verify).{changes}")
    return lines


def verify_line(v: Mapping[str, Any]) -> str:
    """``--verify``'s one line: the setting, predicted and measured throughput, and how far apart they are."""
    if v["what_if"] is None:
        return f"verify: {v['note']}"
    setting = ", ".join(f"{k}={val!r}" for k, val in v["setting"].items())
    line = (f"verify {v['what_if']} ({setting}): predicted {v['predicted_images_per_s']:.0f} img/s, measured "
            f"{v['measured_images_per_s']:.0f} img/s ({v['error']:+.0%} step time against the prediction); "
            f"before {v['baseline_images_per_s']:.0f} img/s")
    if v.get("cold_note"):
        line += f"; {v['cold_note']}"
    return line


def slowdown_line(slowdown: float) -> str:
    """What the input pipeline cost the step itself: ``step_slowdown`` (the real run's mean step / the step alone - 1).

    A real run's step cannot be faster than the same step with nothing beside it; a negative figure is the two runs'
    noise (other load on the machine, too few batches), said so rather than printed as a slowdown of -23%.
    """
    if slowdown < 0:
        return (f"the input pipeline did not measurably slow the step (its mean in the real run was {-slowdown:.1%} "
                "shorter than the step alone: noise, such as other load on the machine; more --batches narrow it)")
    return f"the input pipeline slowed the step by {slowdown:.1%} (its mean in the real run against the step alone)"


def report(r: Mapping[str, Any]) -> str:
    """``profile.json``'s content (``r``) as the table and lines ``stallfree profile`` prints."""
    batch, s = r["batch_size"], r["stalls"]
    lines = [f"| {'phase':<26} | {'img/s':>8} | {'ms/batch':>8} | note", f"|{'-' * 28}|{'-' * 9}:|{'-' * 9}:|------"]
    lines += [f"| {name:<26} | {rate:>8.0f} | {1e3 * batch / rate if rate else 0:>8.1f} | {note}"
              for name, rate, note in _rows(r)]
    lines.append("input cost: a run's time per batch beyond the step alone (3), as a share of it: its wait for input "
                 "plus the step slowed by the loader's work on the same CPU; graded as the wait is (<5% not, 5-20% "
                 "moderately, >20% highly input-bound)")
    lines.append("")
    lines.append(f"{headline(s)}. Step time {s['real_step_s'] * 1e3:.1f} ms (ideal {s['ideal_step_s'] * 1e3:.1f} "
                 f"ms, from memory {s['cached_step_s'] * 1e3:.1f} ms).")
    if r.get("step_slowdown") is not None:
        lines.append(slowdown_line(r["step_slowdown"]))
    a = r.get("accelerator")
    if a:
        lines.append(f"with a device of {a['images_per_s']:g} img/s, this loader stalls {a['measured_stall']:.1%} "
                     f"(measured in run 4; predicted {a['predicted_stall']:.1%} from its stand-alone rate of "
                     f"{a['loader_images_per_s']:.0f} img/s)")
    lines += [f"note: {n}" for n in s["notes"]]
    lines += _what_ifs(r["what_if"])
    if "verify" in r:
        lines.append(verify_line(r["verify"]))
    return "\n".join(lines)
