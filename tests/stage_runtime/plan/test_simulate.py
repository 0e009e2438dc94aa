"""The simulator against the textbook: equal stages and free links give each schedule's known bubble."""

from __future__ import annotations

import pytest

from stallfree.stage_runtime.plan.costs import FREE_LINK, Cores, HostOverhead, Link, StageCost
from stallfree.stage_runtime.plan.orders import Op, placement, torch_order
from stallfree.stage_runtime.plan.simulate import simulate, simulate_step
from stallfree.stage_runtime.schedules import SCHEDULE_SPECS


def theoretical_bubble(schedule: str, ranks: int, microbatches: int, virtual: int = 2) -> float:
    return SCHEDULE_SPECS[schedule].bubble(ranks, microbatches, virtual)

FREE = lambda a, b: FREE_LINK  # noqa: E731


def _equal(n: int, forward: float = 1.0, backward: float = 2.0, act: int = 10) -> list[StageCost]:
    return [StageCost(forward, backward, backward / 2, act, 1, 0, 0.0)] * n


def _run(schedule: str, ranks: int, m: int, virtual: int = 2, **kw):
    if kw.get("cores") == "one each":  # as many cores as ranks: no sharing, so nothing may change
        kw["cores"] = Cores(ranks)
    order = torch_order(schedule, ranks, m, virtual)
    per_rank = 1 if schedule in ("gpipe", "1f1b") else (2 if schedule == "zbv" else virtual)
    n = ranks * per_rank
    return simulate_step(order, placement(schedule, ranks, n), kw.pop("costs", None) or _equal(n), FREE, **kw)


@pytest.mark.parametrize("cores", [None, "one each"])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved-1f1b"])
@pytest.mark.parametrize(("ranks", "m"), [(2, 2), (2, 4), (3, 6), (4, 4), (4, 8), (4, 16)])
def test_textbook_bubble_exactly(schedule, ranks, m, cores):
    result = _run(schedule, ranks, m, cores=cores)
    assert result.bubble_share == pytest.approx(theoretical_bubble(schedule, ranks, m, 2), abs=1e-12)
    assert result.bubble.warmup_cooldown == pytest.approx(result.bubble_share, abs=1e-12)
    assert result.bubble.imbalance == pytest.approx(0, abs=1e-12)
    assert result.bubble.communication == pytest.approx(0, abs=1e-12)


@pytest.mark.parametrize("cores", [None, "one each"])
@pytest.mark.parametrize("schedule", ["zero-bubble", "zbv"])
@pytest.mark.parametrize(("ranks", "m"), [(2, 4), (3, 6), (4, 8), (4, 16)])
def test_zero_bubble_leaves_only_the_first_forward_walking_down(schedule, ranks, m, cores):
    # With F = I = W (the zero-bubble paper's ideal), what torch's plans leave idle is the first micro-batch's
    # forward reaching the last rank: (S-1) forward slots per rank whatever M is, so the share tends to 0.
    result = _run(schedule, ranks, m, costs=None, cores=cores)
    assert result.idle_s == pytest.approx([ranks - 1] * ranks, abs=1e-12)
    assert result.bubble_share < theoretical_bubble("1f1b", ranks, m) / 3  # ZB-H1's "a third of 1F1B's"


def test_bubble_falls_toward_zero_with_more_microbatches():
    shares = [_run("zbv", 4, m).bubble_share for m in (8, 16, 32)]
    assert shares[0] > shares[1] > shares[2] and shares[2] < 0.02


def test_1f1b_holds_fewer_activations_than_gpipe():
    gpipe, one = _run("gpipe", 4, 8), _run("1f1b", 4, 8)
    assert gpipe.peak_activation_bytes == (80, 80, 80, 80)  # all 8 micro-batches, 10 bytes each
    assert one.peak_activation_bytes == (40, 30, 20, 10)  # rank r holds S - r in flight


def test_uneven_stage_shows_as_imbalance_not_warmup():
    costs = _equal(2)
    costs = [costs[0], StageCost(2.0, 4.0, 2.0, 10, 1, 0, 0.0)]
    result = _run("1f1b", 2, 4, costs=costs)
    assert result.bubble.imbalance > 0.1
    assert result.bubble.communication == pytest.approx(0, abs=1e-12)
    parts = result.bubble.warmup_cooldown + result.bubble.imbalance + result.bubble.communication
    assert parts == pytest.approx(result.bubble_share, abs=1e-12)


def test_slow_link_shows_as_communication():
    order = torch_order("1f1b", 2, 4)
    slow = lambda a, b: Link(1e3, 0.5)  # noqa: E731  1000 B/s, half a second per message
    costs = [StageCost(1.0, 2.0, 1.0, 10, 1000, 0, 0.0)] * 2
    result = simulate_step(order, [0, 1], costs, slow)
    assert result.transfers == 8  # 4 activations forward, 4 gradients back
    assert result.bubble.communication > 0.2
    assert result.schedule_s > simulate(order, [0, 1], costs, FREE).schedule_s + 1.5  # at least one round trip


def test_optimizer_step_counts_in_step_time_not_in_the_schedules_bubble():
    costs = [StageCost(1.0, 2.0, 1.0, 10, 1, 0, 5.0)] * 2
    result = _run("gpipe", 2, 2, costs=costs)
    assert result.step_s == pytest.approx(result.schedule_s + 5.0)
    assert result.bubble_share == pytest.approx(theoretical_bubble("gpipe", 2, 2))


def test_an_order_that_cannot_finish_names_the_waiting_ops():
    order = {0: [Op(0, "B", 0), Op(0, "F", 0)], 1: [Op(1, "F", 0), Op(1, "B", 0)]}
    with pytest.raises(ValueError, match=r"cannot finish.*0B0, 1F0"):
        simulate(order, [0, 1], _equal(2), FREE)


def test_no_overhead_keeps_the_textbook_exactly():
    for schedule, ranks, m in (("gpipe", 4, 8), ("1f1b", 2, 4), ("interleaved-1f1b", 4, 8)):
        result = _run(schedule, ranks, m, overhead=HostOverhead(0.0, 0.0, 0.0))
        assert result.bubble_share == pytest.approx(theoretical_bubble(schedule, ranks, m), abs=1e-12)
        assert result.bubble.runtime == 0.0


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zbv"])
def test_the_action_overhead_is_added_to_every_action_as_busy_time(schedule):
    plain, charged = _run(schedule, 2, 4), _run(schedule, 2, 4, overhead=HostOverhead(action_s=0.25))
    actions = [sum(1 for s in charged.spans if s.rank == r) for r in range(2)]
    assert charged.busy_s == pytest.approx([b + 0.25 * n for b, n in zip(plain.busy_s, actions, strict=True)])
    before = {(s.rank, s.op): s.end - s.start for s in plain.spans}
    after = {(s.rank, s.op): s.end - s.start for s in charged.spans}
    assert after == pytest.approx({k: v + 0.25 for k, v in before.items()})


def test_gpipe_keeps_its_textbook_bubble_with_an_action_overhead():
    # Every action 0.5 longer: equal stages stay equal, and GPipe's share does not depend on F:B.
    result = _run("gpipe", 4, 8, overhead=HostOverhead(action_s=0.5))
    assert result.bubble_share == pytest.approx(theoretical_bubble("gpipe", 4, 8), abs=1e-12)


def test_a_message_costs_its_sender_and_its_receiver_idle_time():
    # GPipe, 2 ranks, 2 micro-batches, F = 1, B = 2, free links; each send occupies its sender 0.3 after it is
    # posted (the message leaves then), each receive 0.5 from when its rank is free, or until the message
    # arrives if that is later (the receive's cost hidden in the wait):
    #   rank 0: F0 0-1 | send | F1 1.3-2.3 | send  ...........  B0 5.5-7.5 (grad there at 5.5, free since 2.6)
    #           B1 8-10 (grad there at 7.8, but free at 7.5 + 0.5 = 8)
    #   rank 1: F0 1-2 (there at 1) | F1 2.5-3.5 (there at 2.3, free at 2 + 0.5) | B0 3.5-5.5 | send | B1 5.8-7.8
    result = _run("gpipe", 2, 2, overhead=HostOverhead(message_s=0.5, send_s=0.3))
    starts = {str(s.op): s.start for s in result.spans}
    assert starts == pytest.approx({"0F0": 0.0, "0F1": 1.3, "1F0": 1.0, "1F1": 2.5, "1B0": 3.5, "1B1": 5.8,
                                    "0B0": 5.5, "0B1": 8.0})
    assert result.schedule_s == pytest.approx(10.0)
    assert result.busy_s == pytest.approx([6.0, 6.0])  # messages are idle, as the trainer counts them
    assert result.bubble.communication == pytest.approx((10.0 - 9.0) / result.schedule_s)  # 9: no message costs


def test_the_step_set_up_is_idle_on_every_rank_and_its_own_cause():
    plain = _run("1f1b", 2, 4)
    result = _run("1f1b", 2, 4, overhead=HostOverhead(action_s=0.1, message_s=0.05, step_s=2.0))
    assert min(s.start for s in result.spans) == pytest.approx(2.0)
    assert result.bubble.runtime == pytest.approx(2.0 / result.schedule_s)
    b = result.bubble
    assert b.warmup_cooldown + b.imbalance + b.communication + b.runtime == pytest.approx(b.total, abs=1e-12)
    assert result.schedule_s > plain.schedule_s + 2.0


def test_a_negative_overhead_is_refused():
    with pytest.raises(ValueError, match=r"host overheads must be >= 0 seconds, got action -1"):
        HostOverhead(action_s=-1)


def test_four_ranks_sharing_two_cores_compute_as_processor_sharing_says():
    # GPipe, 4 equal ranks, 4 micro-batches, F = 1, B = 2, free links, 2 cores of one thread each. While k ranks
    # compute at once, each runs at min(1, 2 / k) of its speed. Forwards (rank r's m-th forward needs rank r-1's):
    #   t 0-1     rank 0 alone                                   -> F0 on rank 0 ends at 1
    #   t 1-2     ranks 0, 1: 2 on 2 cores, full speed             -> ends at 2
    #   t 2-3.5   ranks 0-2: each at 2/3, a forward takes 1.5      -> ends at 3.5
    #   t 3.5-5.5 ranks 0-3: each at 1/2, a forward takes 2        -> rank 0 done (1 + 1 + 1.5 + 2 = 5.5 busy)
    #   t 5.5-7   ranks 1-3: 1.5; t 7-8 ranks 2, 3: 1; t 8-9 rank 3 alone: 1
    # The backwards walk back up the same way, each twice as long: 9 + 2 x 9 = 27, where one device per rank
    # takes (M + S - 1) x (F + B) = 7 x 3 = 21.
    alone, shared = _run("gpipe", 4, 4), _run("gpipe", 4, 4, cores=Cores(2))
    assert alone.schedule_s == 21.0
    assert shared.schedule_s == pytest.approx(27.0, abs=1e-12)
    assert shared.busy_s == pytest.approx([16.5, 18.0, 18.0, 16.5], abs=1e-12)  # (5.5, 6, 6, 5.5) x 3
    forwards = sorted(s.end for s in shared.spans if s.rank == 0 and s.op.kind == "F")
    assert forwards == pytest.approx([1.0, 2.0, 3.5, 5.5], abs=1e-12)
    # Two threads per rank on four cores share them as one thread per rank on two; eight cores leave them alone.
    assert _run("gpipe", 4, 4, cores=Cores(4, threads=2)).schedule_s == pytest.approx(27.0, abs=1e-12)
    assert _run("gpipe", 4, 4, cores=Cores(8, threads=2)).schedule_s == 21.0


def test_ranks_sharing_cores_finish_their_work_as_the_sharing_changes():
    # Four optimizer steps of 1, 1, 2 and 4 s at once on 2 cores: all at 1/2 until t = 2 (ranks 0 and 1 done),
    # then ranks 2 and 3 at full speed: rank 2's last second ends at 3, rank 3's last 2 s at 5.
    program = {r: [Op(0, "O", 0)] for r in range(4)}
    result = simulate(program, [0], _equal(1), FREE, optimizer_s=[1.0, 1.0, 2.0, 4.0], cores=Cores(2))
    assert sorted((s.rank, s.end) for s in result.spans) == [(0, 2.0), (1, 2.0), (2, 3.0), (3, 5.0)]


@pytest.mark.parametrize(("count", "threads"), [(0, 1), (2, 0)])
def test_cores_must_be_positive(count, threads):
    with pytest.raises(ValueError, match=rf"cores and threads per rank must be >= 1, got {count} cores"):
        Cores(count, threads)
