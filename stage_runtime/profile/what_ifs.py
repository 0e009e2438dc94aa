"""What would remove a stall, with figures: more cores, the page cache, ``--max-side``, echoing, Ray workers.

The what-ifs start from the real run's stage clock (its read, preparation and step time per batch,
:class:`Observed`), not from the phases run alone (echo predicted from the raw storage rate was 25-75% optimistic),
and each states what it assumes. ``stallfree profile --verify`` runs the top one and holds the prediction against
the measurement (:mod:`.verify`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stallfree.stage_runtime.profile.loop import FETCH_STAGES, PREP_STAGES

__all__ = ["WORTH_IT", "Observed", "what_ifs"]

WORTH_IT = 1.05  # a what-if predicting less than 5% more throughput is within noise: not suggested


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
