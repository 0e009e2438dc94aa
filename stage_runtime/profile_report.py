"""What ``stallfree profile`` concludes from its phases: the stalls, the bottleneck, the what-ifs, and the schema.

The stalls are DS-Analyzer's differential ones, measured rather than modelled. With ``t_real`` the step time of
the real run (the Loader reading the dataset from storage, page cache dropped), ``t_cached`` that of the same run
from bytes in memory, and ``t_ideal`` the model step on synthetic tensors on the device::

    fetch difference = t_real - t_cached          prep difference = t_cached - t_ideal      (shares of t_real)

The differences also hold what is not a wait: a step that runs slower beside the loader's threads (a CPU they
share) makes ``t_real`` exceed ``t_ideal`` with no wait at all (a compute-bound run that waited 0% once reported
"fetch stall 50%"). So the differences only *split* the wait the real run measured: the fetch and preparation
stalls are the two differences scaled to sum to that measured share.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["NOT_INPUT_BOUND", "PROFILE_FORMAT", "PROFILE_SCHEMA", "Stalls", "check_schema", "differential_stalls",
           "headline", "what_ifs"]

PROFILE_FORMAT = "stallfree-profile/1"
NOT_INPUT_BOUND = 0.05  # TensorFlow's input-pipeline analyzer: under 5% of step time waiting is not input-bound


@dataclass(frozen=True)
class Stalls:
    """Per-batch step times (seconds) of the three runs and the stalls they imply."""

    ideal_step_s: float
    cached_step_s: float
    real_step_s: float
    fetch_stall_share: float  # of the measured wait, split by the differences; the two sum to measured_stall_share
    prep_stall_share: float
    measured_stall_share: float  # the real run's own wait / (wait + step)
    fetch_diff_share: float  # (t_real - t_cached) / t_real, before scaling to the measured wait
    prep_diff_share: float  # (t_cached - t_ideal) / t_real, likewise
    verdict: str
    bottleneck: str
    notes: list[str]


def _split(fetch_diff: float, prep_diff: float, measured: float,
           fallback_shares: tuple[float, float]) -> tuple[float, float]:
    if fetch_diff + prep_diff > 0:
        scale = measured / (fetch_diff + prep_diff)
        return fetch_diff * scale, prep_diff * scale
    total = sum(fallback_shares)
    if total > 0:  # the runs showed no difference: the real run's span-based split, scaled likewise
        return fallback_shares[0] * measured / total, fallback_shares[1] * measured / total
    return 0.0, 0.0


def differential_stalls(ideal_step_s: float, cached_step_s: float, real_step_s: float,
                        measured_stall_share: float, verdict: str, fallback: str = "input",
                        fallback_shares: tuple[float, float] = (0.0, 0.0)) -> Stalls:
    """The fetch and preparation stalls as shares of the real step time, and the bottleneck they name.

    The differences between the runs split the measured wait; they never add a stall the real run did not wait
    for, so the two stalls sum to ``measured_stall_share``. The bottleneck is ``compute`` when the real run waited
    under 5% of its step time; otherwise the larger stall, or ``fallback`` (the real run's own span-based
    attribution, whose fetch and preparation shares are ``fallback_shares``) when the differences show none.
    """
    if min(ideal_step_s, cached_step_s, real_step_s) <= 0:
        raise ValueError(f"step times must be positive, got ideal {ideal_step_s}, cached {cached_step_s}, "
                         f"real {real_step_s}")
    if not 0 <= measured_stall_share <= 1:
        raise ValueError(f"measured_stall_share must be in [0, 1], got {measured_stall_share}")
    fetch_diff = max(0.0, real_step_s - cached_step_s) / real_step_s
    prep_diff = min(1.0 - fetch_diff, max(0.0, cached_step_s - ideal_step_s) / real_step_s)
    fetch, prep = _split(fetch_diff, prep_diff, measured_stall_share, fallback_shares)
    if measured_stall_share < NOT_INPUT_BOUND:
        bottleneck = "compute"  # the loop hardly waits: input is not what limits it, whatever the differences say
    elif fetch + prep == 0:
        bottleneck = fallback
    else:
        bottleneck = "fetch" if fetch >= prep else "preparation"
    notes = []
    if cached_step_s < 0.9 * ideal_step_s or real_step_s < 0.9 * cached_step_s:
        notes.append(f"noisy: a run with more work was faster (ideal {ideal_step_s * 1e3:.1f} ms, from memory "
                     f"{cached_step_s * 1e3:.1f} ms, real {real_step_s * 1e3:.1f} ms per batch); other load on "
                     "the machine? rerun with more --batches")
    if fetch_diff + prep_diff > measured_stall_share + NOT_INPUT_BOUND:
        notes.append(f"the runs differ by {fetch_diff + prep_diff:.0%} of the step time but the loop waited "
                     f"{measured_stall_share:.0%}: the rest is the step itself running slower beside the loader "
                     "(a shared CPU?); the stalls split the measured wait only")
    return Stalls(ideal_step_s, cached_step_s, real_step_s, fetch, prep, measured_stall_share, fetch_diff,
                  prep_diff, verdict, bottleneck, notes)


def headline(stalls: Mapping[str, Any]) -> str:
    """One line naming the bottleneck (``profile.json``'s ``stalls``); it names a stall only when the run waited."""
    measured = stalls["measured_stall_share"]
    if measured < NOT_INPUT_BOUND:
        return f"bottleneck: compute (not input-bound: the loop waited {measured:.1%} of step time)"
    split = ""
    if stalls["fetch_stall_share"] + stalls["prep_stall_share"] > 0:
        split = (f": fetch stall {stalls['fetch_stall_share']:.0%}, preparation stall "
                 f"{stalls['prep_stall_share']:.0%}")
    return (f"bottleneck: {stalls['bottleneck']} ({stalls['verdict']}: the loop waited {measured:.0%} of step "
            f"time{split})")


def _image_pixels(paths: list[Path], limit: int = 256) -> list[tuple[int, int]]:
    from PIL import Image

    sizes = []
    for path in paths[:limit]:
        try:
            with Image.open(path) as img:
                sizes.append(img.size)
        except (OSError, ValueError):
            continue
    return sizes


def what_ifs(*, batch_size: int, cores: int, ideal_step_s: float, prep_points: list[tuple[int, float]],
             fetch_step_s: float, dataset_bytes: int, available_bytes: int, total_bytes: int,
             paths: list[Path], max_side: int) -> dict[str, Any]:
    """Answers with figures: cores for the preparation stall, the page cache, ``--max-side``, ``echo=k``.

    Args:
        batch_size: samples per batch.
        cores: cores this process may use.
        ideal_step_s: the model step on synthetic tensors.
        prep_points: ``(threads, images/s)`` of decode + augment from memory.
        fetch_step_s: one batch's read time at the cold storage rate.
        dataset_bytes: the dataset's size on disk.
        available_bytes: memory the page cache may use (``psutil.virtual_memory().available``).
        total_bytes: the machine's memory.
        paths: the dataset's files (their headers give the image sizes for ``--max-side``).
        max_side: the longer side ``--max-side`` ingest would cap images at.
    """
    need = batch_size / ideal_step_s  # images/s that keep the step fed
    best_threads, best_rate = max(prep_points, key=lambda p: p[1])
    enough = [t for t, r in sorted(prep_points) if r >= need]
    if enough:
        threads_needed = enough[0]
        rate = dict(prep_points)[threads_needed]
        how = f"measured: {threads_needed} thread(s) prepare {rate:.0f} img/s, above the step's {need:.0f} img/s"
    else:
        per_core = best_rate / best_threads
        threads_needed = math.ceil(need / per_core)
        how = (f"extrapolated linearly from {best_rate:.0f} img/s at {best_threads} thread(s) "
               f"({per_core:.0f} img/s per core) to the step's {need:.0f} img/s")
    prep_step_s = batch_size / best_rate
    input_step_s = max(prep_step_s, fetch_step_s)
    fits = dataset_bytes <= available_bytes
    out: dict[str, Any] = {
        "cores": {"needed_to_remove_prep_stall": threads_needed, "have": cores, "step_images_per_s": need,
                  "how": how},
        "page_cache": {"dataset_bytes": dataset_bytes, "available_bytes": available_bytes,
                       "total_bytes": total_bytes, "fits": fits,
                       "more_memory_needed_bytes": 0 if fits else int((dataset_bytes - available_bytes) * 1.1)},
    }
    sizes = _image_pixels(paths)
    if sizes:
        before = sum(w * h for w, h in sizes) / len(sizes)
        after = sum(w * h * min(1.0, max_side / max(w, h)) ** 2 for w, h in sizes) / len(sizes)
        ratio = after / before
        # Decode cost and JPEG size both scale about with the pixel count.
        new_step = max(ideal_step_s, prep_step_s * ratio, fetch_step_s * ratio)
        out["max_side"] = {"max_side": max_side, "mean_pixels": before, "mean_pixels_after": after,
                           "pixel_ratio": ratio, "predicted_step_s": new_step,
                           "speedup": max(ideal_step_s, input_step_s) / new_step,
                           "assumes": "decode time and file size proportional to pixels"}
    else:
        out["max_side"] = {"max_side": max_side, "note": "no image headers readable (shards?): not estimated"}
    k = max(1, math.ceil(input_step_s / ideal_step_s))
    out["echo"] = {"k_to_remove_input_stall": k,
                   "predicted_step_s": {str(e): max(ideal_step_s, input_step_s / e) for e in sorted({2, 4, k})},
                   "mode": "echo_mode='batch' (each prepared batch used k times; fresh data is worth more, Choi "
                           "et al. 2019)"}
    return out


# A JSON Schema (draft 2020-12 subset) of profile.json; check_schema validates against it without a dependency.
_NUM = {"type": "number"}
_RUN = {"type": "object", "required": ["batches", "samples", "wall_s", "samples_per_s", "wait_s", "step_s",
                                       "stall_share", "fetch_stall_share", "prep_stall_share", "verdict",
                                       "bottleneck", "stage_time_per_batch_s", "stage_utilization",
                                       "cpu_cores_used"],
        "properties": {"batches": {"type": "integer"}, "stall_share": _NUM, "verdict": {"type": "string"},
                       "wait_s": {"type": "object", "required": ["total", "mean", "p50", "p90", "p99", "max"]}}}
PROFILE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["format", "data", "model", "device", "batch_size", "image_size", "cores", "phases", "stalls",
                 "what_if", "resources"],
    "properties": {
        "format": {"type": "string", "const": PROFILE_FORMAT},
        "batch_size": {"type": "integer"}, "image_size": {"type": "integer"}, "cores": {"type": "integer"},
        "phases": {"type": "object", "required": ["storage", "preparation", "compute", "real_run", "cached_run"],
                   "properties": {
                       "storage": {"type": "object", "required": ["files", "bytes", "cold_bytes_per_s",
                                                                  "warm_bytes_per_s", "cold_note",
                                                                  "cache_dropped"]},
                       "preparation": {"type": "object", "required": ["points", "in_memory_images"],
                                       "properties": {"points": {"type": "array", "items": {
                                           "type": "object", "required": ["threads", "images_per_s"]}}}},
                       "compute": {"type": "object", "required": ["step_s", "images_per_s"]},
                       "real_run": _RUN, "cached_run": _RUN}},
        "stalls": {"type": "object", "required": ["ideal_step_s", "cached_step_s", "real_step_s",
                                                  "fetch_stall_share", "prep_stall_share",
                                                  "measured_stall_share", "fetch_diff_share", "prep_diff_share",
                                                  "verdict", "bottleneck", "notes"]},
        "what_if": {"type": "object", "required": ["cores", "page_cache", "max_side", "echo"]},
        "resources": {"type": "array", "items": {"type": "object", "required": [
            "t", "phase", "cpu_percent_per_core", "process_cores", "rss_bytes", "disk_read_bytes_per_s"]}},
        "compare": {"type": "object"},
    },
}
_TYPES: dict[str, type | tuple[type, ...]] = {"object": dict, "array": list, "string": str, "integer": int,
                                              "number": (int, float), "boolean": bool}


def check_schema(value: Any, schema: dict[str, Any] = PROFILE_SCHEMA, where: str = "profile.json") -> None:
    """Raise ``ValueError`` naming the first place ``value`` breaks ``schema`` (type, required, const, items)."""
    kind = schema.get("type")
    if kind is not None and (not isinstance(value, _TYPES[kind]) or (kind in ("integer", "number")
                                                                       and isinstance(value, bool))):
        raise ValueError(f"{where}: expected {kind}, got {type(value).__name__} {value!r:.60}")
    if "const" in schema and value != schema["const"]:
        raise ValueError(f"{where}: expected {schema['const']!r}, got {value!r}")
    if isinstance(value, dict):
        missing = [k for k in schema.get("required", []) if k not in value]
        if missing:
            raise ValueError(f"{where}: missing {missing}")
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                check_schema(value[key], sub, f"{where}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            check_schema(item, schema["items"], f"{where}[{i}]")
