"""``--schedule 2bw`` (PipeDream-2BW) trained for real on CPU/gloo.

Its weights equal a single-process run of the 2BW rule computed by hand (each micro-batch's gradient taken at the
version its forward read, applied to the newest), not synchronous accumulation; it keeps the versions and staleness
the simulator predicts; resuming from a checkpoint equals the uninterrupted run. The jobs of one size share one set
of spawned processes (``train_many``), started once per module: starting them and importing torch is most of a
job's time.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.func import functional_call

from stallfree.stage_runtime.config.train_config import TrainConfig
from stallfree.stage_runtime.jobs import train_many
from stallfree.stage_runtime.models.zoo import build_model
from stallfree.stage_runtime.plan.asynchronous import simulate_async
from stallfree.stage_runtime.plan.costs import FREE_LINK, StageCost
from stallfree.stage_runtime.schedules import build_schedule
from stallfree.stage_runtime.train import checkpoint as ckpt
from stallfree.stage_runtime.train.feed import TensorBatches
from stallfree.stage_runtime.train.report import format_summary

pytestmark = pytest.mark.slow  # trainer jobs in spawned processes

STEPS, M = 4, 4
MODEL = {"model": "mlp", "model_kwargs": {"hidden": 16, "depth": 6}, "image_size": 4}  # 8 layers
BALANCE = (3, 5)


def _config(out: Path, name: str, **kw: object) -> TrainConfig:
    base = dict(samples=64, batch_size=8, microbatches=M, schedule="2bw", balance=BALANCE, max_steps=STEPS,
                lr=0.1, momentum=0.0, progress=False, timeout_s=60, out_dir=str(out / name), **MODEL)
    base.update(kw)
    return TrainConfig.from_flags(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TrainConfig]:
    out = tmp_path_factory.mktemp("two_bw")
    configs = {
        "2bw": _config(out, "2bw", lr=1.0),  # large enough that a stale read moves the weights by 1e-3
        "momentum": _config(out, "momentum", momentum=0.9),
        # resume: 6 steps with a checkpoint at 3, against 3 steps then 3 more from that checkpoint
        "full": _config(out, "full", max_steps=6, checkpoint_every=3),
        "half": _config(out, "half", max_steps=3),
        "sim": _config(out, "sim", accelerator="sim:400"),
    }
    configs["resumed"] = _config(out, "resumed", max_steps=6, resume=True,
                                 checkpoint_dir=str(out / "half" / "checkpoints"))
    train_many(list(configs.values()))
    return configs


@pytest.fixture(scope="module")
def three_stages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TrainConfig]:
    """The 2BW jobs over 3 pipeline ranks, in one set of processes."""
    out = tmp_path_factory.mktemp("two_bw_s3")
    configs = {
        # M = S-1, the fewest that keep two versions
        "s3": _config(out, "s3", stages=3, microbatches=2, balance=(2, 3, 3), lr=1.0),
        # the steady state: S=3, M=4, the simulated device slow beside the host's sends (50-125 ms an action)
        "steady": _config(out, "steady", stages=3, microbatches=4, balance=(2, 3, 3), samples=8 * 12, max_steps=12,
                          accelerator="sim:10"),
    }
    train_many(list(configs.values()))
    return configs


def _summary(config: TrainConfig) -> dict:
    return json.loads((Path(config.report.out_dir) / "summary.json").read_text())


def _weights(config: TrainConfig) -> dict[str, torch.Tensor]:
    """The full model's state dict, from the final checkpoint's per-rank files."""
    summary = _summary(config)
    bounds = [sum(summary["balance"][:s]) for s in range(len(summary["balance"]))]
    state = {}
    for rank in range(config.pipeline.world_size):
        for stage, sd in ckpt.load_rank(config.ckpt_root, summary["steps"], rank)["modules"].items():
            for key, value in sd.items():
                local, rest = key.split(".", 1)
                state[f"{bounds[int(stage)] + int(local)}.{rest}"] = value
    return state


def _reference(config: TrainConfig, steps: int, *, stale: bool) -> dict[str, torch.Tensor]:
    """The 2BW rule by hand, in one process: ``W_s(t+1) = W_s(t) - lr * v_s(t)`` with SGD's momentum buffer
    ``v_s(t) = momentum * v_s(t-1) + g_s(t)`` (``v_s(0) = g_s(0)``) of the step's gradient ``g = 1/M * sum_j grad_j``.

    Stage ``s`` of ``S`` leaves ``w = S-1-s`` micro-batches in flight across a step's end, and those (the first
    ``w`` of each step after the first) run their forward before the previous step's update: they read version
    ``t-1``, the others ``t``. Each gradient is taken through every stage at the version that stage's forward read.
    ``stale=False`` reads version ``t`` everywhere: synchronous gradient accumulation, which 2BW must not equal.
    With ``config.pipeline.dp`` replicas each takes its shard of the data and the gradients are averaged.
    """
    assert config.pipeline.balance is not None
    torch.manual_seed(config.seed)
    layers = list(build_model(config.model.name, 10, config.model.image_size, **config.model.kwargs))
    n, m = len(config.pipeline.balance), config.pipeline.microbatches
    bounds = [sum(config.pipeline.balance[:s]) for s in range(n + 1)]
    stages = [nn.Sequential(*layers[bounds[s]:bounds[s + 1]]) for s in range(n)]
    history = [[{n: p.detach().clone() for n, p in st.named_parameters()}] for st in stages]  # [stage][version]
    dp = config.pipeline.dp
    feeds = [iter(TensorBatches(config.feed.samples, config.pipeline.batch_size, config.model.image_size, 10,
                                seed=config.seed, rank=d, world_size=dp)) for d in range(dp)]
    velocity: list[dict[str, torch.Tensor]] = [{} for _ in range(n)]
    for t in range(steps):
        sums = [{k: torch.zeros_like(w) for k, w in history[s][t].items()} for s in range(n)]
        for x, y in [next(feed) for feed in feeds]:  # each replica's batch; the gradients are averaged
            for j, (xm, ym) in enumerate(zip(x.tensor_split(m), y.tensor_split(m), strict=True)):
                read = [t - 1 if stale and t > 0 and j < n - 1 - s else t for s in range(n)]
                weights = [{k: w.clone().requires_grad_(True) for k, w in history[s][read[s]].items()}
                           for s in range(n)]
                h = xm
                for s in range(n):
                    h = functional_call(stages[s], weights[s], (h,))
                loss = nn.functional.cross_entropy(h, ym) / (m * config.pipeline.dp)
                grads = iter(torch.autograd.grad(loss, [w for s in range(n) for w in weights[s].values()]))
                for s in range(n):
                    for k in weights[s]:
                        sums[s][k] += next(grads)
        for s in range(n):
            velocity[s] = {k: config.optimizer.momentum * velocity[s][k] + g if velocity[s] else g
                           for k, g in sums[s].items()}
            history[s].append({k: w - config.optimizer.lr * velocity[s][k] for k, w in history[s][t].items()})
    return {f"{bounds[s] + int(k.split('.', 1)[0])}.{k.split('.', 1)[1]}": w
            for s in range(n) for k, w in history[s][steps].items()}


def test_2bw_applies_each_gradient_taken_at_the_version_its_forward_read(runs: dict) -> None:
    got = _weights(runs["2bw"])
    want, synchronous = _reference(runs["2bw"], STEPS, stale=True), _reference(runs["2bw"], STEPS, stale=False)
    assert got.keys() == want.keys()
    worst = max(float((got[k] - want[k]).abs().max()) for k in want)
    assert worst <= 1e-5, f"max abs difference from the 2BW rule {worst}"
    # the stale reads matter: synchronous accumulation on the same data ends elsewhere
    assert max(float((got[k] - synchronous[k]).abs().max()) for k in want) > 1e-3


def test_2bw_keeps_the_versions_and_staleness_the_simulator_predicts(runs: dict) -> None:
    predicted = simulate_async("pipedream-2bw", 2, M, 8, [StageCost(1.0, 2.0, 1.0, 10, 1, 100, 0.0)] * 2,
                               lambda a, b: FREE_LINK)
    for name in ("2bw", "momentum", "sim"):
        summary = _summary(runs[name])
        assert summary["weight_versions"] == list(predicted.weight_versions) == [2, 1], name
        assert summary["staleness_steps"] == list(predicted.staleness) == [1, 0], name
    printed = format_summary(_summary(runs["2bw"]))
    assert "  weights        2, 1 versions kept per stage at most; staleness 1, 0 updates" in printed


def test_2bw_with_momentum_carries_the_optimizer_state_across_versions(runs: dict) -> None:
    # SGD's momentum buffers are keyed by the parameter tensors, which 2BW replaces at each update on every stage
    # but the last: a buffer left on the old tensor would restart momentum from zero at each update.
    got, want = _weights(runs["momentum"]), _reference(runs["momentum"], STEPS, stale=True)
    assert max(float((got[k] - want[k]).abs().max()) for k in want) <= 1e-5


def test_2bw_resume_equals_the_uninterrupted_run(runs: dict) -> None:
    got, want = _weights(runs["resumed"]), _weights(runs["full"])
    assert max(float((got[k] - want[k]).abs().max()) for k in want) == 0.0
    rows = {name: [json.loads(line) for line in (Path(runs[name].report.out_dir) / "train.jsonl").read_text()
                   .splitlines()] for name in ("resumed", "full")}
    resumed = [(r["step"], r["loss"]) for r in rows["resumed"] if "loss" in r]
    assert [s for s, _ in resumed] == [4, 5, 6]
    assert resumed == [(r["step"], r["loss"]) for r in rows["full"] if "loss" in r and r["step"] > 3]


def test_2bw_replicas_average_their_gradients_at_each_update(tmp_path: Path) -> None:
    config = _config(tmp_path, "dp2", dp=2, lr=1.0)
    train_many([config])
    got, want = _weights(config), _reference(config, STEPS, stale=True)
    assert max(float((got[k] - want[k]).abs().max()) for k in want) <= 1e-5
    replica = {rank: ckpt.load_rank(config.ckpt_root, STEPS, rank)["modules"] for rank in range(4)}
    for stage_rank in (0, 1):  # replica 1's ranks are 2 and 3: the same weights, bit for bit
        mine, theirs = replica[stage_rank], replica[stage_rank + 2]
        assert all(torch.equal(mine[s][k], theirs[s][k]) for s in mine for k in mine[s])


def test_2bw_in_three_stages_with_two_microbatches_keeps_two_versions(three_stages: dict) -> None:
    # M = S-1, the fewest that keep two versions: rank 0 holds a whole step in flight at each update, and the
    # middle stage both receives gradients and sends them on.
    config = three_stages["s3"]
    got, want = _weights(config), _reference(config, STEPS, stale=True)
    assert max(float((got[k] - want[k]).abs().max()) for k in want) <= 1e-5
    predicted = simulate_async("pipedream-2bw", 3, 2, 8, [StageCost(1.0, 2.0, 1.0, 10, 1, 100, 0.0)] * 3,
                               lambda a, b: FREE_LINK)
    summary = _summary(config)
    assert summary["weight_versions"] == list(predicted.weight_versions) == [2, 2, 1]
    assert summary["staleness_steps"] == list(predicted.staleness) == [1, 1, 0]


def test_2bw_under_a_simulated_accelerator_runs_at_most_its_speed(runs: dict) -> None:
    summary = _summary(runs["sim"])
    assert summary["accelerator"] == "sim:400" and summary["steps"] == STEPS
    assert summary["images_per_s"] <= 400 * 1.02
    steady = summary["predicted_steady"]  # the simulator's 2BW on this split, beside 1F1B's step
    assert steady["2bw"]["weight_versions"] == summary["weight_versions"] == [2, 1]
    assert steady["2bw"]["images_per_s"] > steady["1f1b"]["images_per_s"]  # no flush: no fill and drain per step


def test_2bw_needs_enough_microbatches_for_two_versions() -> None:
    with pytest.raises(ValueError, match=r"schedule '2bw' keeps two weight versions only with --microbatches >= "
                                         r"pipeline ranks - 1; got 1 micro-batches for 3 ranks: use --microbatches 2"):
        TrainConfig.from_flags(schedule="2bw", stages=3, microbatches=1, batch_size=8)


def test_2bw_is_not_a_torch_schedule() -> None:
    with pytest.raises(ValueError, match=r"schedule '2bw' does not flush: stallfree.stage_runtime.train.two_bw"):
        build_schedule("2bw", [], 4, nn.functional.cross_entropy)


def _steady_idle(out_dir: str, rank: int, steps: range) -> float:
    """Rank ``rank``'s idle share between its first and last compute action of ``steps`` (its own spans)."""
    spans = json.loads((Path(out_dir) / f"spans-{rank}.json").read_text())["spans"]
    busy = sorted((s[2], s[3]) for s in spans if s[1] == "busy" and s[4] in steps)
    length = busy[-1][1] - busy[0][0]
    return 1 - sum(end - start for start, end in busy) / length


def test_2bw_in_the_steady_state_keeps_its_slowest_rank_busy_without_a_barrier(three_stages: dict) -> None:
    # S=3, M=4: 1F1B idles every rank (S-1)/(M+S-1) = 1/3 of each step (fill and drain). 2BW has no fill or drain
    # in the steady state, and nothing between steps may hold a rank: a per-step collective (a barrier) made the
    # slowest rank wait for the others' ends of the step and then for the first backwards to come down the
    # pipeline, 1F1B's idle again. What 2BW may leave is the host's sends and receives (a few ms per action, against
    # the simulated device's 50-125 ms here: at sim:25 they reached 9% on a loaded machine).
    stages, micro = 3, 4
    config = three_stages["steady"]
    summary = _summary(config)
    layers = summary["layer_costs"]["layers"]
    bounds = [sum(summary["balance"][:s]) for s in range(stages + 1)]
    cost = [sum(t["forward_s"] + t["backward_s"] for t in layers[bounds[s]:bounds[s + 1]]) for s in range(stages)]
    slowest = max(range(stages), key=lambda s: cost[s])  # the rank the others wait for; no imbalance idles it
    one_f_one_b = (stages - 1) / (micro + stages - 1)
    # Measured on the 2-core machine at sim:25: 4% without a barrier (9% under load), 16% with the per-step
    # collective it had before.
    assert _steady_idle(config.report.out_dir, slowest, range(4, 12)) < one_f_one_b / 4
