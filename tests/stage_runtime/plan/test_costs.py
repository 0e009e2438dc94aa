"""Link and size parsing: what --link, --cross-link and --memory-per-device accept."""

from __future__ import annotations

import pytest

from stallfree.stage_runtime.models.layer_times import LayerTimes
from stallfree.stage_runtime.plan.costs import Link, StageCost, parse_bytes, parse_link, stage_costs


@pytest.mark.parametrize(("text", "rate", "latency"), [
    ("25GB/s,5us", 25e9, 5e-6), ("1GB/s,20ms", 1e9, 0.02), ("10Gbit/s,1s", 1.25e9, 1.0),
    ("512MiB/s, 1.5ms", 512 * 2**20, 1.5e-3),
])
def test_parse_link(text, rate, latency):
    link = parse_link(text)
    assert link.bytes_per_s == pytest.approx(rate) and link.latency_s == pytest.approx(latency)
    assert parse_link(link.describe()).bytes_per_s == pytest.approx(rate, rel=1e-5)


@pytest.mark.parametrize(("rate", "latency", "text"), [
    # a link measured between processes of one machine (gloo through memory): it read "4.19328e+06GB/s,609us"
    (4.19328e15, 609e-6, "4.19328PB/s,609us"), (2.5e12, 5e-6, "2.5TB/s,5us"), (25e9, 5e-6, "25GB/s,5us"),
    (1.5e6, 0.02, "1.5MB/s,20ms"), (512.0, 1.0, "512B/s,1s"),
])
def test_a_link_is_written_in_the_largest_unit_it_reaches(rate: float, latency: float, text: str) -> None:
    assert Link(rate, latency).describe() == text
    back = parse_link(text)
    assert back.bytes_per_s == pytest.approx(rate, rel=1e-5) and back.latency_s == pytest.approx(latency, rel=1e-5)


@pytest.mark.parametrize("text", ["25GB,5us", "fast", "25GB/s", "25XB/s,5us", "25GB/s,5parsecs", "0GB/s,1ms"])
def test_bad_link_says_the_form(text):
    with pytest.raises(ValueError, match="--link"):
        parse_link(text)


def test_parse_bytes():
    assert parse_bytes("16GiB") == 16 * 2**30 and parse_bytes("512MB") == 512e6 and parse_bytes("2e3") == 2000
    with pytest.raises(ValueError, match="--memory-per-device wants a size like 16GiB"):
        parse_bytes("lots")


def test_link_time_excludes_latency_from_occupancy():
    assert Link(1e3, 0.5).busy_s(1000) == 1.0


def test_stage_costs_sum_layers_and_share_the_optimizer_by_parameters():
    layers = [LayerTimes(1.0, 2.0, 1.0, 10, 5), LayerTimes(1.0, 2.0, 1.0, 30, 7)]
    a, b = stage_costs(layers, (1, 1), optimizer_s=4.0)
    assert (a.optimizer_s, b.optimizer_s) == (1.0, 3.0)
    (both,) = stage_costs(layers, (2,))
    assert both == StageCost(2.0, 4.0, 2.0, 12, 7, 40, 0.0)
    with pytest.raises(ValueError, match="summing to 2 layers"):
        stage_costs(layers, (1,))
