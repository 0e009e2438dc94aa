"""``stallfree profile --verify``: run a what-if for real and hold its prediction against what it measured.

A prediction that is never checked drifts optimistic (the what-ifs once were by 25-75%). ``--verify`` applies
one suggested setting as a second real run (page cache dropped first, like the first real run) and reports the
predicted and the measured throughput side by side.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stallfree.ingest.validate import check_image, convert
from stallfree.pipeline.reader_base import sample_of

__all__ = ["chosen", "resized_copy", "verdict_of"]


def chosen(what_if: Mapping[str, Any], which: str) -> tuple[str, dict[str, Any], float] | str:
    """The what-if ``which`` (``top``, ``echo``, ``max-side``, ``cores``) as ``(name, setting, predicted step s)``.

    Returns why not instead, as a string, when there is nothing to run. ``echo`` asked for by name uses at least
    ``k=2``, so that there is something to run.
    """
    if which == "top":
        top = what_if["top"]
        if top is None:
            return "no what-if predicts a gain over 5%: nothing to verify"
        return top["what_if"], dict(top["setting"]), float(top["predicted_step_s"])
    if which == "echo":
        echo = what_if["echo"]
        k = max(2, echo["k_to_remove_input_stall"])
        return "echo", {"echo": k, "echo_mode": "batch"}, float(echo["predicted_step_s"][str(k)])
    if which == "max-side":
        m = what_if["max_side"]
        if "predicted_step_s" not in m:
            return f"cannot verify --max-side: {m['note']}"
        return "max_side", {"max_side": m["max_side"]}, float(m["predicted_step_s"])
    if which == "cores":
        c = what_if["cores"]
        if c["predicted_step_s"] is None:
            return f"cannot verify more cores: {c['how']}"
        return "cores", {"num_threads": c["needed_to_remove_prep_stall"]}, float(c["predicted_step_s"])
    raise ValueError(f"--verify must be top, echo, max-side or cores, got {which!r}")


def resized_copy(reader: Any, rows: int, max_side: int, folder: Path) -> Path:
    """The first ``rows`` samples of ``reader`` re-encoded as ``stallfree ingest --max-side`` would store them.

    Written as an ImageFolder tree under ``folder`` (one sub-folder per label, zero-padded so that their sorted
    order keeps the labels), for the Loader to read from storage as the first real run did.
    """
    labels = reader.labels()
    for i in range(min(rows, len(reader))):
        data = bytes(sample_of(reader.read(i))["image"])
        encoded, _, _ = convert(data, check_image(data), max_side=max_side)
        suffix = ".jpg" if encoded[:2] == b"\xff\xd8" else ".png"  # convert keeps JPEG and PNG, else writes one
        target = folder / f"{int(labels[i]):05d}" / f"{i:07d}{suffix}"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(encoded)
    return folder


def verdict_of(name: str, setting: Mapping[str, Any], predicted_step_s: float, baseline: Mapping[str, Any],
               run: Mapping[str, Any], batch_size: int) -> dict[str, Any]:
    """``profile.json``'s ``verify``: the setting, predicted and measured step and throughput, and the error."""
    measured = run["wall_s"] / run["batches"]
    return {"what_if": name, "setting": dict(setting), "predicted_step_s": predicted_step_s,
            "measured_step_s": measured, "predicted_images_per_s": batch_size / predicted_step_s,
            "measured_images_per_s": run["samples_per_s"], "baseline_images_per_s": baseline["samples_per_s"],
            "error": measured / predicted_step_s - 1, "run": dict(run)}
