"""``stallfree train`` on a token source balanced by compute (issue 48, item 3), on the simulated accelerator.

The device charges each micro-batch its tokens' cost (``l + l^2 / A`` per document, the linear part per padding slot),
so what balancing changes is measurable on CPU: the books gain "data-parallel imbalance" (replica 0 waiting for the
slowest replica at the gradient all-reduce, and its own compute beyond the replicas' mean) and "padding", and still
add up to the loss with no negative part. The jobs share one pair of spawned processes (``train_many``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stallfree.cli import main
from stallfree.stage_runtime.config.train_config import TrainConfig
from stallfree.stage_runtime.jobs import train_many
from stallfree.stage_runtime.plan.books import ALL_PARTS, PARTS
from stallfree.stage_runtime.train.report import format_summary

pytestmark = pytest.mark.slow  # the module's fixture trains four jobs in spawned processes (about 30 s on 2 cores)

S, SPAN = 64, 16  # attention over a whole row costs 4x its linear part: a row of one long document, 5x a row's tokens
# The simulated device's rate (tokens of work a second). Slow enough that the device's waits, which hold no CPU, are
# most of a step: a replica descheduled on a loaded machine (CI runs 3 test processes on 2 cores) then adds little
# to the measured imbalance beside what the packs' costs make (at 8,000 a second it added 10 points under load 7).
RATE = 2000
JOB = {"model": "gpt_tiny", "seq_len": S, "attention_span": SPAN, "batch_size": 4, "microbatches": 2, "epochs": 1,
       "accelerator": f"sim:{RATE}", "progress": False, "timeout_s": 120}


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A chat mix with a tail of long documents: 600 of 2-11 tokens, 24 of 48-64 (a row each), ingested as shards."""
    from stallfree.ingest.token_runner import ingest_tokens
    from stallfree.ingest.token_writer import TokenOptions

    out = tmp_path_factory.mktemp("skewed")
    rng = np.random.default_rng(7)
    lengths = np.concatenate([rng.integers(2, 12, 600), rng.integers(48, 65, 24)])
    rows = [json.dumps({"input_ids": [k % 40 for k in range(n)]}) for n in lengths[rng.permutation(len(lengths))]]
    (out / "ids.jsonl").write_text("\n".join(rows) + "\n")
    ingest_tokens(out / "ids.jsonl", out / "tokens", TokenOptions(vocab_size=40))
    return out / "tokens"


@pytest.fixture(scope="module")
def runs(tokens: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("balanced")
    dp2 = {"dp": 2, "stages": 1}
    jobs: dict[str, dict[str, Any]] = {"none": dp2, "tokens": {**dp2, "balance_batches": "tokens"},
                                       "compute": {**dp2, "balance_batches": "compute"},
                                       # two stages, the micro-batches balanced: the pipeline's parts too
                                       "stages": {"stages": 2, "balance_batches": "compute"}}
    configs = {name: TrainConfig.from_flags(**{**JOB, "data": str(tokens), "out_dir": str(out / name), **kw})
               for name, kw in jobs.items()}
    return dict(zip(configs, train_many(list(configs.values())), strict=True))


def _dp(summary: dict[str, Any]) -> float:
    return float(summary["books"]["job"]["parts"]["dp_imbalance"])


@pytest.mark.parametrize("name", ["none", "tokens", "compute", "stages"])
def test_the_books_add_up_with_the_new_parts_and_none_negative(runs: dict[str, dict[str, Any]], name: str) -> None:
    books = runs[name]["books"]
    want = set(ALL_PARTS) if name != "stages" else {*PARTS, "padding"}  # one replica: no data-parallel imbalance
    for rank in books["ranks"]:
        assert set(rank["parts"]) == want
        assert all(v >= 0 for v in rank["parts"].values()), rank
        assert sum(rank["parts"].values()) == pytest.approx(rank["loss"], abs=1e-9)
    # A token job's books count real tokens: what it did is the summary's real tokens a second
    assert books["tokens_per_s"] == pytest.approx(runs[name]["real_tokens_per_s"], rel=1e-6)
    shown = format_summary(runs[name]).splitlines()[0]
    assert ("data-parallel imbalance " in shown) == (name != "stages") and "padding " in shown, shown
    assert not re.search(r"-\d", shown), shown


def test_the_data_parallel_imbalance_shrinks_when_the_packs_are_balanced_by_compute(
        runs: dict[str, dict[str, Any]]) -> None:
    # Evening the tokens leaves a replica with the long documents' attention: the other waits at the all-reduce.
    # Measured on 2 cores at sim:8000 (docs/records/train-balance.md, 2026-12-06, medians of 3): none 0.9%, tokens
    # 16.5%, compute 0.9% of the step (this module runs at sim:2000). Plain packing is near
    # balance on its own: best-fit decreasing deals the rows of a window largest first, alike to both replicas.
    assert _dp(runs["tokens"]) > 0.08
    assert _dp(runs["compute"]) < _dp(runs["tokens"]) / 4
    assert _dp(runs["compute"]) <= _dp(runs["none"]) + 0.02


def test_the_padding_part_is_the_devices_time_on_slots_without_a_token(runs: dict[str, dict[str, Any]]) -> None:
    # The device charges a padding slot the linear part alone; the books' padding share of the slowest rank's
    # compute follows the padded share of the positions (the long rows' attention makes a slot of a real token
    # dearer, so the part is below the padded share).
    for name in ("none", "compute", "stages"):
        summary = runs[name]
        job = summary["books"]["job"]
        compute = 1 - job["loss"] + job["parts"]["padding"]  # the rank's compute, padding included, over the step
        assert 0 < job["parts"]["padding"] / compute < summary["padding_fraction"]
    assert runs["compute"]["books"]["job"]["parts"]["padding"] > runs["none"]["books"]["job"]["parts"]["padding"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--balance-batches", "even"], r"^--balance-batches must be one of none, tokens, compute, got 'even'$"),
    (["--attention-span", "0"], r"^--attention-span must be >= 1, got 0$"),
])
def test_the_new_flags_bad_values_are_refused_in_one_line(argv: list[str], message: str, tokens: Path,
                                                          tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", str(tokens), "--model", "gpt_tiny", "--accelerator", "sim:100", *argv, "--no-progress",
                 "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("stallfree train: error: "), err
    assert re.search(message, err[len("stallfree train: error: "):]), err
    assert not (tmp_path / "run").exists()


def test_stallfree_plan_predicts_the_data_parallel_imbalance_the_runs_measured(
        runs: dict[str, dict[str, Any]], tokens: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 48, item 5: the planner takes the length mix (the token source) and predicts each balance's
    data-parallel imbalance from the Loaders' batches alone. The measured part is the prediction times the share the
    host and input leave, plus the host's noise (replicas whose host runtime differs wait for each other too: 1-5
    points on this loaded 2-core machine): within 6 points, and the same steps."""
    assert main(["plan", "--tokens", str(tokens), "--seq-len", str(S), "--attention-span", str(SPAN),
                 "--batch-size", str(JOB["batch_size"]), "--microbatches", str(JOB["microbatches"]), "--dp", "2",
                 "--json", "--no-progress"]) == 0
    predicted = {p["balance"]: p for p in json.loads(capsys.readouterr().out)}
    assert list(predicted) == ["none", "tokens", "compute"]
    for name in ("none", "tokens", "compute"):
        assert predicted[name]["steps"] == runs[name]["steps"], name
        assert predicted[name]["dp_imbalance"] == pytest.approx(_dp(runs[name]), abs=0.06), name
    assert predicted["tokens"]["dp_imbalance"] > 4 * predicted["compute"]["dp_imbalance"]


def test_the_cost_fitted_to_a_jobs_steps_is_the_devices(runs: dict[str, dict[str, Any]], tokens: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 48, item 1: Cost fitted from the trainer's own steps. The simulated device charges l + l^2/16 tokens of
    work per document at RATE (2,000) a second: the fit finds that cost (the host's fixed cost per step lands in the
    linear term, so it reads a little dearer)."""
    for name in ("tokens", "compute"):
        run_dir = runs[name]["config"]["out_dir"]
        assert main(["plan", "--tokens", str(tokens), "--fit", run_dir, "--json", "--no-progress"]) == 0
        fitted = json.loads(capsys.readouterr().out)
        assert fitted["steps"] == runs[name]["steps"]
        assert 1 / RATE * 0.9 < fitted["linear_s"] < 1 / RATE * 2, fitted
        assert 10 <= fitted["attention_span"] <= 32, fitted  # 16 exactly without the host's cost
