"""What ``stallfree profile`` concludes from its phases: the stalls and the bottleneck.

The stalls are DS-Analyzer's differential ones, measured rather than modelled. With ``t_real`` the step time of
the real run (the Loader reading the dataset from storage, page cache dropped), ``t_cached`` that of the same run
from bytes in memory, and ``t_ideal`` the model step on synthetic tensors on the device::

    fetch difference = t_real - t_cached          prep difference = t_cached - t_ideal      (shares of t_real)

The differences also hold what is not a wait: a step that runs slower beside the loader's threads (a CPU they
share) makes ``t_real`` exceed ``t_ideal`` with no wait at all (a compute-bound run that waited 0% once reported
"fetch stall 50%"). So the differences only *split* the wait the real run measured: the fetch and preparation
stalls are the two differences scaled to sum to that measured share.

What would remove a stall: :mod:`.what_ifs`; the layout of ``profile.json``: :mod:`.schema`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stallfree.stage_runtime.profile.loop import verdict

__all__ = ["NOT_INPUT_BOUND", "Stalls", "differential_stalls", "headline", "input_cost"]

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
    # Each part's fraction of its whole first, then of the wait: a whole as small as a subnormal (5e-324) times the
    # wait rounds back to itself, and a split of 0.75 came out as 1.0 (hypothesis, tests/stage_runtime/profile).
    if fetch_diff + prep_diff > 0:
        total = fetch_diff + prep_diff
        return measured * (fetch_diff / total), measured * (prep_diff / total)
    total = sum(fallback_shares)
    if total > 0:  # the runs showed no difference: the real run's span-based split, scaled likewise
        return measured * (fallback_shares[0] / total), measured * (fallback_shares[1] / total)
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
