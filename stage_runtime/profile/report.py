"""What ``stallfree profile`` concludes from its phases: the stalls, the bottleneck, the what-ifs, and the schema.

The stalls are DS-Analyzer's differential ones, measured rather than modelled. With ``t_real`` the step time of
the real run (the Loader reading the dataset from storage, page cache dropped), ``t_cached`` that of the same run
from bytes in memory, and ``t_ideal`` the model step on synthetic tensors on the device::

    fetch difference = t_real - t_cached          prep difference = t_cached - t_ideal      (shares of t_real)

The differences also hold what is not a wait: a step that runs slower beside the loader's threads (a CPU they
share) makes ``t_real`` exceed ``t_ideal`` with no wait at all (a compute-bound run that waited 0% once reported
"fetch stall 50%"). So the differences only *split* the wait the real run measured: the fetch and preparation
stalls are the two differences scaled to sum to that measured share.

The what-ifs start from the real run's stage clock (its read, preparation and step time per batch), not from the
phases run alone (echo predicted from the raw storage rate was 25-75% optimistic), and each states what it
assumes. ``stallfree profile --verify`` runs the top one and holds the prediction against the measurement.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stallfree.stage_runtime.profile.loop import FETCH_STAGES, PREP_STAGES, verdict

__all__ = ["NOT_INPUT_BOUND", "PROFILE_FORMAT", "PROFILE_SCHEMA", "WORTH_IT", "Observed", "Stalls", "check_schema",
           "differential_stalls", "headline", "input_cost", "what_ifs"]

PROFILE_FORMAT = "stallfree-profile/1"
NOT_INPUT_BOUND = 0.05  # TensorFlow's input-pipeline analyzer: under 5% of step time waiting is not input-bound
WORTH_IT = 1.05  # a what-if predicting less than 5% more throughput is within noise: not suggested


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


def input_cost(ideal_step_s: float, run: Mapping[str, Any]) -> dict[str, Any]:
    """What feeding the step cost a run (``LoaderProfile.to_dict()``), against the step alone, and its grade.

    The share of the run's time per batch beyond the ideal step: its wait for input plus the step slowed by the
    loader's work on the same CPU. The wait alone misleads when loaders are compared on a CPU host: torch's
    DataLoader, whose worker processes slow the step, waited less than stallfree's Loader while delivering 517
    img/s against 734, and was called "not input-bound" beside stallfree's "moderately input-bound" (issue 35). The
    grade uses TensorFlow's thresholds, as :func:`.loop.verdict` does for the wait.
    """
    per_batch = run["wall_s"] / run["batches"]
    share = min(1.0, max(0.0, 1.0 - ideal_step_s / per_batch)) if per_batch > 0 else 0.0
    return {"input_cost_share": share, "input_cost_verdict": verdict(share)}


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


def _image_sizes(paths: list[Path], limit: int = 256) -> list[tuple[int, int]]:
    from PIL import Image

    sizes = []
    for path in paths[:limit]:
        try:
            with Image.open(path) as img:
                sizes.append(img.size)
        except (OSError, ValueError):
            continue
    return sizes


@dataclass(frozen=True)
class Observed:
    """What the real run's stage clock measured, per delivered batch (seconds): what the what-ifs start from."""

    step_s: float  # wall time per batch
    compute_s: float  # the training step's own span
    read_s: float  # union of the Loader's read spans
    prep_s: float  # union of its preparation spans (augment, h2d)
    threads: int  # the Loader's num_threads
    capped: tuple[tuple[str, float], ...] = ()  # (read or prepare, its spans' time per batch) above step_s

    @classmethod
    def from_run(cls, run: Mapping[str, Any], threads: int) -> Observed:
        """From a run's ``to_dict()`` (``profile.json``'s ``phases.real_run``).

        A stage that delivered every batch cannot have taken longer per batch than the loop did; where its spans
        say it did (they then hold time a finished batch waited to be handed on, behind a full queue), its time is
        capped at the loop's, and ``capped`` keeps what the spans said.
        """
        per = run["stage_time_per_batch_s"]
        step = run["wall_s"] / run["batches"]
        said = {"read": sum(per.get(s, 0.0) for s in FETCH_STAGES),
                "prepare": sum(per.get(s, 0.0) for s in PREP_STAGES)}
        capped = tuple((name, t) for name, t in said.items() if t > step)
        return cls(step, run["step_s"]["mean"], min(said["read"], step), min(said["prepare"], step), threads, capped)

    def notes(self) -> list[str]:
        """What the what-ifs should be read with: the stage times capped at the loop's pace."""
        return [f"the {name} spans add up to {t * 1e3:.1f} ms per batch, longer than the loop's "
                f"{self.step_s * 1e3:.1f} ms although the stage delivered every batch: they hold time a finished "
                f"batch waited to be handed on (a full queue); the what-ifs take {name} at the loop's pace"
                for name, t in self.capped]

    @property
    def overhead_s(self) -> float:
        """What the pipelined model ``max(step, read, prep)`` leaves unexplained per batch; kept in predictions."""
        return max(0.0, self.step_s - max(self.compute_s, self.read_s, self.prep_s))

    def predict(self, *, read_s: float | None = None, prep_s: float | None = None) -> float:
        """The batch time with the read or preparation time changed: the stages are pipelined, the slowest sets it."""
        read = self.read_s if read_s is None else read_s
        prep = self.prep_s if prep_s is None else prep_s
        return max(self.compute_s, read, prep) + self.overhead_s

    def assumes(self) -> str:
        """The observed figures every prediction starts from, for its text."""
        return (f"from the real run's stage clock, per batch of each stage (parallel workers counted once): step "
                f"{self.compute_s * 1e3:.1f} ms, read {self.read_s * 1e3:.1f} ms, prepare {self.prep_s * 1e3:.1f} ms, "
                f"pipelined (the slowest sets the pace), plus the loop's unexplained {self.overhead_s * 1e3:.1f} ms "
                "per batch")


def _cores(batch_size: int, cores: int, seen: Observed, prep_points: list[tuple[int, float]]) -> dict[str, Any]:
    need = batch_size / seen.compute_s  # images/s the real run's step consumes
    rates = dict(prep_points)
    best_threads, best_rate = max(prep_points, key=lambda p: p[1])
    enough = [t for t, r in sorted(prep_points) if r >= need]
    out: dict[str, Any] = {"have": cores, "step_images_per_s": need, "threads_used": seen.threads,
                           "at_least": None, "predicted_step_s": None,
                           "assumes": "preparation time per batch in proportion to the rate measured from memory at "
                                      "each thread count, and only at the counts measured (the curve is not "
                                      f"extrapolated); {seen.assumes()}"}
    if enough:
        threads = enough[0]
        out["needed_to_remove_prep_stall"] = threads
        out["how"] = (f"measured: {threads} thread(s) prepare {rates[threads]:.0f} img/s from memory, above the "
                      f"step's {need:.0f} img/s")
        if seen.threads in rates and threads != seen.threads:
            out["predicted_step_s"] = seen.predict(prep_s=seen.prep_s * rates[seen.threads] / rates[threads])
        return out
    # Scaling is at most linear; the curve is not extrapolated past its last measured point.
    out["needed_to_remove_prep_stall"] = None
    out["at_least"] = math.ceil(need / (best_rate / best_threads))
    out["how"] = (f"not reached within the measured scaling: the best, {best_threads} thread(s), prepare "
                  f"{best_rate:.0f} img/s against the step's {need:.0f} img/s; beyond {best_threads} thread(s) is "
                  f"not measured, so no count is predicted (linear scaling, which the measured curve does not beat, "
                  f"would need at least {out['at_least']})")
    return out


def _max_side(sizes: list[tuple[int, int]], max_side: int, crop_size: int, seen: Observed) -> dict[str, Any]:
    out: dict[str, Any] = {"max_side": max_side, "crop_size": crop_size}
    if not sizes:
        return {**out, "note": "no image headers readable (shards?): not estimated", "suggested": False}
    scale = [min(1.0, max_side / max(w, h)) for w, h in sizes]
    before = sum(w * h for w, h in sizes) / len(sizes)
    after = sum(w * h * s**2 for (w, h), s in zip(sizes, scale, strict=True)) / len(sizes)
    upsampled = sum(1 for (w, h), s in zip(sizes, scale, strict=True) if min(w, h) * s < crop_size <= min(w, h))
    ratio = after / before
    predicted = seen.predict(read_s=seen.read_s * ratio, prep_s=seen.prep_s * ratio)
    warning = None
    if max_side < crop_size:
        warning = (f"--max-side {max_side} is below the {crop_size}-px crop: every crop would be upsampled; "
                   "not suggested")
    elif upsampled:
        warning = (f"{upsampled / len(sizes):.0%} of the images would have their shorter side below the "
                   f"{crop_size}-px crop after the cap (their crops are upsampled)")
    return {**out, "mean_pixels": before, "mean_pixels_after": after, "pixel_ratio": ratio,
            "upsampled_share": upsampled / len(sizes), "predicted_step_s": predicted,
            "speedup": seen.step_s / predicted, "suggested": max_side >= crop_size and ratio < 1,
            "warning": warning,
            "assumes": f"read and decode + augment time proportional to pixels (an upper bound on the gain: the "
                       f"crop's own output work does not shrink); {seen.assumes()}"}


def _ray(batch_size: int, seen: Observed, prep_points: list[tuple[int, float]]) -> dict[str, Any]:
    """How many Ray workers of C cores (``Loader(workers=RayWorkers(...))``) would keep up with the step.

    C is the largest thread count measured (workers are whole machines' worth of cores, not fractions); each worker
    reads and prepares at the rate measured here from memory at C threads, so the read and preparation leave this
    process and what is left to it is the step and the hand-off of finished batches.
    """
    need = batch_size / seen.compute_s  # images/s the step consumes
    cores, rate = max(prep_points)  # the largest thread count measured, and its rate
    workers = max(1, math.ceil(need / rate))
    # With the workers the read and the preparation run elsewhere, in parallel: the batch rate is theirs, combined.
    predicted = seen.predict(read_s=0.0, prep_s=batch_size / (workers * rate))
    return {"cores_per_worker": cores, "workers_needed": workers, "worker_images_per_s": rate,
            "step_images_per_s": need, "predicted_step_s": predicted, "speedup": seen.step_s / predicted,
            "how": f"Loader(workers=stallfree.RayWorkers(num_workers={workers}, cpus_per_worker={cores}))",
            "assumes": f"each worker prepares {rate:.0f} img/s (measured here from memory at {cores} thread(s)) and "
                       "reads its own data; the hand-off of finished batches to this process is not measured here "
                       "(stallfree bench ray measures it: docs/ray.md), nor the network; " + seen.assumes()}


def _echo(seen: Observed) -> dict[str, Any]:
    slowest = max(seen.read_s, seen.prep_s)
    # input within 5% of the step is noise, not a stall echo would remove
    k = 1 if slowest <= seen.compute_s * WORTH_IT else math.ceil(slowest / seen.compute_s)
    return {"k_to_remove_input_stall": k,
            "predicted_step_s": {str(e): seen.predict(read_s=seen.read_s / e, prep_s=seen.prep_s / e)
                                 for e in sorted({2, 4, k})},
            "mode": "echo_mode='batch' (each prepared batch used k times; fresh data is worth more, Choi et al. "
                    "2019)",
            "changes_training": "the model sees each batch k times in a row: fewer distinct batches per step, so "
                                "accuracy per step can differ; suggested only when nothing that leaves training "
                                "as it is helps",
            "assumes": f"the read and preparation per delivered batch divided by k, the step unchanged; "
                       f"{seen.assumes()}"}


def _top(out: dict[str, Any], seen: Observed) -> dict[str, Any] | None:
    """The what-if to try first: the largest predicted gain over 5% among those that leave training as it is.

    Echo repeats each prepared batch, so it changes what the model sees: it comes first only when neither more
    cores nor ``--max-side`` predicts a gain over 5%, and says so (``changes_training``). Among the others, those
    within 5% of the largest gain go in the order more cores, then ``--max-side``.
    """
    c, m, e = out["cores"], out["max_side"], out["echo"]
    same: list[tuple[str, dict[str, Any], float]] = []  # what leaves each sample's pixels and its use as they are
    if c["predicted_step_s"] is not None and seen.threads < c["needed_to_remove_prep_stall"] <= c["have"]:
        same.append(("cores", {"num_threads": c["needed_to_remove_prep_stall"]}, c["predicted_step_s"]))
    if m.get("suggested"):
        same.append(("max_side", {"max_side": m["max_side"]}, m["predicted_step_s"]))
    k = e["k_to_remove_input_stall"]
    changes = [("echo", {"echo": k, "echo_mode": "batch"}, e["predicted_step_s"][str(k)])] if k > 1 else []
    for candidates, changes_training in ((same, False), (changes, True)):
        gains = [(n, s, t, seen.step_s / t) for n, s, t in candidates if seen.step_s / t >= WORTH_IT]
        if gains:
            best = max(x[3] for x in gains)
            name, setting, step, speedup = next(x for x in gains if x[3] >= best / WORTH_IT)
            return {"what_if": name, "setting": setting, "predicted_step_s": step, "speedup": speedup,
                    "changes_training": changes_training}
    return None


def what_ifs(*, batch_size: int, cores: int, observed: Observed, prep_points: list[tuple[int, float]],
             dataset_bytes: int, available_bytes: int, total_bytes: int, paths: list[Path], max_side: int,
             crop_size: int) -> dict[str, Any]:
    """Answers with figures: cores, the page cache, ``--max-side``, ``echo=k``, and the one to try first.

    ``top`` is ``None`` when no what-if predicts a gain over 5%.

    Args:
        batch_size: samples per batch.
        cores: cores this process may use.
        observed: the real run's per-batch times (:meth:`Observed.from_run`).
        prep_points: ``(threads, images/s)`` of decode + augment from memory: the measured scaling.
        dataset_bytes: the dataset's size on disk.
        available_bytes: memory the page cache may use (``psutil.virtual_memory().available``).
        total_bytes: the machine's memory.
        paths: the dataset's files (their headers give the image sizes for ``--max-side``).
        max_side: the longer side ``--max-side`` ingest would cap images at.
        crop_size: the output side of the crop; a ``max_side`` below it is never suggested.
    """
    if observed.compute_s <= 0:
        raise ValueError(f"the real run's step time must be positive, got {observed.compute_s}")
    if not prep_points:
        raise ValueError("prep_points is empty: the preparation phase measured no thread count")
    fits = dataset_bytes <= available_bytes
    out: dict[str, Any] = {
        "cores": _cores(batch_size, cores, observed, prep_points),
        "page_cache": {"dataset_bytes": dataset_bytes, "available_bytes": available_bytes,
                       "total_bytes": total_bytes, "fits": fits,
                       "more_memory_needed_bytes": 0 if fits else int((dataset_bytes - available_bytes) * 1.1),
                       "assumes": "the kernel keeps what fits in available memory cached after the first epoch; "
                                  "no other process competes for it"},
        "max_side": _max_side(_image_sizes(paths), max_side, crop_size, observed),
        "echo": _echo(observed),
        "ray": _ray(batch_size, observed, prep_points),
        "observed": {"step_s": observed.step_s, "compute_s": observed.compute_s, "read_s": observed.read_s,
                     "prep_s": observed.prep_s, "overhead_s": observed.overhead_s, "threads": observed.threads,
                     "notes": observed.notes()},
    }
    out["top"] = _top(out, observed)
    return out


# A JSON Schema (draft 2020-12 subset) of profile.json; check_schema validates against it without a dependency.
_NUM = {"type": "number"}
_RUN = {"type": "object", "required": ["batches", "samples", "wall_s", "samples_per_s", "wait_s", "step_s",
                                       "stall_share", "fetch_stall_share", "prep_stall_share", "verdict",
                                       "bottleneck", "stage_time_per_batch_s", "stage_utilization",
                                       "cpu_cores_used"],
        "properties": {"batches": {"type": "integer"}, "stall_share": _NUM, "verdict": {"type": "string"},
                       "wait_s": {"type": "object", "required": ["total", "mean", "p50", "p90", "p99", "max"]}}}
# runs 4, 5 and 6 also carry their input cost (input_cost)
_COSTED = {**_RUN, "required": [*_RUN["required"], "input_cost_share", "input_cost_verdict"]}
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
                       "real_run": _COSTED, "cached_run": _COSTED}},
        "stalls": {"type": "object", "required": ["ideal_step_s", "cached_step_s", "real_step_s",
                                                  "fetch_stall_share", "prep_stall_share",
                                                  "measured_stall_share", "fetch_diff_share", "prep_diff_share",
                                                  "verdict", "bottleneck", "notes"]},
        "what_if": {"type": "object", "required": ["cores", "page_cache", "max_side", "echo", "observed", "top"]},
        "resources": {"type": "array", "items": {"type": "object", "required": [
            "t", "phase", "cpu_percent_per_core", "process_cores", "rss_bytes", "disk_read_bytes_per_s"]}},
        "compare": {"type": "object", "properties": {"torch": _COSTED}},
        "step_slowdown": {"type": "number"},
        "accelerator": {"type": "object"},  # with --accelerator only
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
