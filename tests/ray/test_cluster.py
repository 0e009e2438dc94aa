"""The fixture's cluster is real, local and has the two nodes the tests rely on."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.ray


def test_the_cluster_has_two_nodes_on_loopback(ray_connected: str) -> None:
    nodes = [n for n in ray.nodes() if n["Alive"]]
    assert len(nodes) == 2 and {n["NodeManagerAddress"] for n in nodes} == {"127.0.0.1"}
    assert ray_connected.startswith("127.0.0.1:")
    assert ray.cluster_resources()["CPU"] == 3
