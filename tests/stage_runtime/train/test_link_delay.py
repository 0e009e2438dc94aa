"""``--link-delay RANKS:MS`` (issue 39, item 4): a slow link between two pipeline ranks, run for real.

Every message the schedule sends between the pair waits the delay on its sender before it is posted; the spans
show it arriving at least the delay after the action that made it, other pairs' sends are never held, the
prediction charges the same hold, and bad arguments fail in one line naming ``--link-delay``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from stallfree.cli import main
from stallfree.stage_runtime.accelerator import parse_accelerator
from stallfree.stage_runtime.plan.attribution import trainer_steps
from stallfree.stage_runtime.plan.costs import NO_OVERHEAD, LayerTimes, Link, StageCost
from stallfree.stage_runtime.plan.orders import Op
from stallfree.stage_runtime.plan.pilots import read_pilot
from stallfree.stage_runtime.plan.predict import job_program, predict_training
from stallfree.stage_runtime.plan.simulate import simulate
from stallfree.stage_runtime.train.config import TrainConfig
from stallfree.stage_runtime.train.link_delay import LinkDelay, parse_link_delay
from stallfree.stage_runtime.train.trainer import train


def test_the_forms_parse_to_one_typed_value_and_back() -> None:
    one = parse_link_delay(["1-0:20", "2-3:5.5,3-4:0"])
    assert one == LinkDelay(((0, 1, 0.02), (2, 3, 0.0055), (3, 4, 0.0)))
    assert str(one) == "0-1:20,2-3:5.5,3-4:0" and parse_link_delay(str(one)) == one
    assert one.seconds(1, 0) == one.seconds(0, 1) == 0.02 and one.seconds(1, 2) == 0.0
    assert parse_link_delay(None) is None and parse_link_delay([]) is None
    config = TrainConfig(stages=3, link_delay=parse_link_delay("1-2:20"))
    assert TrainConfig(**config.to_json()).link_delay == config.link_delay == LinkDelay(((1, 2, 0.02),))


@pytest.mark.parametrize(("value", "stages", "message"), [
    ("0-1", 2, r"--link-delay wants RANK-RANK:MS pairs like 0-1:20 .*got '0-1'"),
    ("0-1:fast", 2, r"--link-delay wants RANK-RANK:MS .*got '0-1:fast'"),
    ("0-1:-5", 2, r"--link-delay 0-1:-5: the delay must be >= 0 ms, got -5"),
    ("1-1:5", 2, r"--link-delay 1-1:5: a link joins two different pipeline ranks"),
    ("0-1:5,1-0:6", 2, r"--link-delay gives ranks 0-1 twice"),
    ("1-2:5", 2, r"--link-delay 1-2: pipeline rank 2 is out of range; 1f1b with 2 pipeline ranks has ranks 0..1"),
    ("0-2:5", 3, r"--link-delay 0-2: pipeline ranks 0 and 2 exchange no messages in 1f1b with 3 pipeline ranks; "
                 r"the pairs that do: 0-1, 1-2"),
])
def test_bad_values_name_the_argument(value: str, stages: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainConfig(stages=stages, link_delay=parse_link_delay(value))


def test_a_looped_schedule_links_its_last_rank_to_rank_0() -> None:
    # interleaved over 3 ranks: model stage 2 (rank 2) sends to stage 3 (rank 0); 1f1b's ranks 0 and 2 never talk
    sim = parse_link_delay("0-2:5")
    assert TrainConfig(stages=3, schedule="interleaved-1f1b", microbatches=3, batch_size=6, link_delay=sim).link_delay
    with pytest.raises(ValueError, match=r"--link-delay 0-2: pipeline ranks 0 and 2 exchange no messages"):
        TrainConfig(stages=3, schedule="1f1b", link_delay=sim)


def test_the_command_refuses_a_bad_pair_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["train", "--synthetic", "64", "--model", "mlp", "--image-size", "4", "--batch-size", "8",
                 "--max-steps", "1", "--no-progress", "--link-delay", "0-3:20", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code != 0 and len(err.strip().splitlines()) == 1, err
    assert re.search(r"--link-delay 0-3: pipeline rank 3 is out of range", err), err


def test_the_simulator_holds_the_sender_before_the_message_leaves() -> None:
    # GPipe over 2 ranks, 2 micro-batches, forward 1 s and backward 2 s a stage, a free link holding its sender 0.5 s:
    # rank 0's second forward starts a hold after its first ends, and rank 1 reads each message a hold after it.
    cost = StageCost(1.0, 2.0, 1.0, 0, 0, 0, 0.0)
    program = {0: [Op(0, "F", 0), Op(0, "F", 1), Op(0, "B", 0), Op(0, "B", 1)],
               1: [Op(1, "F", 0), Op(1, "F", 1), Op(1, "B", 0), Op(1, "B", 1)]}
    held = Link(float("inf"), 0.0, hold_s=0.5)
    spans = {(s.op.kind, s.op.stage, s.op.mb): s for s in simulate(program, [0, 1], [cost, cost],
                                                                    lambda a, b: held).spans}
    assert spans[("F", 0, 1)].start == spans[("F", 0, 0)].end + 0.5
    assert spans[("F", 1, 0)].start == spans[("F", 0, 0)].end + 0.5
    assert spans[("B", 0, 0)].start == spans[("B", 1, 0)].end + 0.5


def test_the_prediction_of_a_simulated_device_grows_by_the_holds() -> None:
    # sim:400, 4 micro-batches of 8: every stage 20 ms a micro-batch (forward a third). Under GPipe over 2 ranks
    # each of the 4 activations and 4 gradients holds its sender, all on the step's critical path: 8 x 20 ms.
    layers = [LayerTimes(0.001, 0.002, 0.001, 0, 1024)] * 2
    steps = {}
    for delay in (None, "0-1:20"):
        config = TrainConfig(stages=2, schedule="gpipe", microbatches=4, batch_size=32,
                             accelerator=parse_accelerator("sim:400"), link_delay=parse_link_delay(delay))
        steps[delay] = predict_training(config, (1, 1), 10, link=Link(float("inf"), 0.0), overhead=NO_OVERHEAD,
                                        measured=(layers, 0.0))["step_s"]
    assert steps[None] == pytest.approx(4 * 0.02 + 0.02)  # 4 micro-batches and the fill and drain of one
    assert steps["0-1:20"] - steps[None] == pytest.approx(8 * 0.02)


@pytest.mark.timeout(240)
def test_a_delayed_pair_delivers_each_message_no_sooner_than_the_delay_and_holds_no_other(tmp_path: Path) -> None:
    # 3 ranks, the cut 1-2 slow: rank 1's activations to rank 2 and rank 2's gradients to rank 1 are held, and
    # the reader starts each no sooner than the delay after the action that made it; rank 0's sends, and rank 1's
    # gradients to rank 0, are never held.
    delay, micro = 0.1, 2
    config = TrainConfig(model="mlp", image_size=4, samples=64, batch_size=8, microbatches=micro, stages=3,
                         schedule="gpipe", accelerator=parse_accelerator("sim:2000"),
                         link_delay=parse_link_delay("1-2:100"), max_steps=3,
                         progress=False, timeout_s=120, out_dir=str(tmp_path / "run"))
    train(config)
    program, owner = job_program(config)
    steps = trainer_steps(config.out_dir, program)
    assert len(steps) == 2  # the first step is left out, as the report does
    for spans in steps:
        done = {(s.op.kind, s.op.stage, s.op.mb): s for s in spans}
        for m in range(micro):
            assert done[("F", 2, m)].start - done[("F", 1, m)].end >= delay
            assert done[("B", 1, m)].start - done[("B", 2, m)].end >= delay
    held: dict[tuple[str, int], int] = {}
    for rank in range(3):
        data = json.loads((Path(config.out_dir) / f"spans-{rank}.json").read_text())
        for stage, state, start, end, step, *_ in data["spans"]:
            if str(stage).startswith("send"):
                assert state == "waiting" and end - start >= delay
                held[(stage, step)] = held.get((stage, step), 0) + 1
    # per step: stage 1's forward sends (to rank 2) and stage 2's backward sends (to rank 1), one per micro-batch
    assert held == {(f"send{s}", step): micro for s in (1, 2) for step in range(1, 4)}


def test_a_run_with_a_delay_is_refused_as_a_pilot(tmp_path: Path) -> None:
    # its held senders would be fitted as the runtime's per-send overhead of every plan
    config = TrainConfig(stages=2, link_delay=parse_link_delay("0-1:20"))
    layers = {"layers": [{"forward_s": 0.001, "backward_s": 0.002, "weight_s": 0.001, "param_bytes": 0,
                          "activation_bytes": 64}] * 2, "optimizer_s": 0.0}
    (tmp_path / "summary.json").write_text(json.dumps({"config": config.to_json(), "layer_costs": layers,
                                                       "balance": [1, 1]}))
    with pytest.raises(ValueError, match=r"a job run with --link-delay 0-1:20 holds its senders"):
        read_pilot(tmp_path)
