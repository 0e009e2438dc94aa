"""``--link-delay RANKS:MS`` (issue 39, item 4): a slow link between two pipeline ranks, run for real.

Every message the schedule sends between the pair arrives the delay after it was sent while its sender goes on
computing: the spans show each read no sooner than the delay after the action that made it, the sender's next
action right after its last, every schedule family running to the end; the prediction adds the delay to the link's
latency, and bad arguments fail in one line naming ``--link-delay``.

The jobs run once per module, those of one size in one set of spawned processes (``train_many``): starting the
processes and importing torch is most of each job's time.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from stallfree.cli import main
from stallfree.core.accelerator import parse_accelerator
from stallfree.stage_runtime.config.train_config import TrainConfig
from stallfree.stage_runtime.jobs import train_many
from stallfree.stage_runtime.link_delay import LinkDelay, parse_link_delay
from stallfree.stage_runtime.models.layer_times import LayerTimes
from stallfree.stage_runtime.plan.attribution import trainer_steps
from stallfree.stage_runtime.plan.costs import NO_OVERHEAD, Link
from stallfree.stage_runtime.plan.orders import job_program
from stallfree.stage_runtime.plan.pilots import read_pilot
from stallfree.stage_runtime.plan.predict import predict_training

pytestmark = pytest.mark.slow  # trainer jobs in spawned processes


def test_the_forms_parse_to_one_typed_value_and_back() -> None:
    one = parse_link_delay(["1-0:20", "2-3:5.5,3-4:0"])
    assert one == LinkDelay(((0, 1, 0.02), (2, 3, 0.0055), (3, 4, 0.0)))
    assert str(one) == "0-1:20,2-3:5.5,3-4:0" and parse_link_delay(str(one)) == one
    assert one.seconds(1, 0) == one.seconds(0, 1) == 0.02 and one.seconds(1, 2) == 0.0
    assert parse_link_delay(None) is None and parse_link_delay([]) is None
    config = TrainConfig.from_flags(stages=3, link_delay=parse_link_delay("1-2:20"))
    rebuilt = TrainConfig.from_flags(**config.to_json())
    assert rebuilt.simulation.link_delay == config.simulation.link_delay == LinkDelay(((1, 2, 0.02),))


@pytest.mark.parametrize(("value", "stages", "message"), [
    ("0-1", 2, r"--link-delay wants RANK-RANK:MS pairs like 0-1:20 .*got '0-1'"),
    ("0-1:fast", 2, r"--link-delay wants RANK-RANK:MS .*got '0-1:fast'"),
    ("0-1:-5", 2, r"--link-delay 0-1:-5: the delay must be a finite number of ms >= 0, got -5"),
    ("1-1:5", 2, r"--link-delay 1-1:5: a link joins two different pipeline ranks"),
    ("0-1:5,1-0:6", 2, r"--link-delay gives ranks 0-1 twice"),
    ("1-2:5", 2, r"--link-delay 1-2: pipeline rank 2 is out of range; 1f1b with 2 pipeline ranks has ranks 0..1"),
    ("0-2:5", 3, r"--link-delay 0-2: pipeline ranks 0 and 2 exchange no messages in 1f1b with 3 pipeline ranks; "
                 r"the pairs that do: 0-1, 1-2"),
])
def test_bad_values_name_the_argument(value: str, stages: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainConfig.from_flags(stages=stages, link_delay=parse_link_delay(value))


def test_a_looped_schedule_links_its_last_rank_to_rank_0() -> None:
    # interleaved over 3 ranks: model stage 2 (rank 2) sends to stage 3 (rank 0); 1f1b's ranks 0 and 2 never talk
    sim = parse_link_delay("0-2:5")
    looped = TrainConfig.from_flags(stages=3, schedule="interleaved-1f1b", microbatches=3, batch_size=6, link_delay=sim)
    assert looped.simulation.link_delay
    with pytest.raises(ValueError, match=r"--link-delay 0-2: pipeline ranks 0 and 2 exchange no messages"):
        TrainConfig.from_flags(stages=3, schedule="1f1b", link_delay=sim)


def test_the_command_refuses_a_bad_pair_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["train", "--synthetic", "64", "--model", "mlp", "--image-size", "4", "--batch-size", "8",
                 "--max-steps", "1", "--no-progress", "--link-delay", "0-3:20", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code != 0 and len(err.strip().splitlines()) == 1, err
    assert re.search(r"--link-delay 0-3: pipeline rank 3 is out of range", err), err


def test_the_prediction_of_a_simulated_device_grows_by_the_latency() -> None:
    # sim:400, 4 micro-batches of 8: every stage 20 ms a micro-batch. Under GPipe over 2 ranks a latency of D delays
    # the second rank's first forward and the first rank's last backward, and every other message overlaps compute:
    # the step grows by 2 x D, where a sender held D a message would grow it by 2 x 4 x D.
    layers = [LayerTimes(0.001, 0.002, 0.001, 0, 1024)] * 2
    steps = {}
    for delay in (None, "0-1:20"):
        config = TrainConfig.from_flags(stages=2, schedule="gpipe", microbatches=4, batch_size=32,
                                        accelerator=parse_accelerator("sim:400"), link_delay=parse_link_delay(delay))
        steps[delay] = predict_training(config, (1, 1), 10, link=Link(float("inf"), 0.0), overhead=NO_OVERHEAD,
                                        measured=(layers, 0.0))["step_s"]
    assert steps[None] == pytest.approx(4 * 0.02 + 0.02)  # 4 micro-batches and the fill and drain of one
    assert steps["0-1:20"] - steps[None] == pytest.approx(2 * 0.02)


def test_a_job_across_machines_is_refused() -> None:
    with pytest.raises(ValueError, match=r"--link-delay 0-1:20: the job runs 4 processes, 2 on this machine; .*"
                                         r"--nnodes 1"):
        parse_link_delay("0-1:20").check_one_machine(2, 4)  # type: ignore[union-attr]


# name: (schedule, pipeline ranks, micro-batches, the delayed pair); one schedule of each family (one stage a rank,
# looped, V), GPipe's with the delay checked message by message
JOBS = {"gpipe": ("gpipe", 4, 2, "1-2:100"), "1f1b": ("1f1b", 4, 4, "1-2:50"),
        "interleaved-1f1b": ("interleaved-1f1b", 2, 4, "0-1:50"), "zero-bubble": ("zero-bubble", 2, 4, "0-1:50"),
        "zbv": ("zbv", 2, 4, "0-1:50")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[TrainConfig, list]]:
    """Each job of :data:`JOBS` trained, and its steps' spans (the first step left out, as the report does)."""
    out = tmp_path_factory.mktemp("link_delay")
    configs = {name: TrainConfig.from_flags(model="mlp", image_size=4, samples=64, batch_size=4 * micro,
                                            microbatches=micro, stages=stages, schedule=schedule,
                                            accelerator=parse_accelerator("sim:2000"),
                                            link_delay=parse_link_delay(delay), max_steps=3, progress=False,
                                            timeout_s=120, out_dir=str(out / name))
               for name, (schedule, stages, micro, delay) in JOBS.items()}
    for world in sorted({c.pipeline.world_size for c in configs.values()}):
        train_many([c for c in configs.values() if c.pipeline.world_size == world])
    return {name: (config, trainer_steps(config.report.out_dir, job_program(config)[0]))
            for name, config in configs.items()}


def _reads(config: TrainConfig, spans: list) -> list[tuple[float, float, bool]]:
    """Each message between ranks: (when its maker ended, when its reader started, whether its link is delayed)."""
    assert config.simulation.link_delay is not None
    _, owner = job_program(config)
    done = {(s.op.kind, s.op.stage, s.op.mb): s for s in spans}
    found = []
    for (kind, stage, mb), span in done.items():
        if kind == "F" and stage > 0:
            maker = done[("F", stage - 1, mb)]
        elif kind in ("B", "I") and stage + 1 < config.pipeline.model_stages:
            maker = done.get(("B", stage + 1, mb)) or done[("I", stage + 1, mb)]
        else:
            continue
        a, b = owner[maker.op.stage], owner[stage]
        if a != b:
            found.append((maker.end, span.start, config.simulation.link_delay.seconds(a, b) > 0))
    return found


@pytest.mark.timeout(300)  # the module's jobs train in the first test that asks for them
def test_a_delayed_pair_delivers_each_message_no_sooner_than_the_delay_and_holds_no_sender(runs: dict) -> None:
    # 4 ranks under GPipe, the cut 1-2 slow: rank 2 reads each of rank 1's activations, and rank 1 each of rank 2's
    # gradients, no sooner than the delay after the action that made it; meanwhile the sender goes on: rank 1's
    # next forward and rank 2's next backward start right after the last (a held sender would start a delay later).
    delay, micro = 0.1, 2
    config, steps = runs["gpipe"]
    assert len(steps) == 2  # the first step is left out, as the report does
    for spans in steps:
        reads = _reads(config, spans)
        assert sum(slow for *_, slow in reads) == 2 * micro
        for made, read, slow in reads:
            if slow:
                assert read - made >= delay - 1e-6
        done = {(s.op.kind, s.op.stage, s.op.mb): s for s in spans}
        for m in range(micro - 1):
            assert done[("F", 1, m + 1)].start - done[("F", 1, m)].end < delay / 2
            assert done[("B", 2, m + 1)].start - done[("B", 2, m)].end < delay / 2
    waited: dict[tuple[str, int], int] = {}
    for rank in range(4):
        data = json.loads((Path(config.report.out_dir) / f"spans-{rank}.json").read_text())
        for stage, state, start, end, step, *_ in data["spans"]:
            if str(stage).startswith("link"):
                assert state == "waiting" and end >= start
                waited[(stage, step)] = waited.get((stage, step), 0) + 1
    # per step: stage 2 waits for each activation from rank 1, stage 1 for each gradient from rank 2
    assert waited == {(f"link{s}", step): micro for s in (1, 2) for step in range(1, 4)}


@pytest.mark.timeout(300)  # the module's jobs train in the first test that asks for them
@pytest.mark.parametrize("schedule", ["1f1b", "interleaved-1f1b", "zero-bubble", "zbv"])
def test_every_schedule_family_runs_a_delayed_link_to_the_end(runs: dict, schedule: str) -> None:
    # one schedule of each family (one stage a rank, looped, V), each message over the slow pair read no sooner
    # than the delay after it was made; the run not hanging is the other half of the test
    config, steps = runs[schedule]
    assert len(steps) == 2  # the first step is left out, as the report does
    for spans in steps:
        slow = [(made, read) for made, read, delayed in _reads(config, spans) if delayed]
        assert slow and all(read - made >= 0.05 - 1e-6 for made, read in slow)


def test_a_run_with_a_delay_is_refused_as_a_pilot(tmp_path: Path) -> None:
    # its waits for delayed messages would be fitted as the runtime's per-message overhead of every plan
    config = TrainConfig.from_flags(stages=2, link_delay=parse_link_delay("0-1:20"))
    layers = {"layers": [{"forward_s": 0.001, "backward_s": 0.002, "weight_s": 0.001, "param_bytes": 0,
                          "activation_bytes": 64}] * 2, "optimizer_s": 0.0}
    (tmp_path / "summary.json").write_text(json.dumps({"config": config.to_json(), "layer_costs": layers,
                                                       "balance": [1, 1]}))
    with pytest.raises(ValueError, match=r"a job run with --link-delay 0-1:20 waits for its delayed messages"):
        read_pilot(tmp_path)
