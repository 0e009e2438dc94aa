"""A failed DALI pipeline is retired before its replacement is built: no batch left running in it, shut down at once.

The crash it guards against: SIGSEGV in 6 of about 66 runs of a Loader over a folder of hostile and good images with
``on_error="skip"``, in a thread building the DALI pipeline. The failed pipeline was dropped with the next batch
still scheduled in it, and torn down whenever the failure's traceback let go of it, while its replacement ran.
``bench/graph_rebuilds.py`` runs that folder in a loop of processes and counts the crashes.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from stallfree import Loader
from stallfree.pipeline import graph as graph_module
from stallfree.transforms import CenterCrop


def png(seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (10, 12, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def fails_in_dali() -> bytes:
    """Passes the header checks but fails inside DALI's decoder (a JPEG claiming 3-bit samples)."""
    buffer = io.BytesIO()
    Image.fromarray(np.full((10, 12, 3), 90, np.uint8)).save(buffer, "JPEG")
    data = bytearray(buffer.getvalue())
    data[data.find(b"\xff\xc0") + 4] = 3
    return bytes(data)


class _Recorded:
    """A DALI pipeline that logs its builds, batches in flight and shutdown into a shared list."""

    def __init__(self, pipe: Any, log: list[tuple[str, int, int]], batch_size: int):
        self._pipe, self._log, self._flying, self._size = pipe, log, 0, batch_size
        log.append(("build", id(self), batch_size))

    def schedule_run(self) -> None:
        self._pipe.schedule_run()
        self._flying += 1

    def outputs(self) -> Any:
        self._flying -= 1
        return self._pipe.outputs()

    def _shutdown(self) -> None:
        self._log.append(("shutdown", id(self), self._flying))
        self._pipe._shutdown()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipe, name)


def test_a_failed_pipeline_is_drained_and_shut_down_before_the_next_is_built(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[tuple[str, int, int]] = []
    build = graph_module.Graph._build

    def recorded(self: graph_module.Graph, batch_size: int) -> Any:
        return _Recorded(build(self, batch_size), log, batch_size)

    monkeypatch.setattr(graph_module.Graph, "_build", recorded)
    lines = ["path,label"]
    for i in range(48):  # a bad sample in every third batch of 4: batch k fails while batch k + 1 is in the graph
        (tmp_path / f"{i:03d}.img").write_bytes(fails_in_dali() if i % 12 == 1 else png(i))
        lines.append(f"{i:03d}.img,{i}")
    (tmp_path / "list.csv").write_text("\n".join(lines) + "\n")
    loader = Loader(tmp_path / "list.csv", 4, transform=[CenterCrop(8)], shuffle=False, dtype="uint8",
                    num_threads=1, on_error="skip")
    batches = list(loader)
    loader.close()
    assert len(batches) == 12 and len(loader.skipped) == 4
    main = [event for event in log if event[2] == 4 or event[0] == "shutdown"]
    builds = [i for i, event in enumerate(main) if event[0] == "build"]
    assert len(builds) > 1, "no rebuild happened: the test no longer exercises it"
    for before, after in zip(builds, builds[1:], strict=False):
        retired = main[before][1]
        shutdowns = [event for event in main[before:after] if event[0] == "shutdown" and event[1] == retired]
        assert shutdowns, "a pipeline was replaced without being shut down first"
        assert shutdowns[0][2] == 0, f"a pipeline was shut down with {shutdowns[0][2]} batch(es) still in it"
    probes = [event for event in log if event[0] == "build" and event[2] == 1]
    shut = {event[1] for event in log if event[0] == "shutdown"}
    assert all(event[1] in shut for event in probes[:-1]), "a failed probe pipeline was left to the collector"
