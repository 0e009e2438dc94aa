"""The Loader's graph on Ray actors gives the local Loader's batches, skips and resume states (issue 38, item 1).

Against the real two-node cluster of tests/ray/conftest.py (3 CPUs), with small generated images.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from stallfree import BadSampleError, Loader, RayWorkers, StageClock
from stallfree.transforms import CenterCrop, Normalize, RandomHorizontalFlip, RandomResizedCrop

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.ray

SPEC = [RandomResizedCrop(12, scale=(0.3, 1.0)), RandomHorizontalFlip()]
NORMALIZED = [*SPEC, Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))]


def make(source: Path, workers: RayWorkers | None = None, **kwargs: Any) -> Loader:
    options: dict[str, Any] = {"transform": SPEC, "shuffle": True, "seed": 3, "dtype": "uint8", "num_threads": 1}
    options.update(kwargs)
    return Loader(source, options.pop("batch_size", 5), workers=workers, **options)


def as_arrays(batches: list[Any]) -> list[tuple[np.ndarray, ...]]:
    out = []
    for batch in batches:
        images, labels, *rest = batch
        arrays = (images.float().numpy(), labels.numpy())
        out.append(arrays + (rest[0]["index"].numpy(), tuple(rest[0]["path"])) if rest else arrays)
    return out


def assert_same(ours: list[Any], theirs: list[Any]) -> None:
    assert len(ours) == len(theirs)
    for a, b in zip(as_arrays(ours), as_arrays(theirs), strict=True):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            if isinstance(x, np.ndarray):
                assert x.dtype == y.dtype and np.array_equal(x, y)
            else:
                assert x == y


@pytest.mark.parametrize("n", [1, 2, 3])
def test_an_epoch_on_n_actors_is_the_local_loaders_bit_for_bit(n: int, indexed_list: Path, workers_of: Any) -> None:
    local, remote = make(indexed_list), make(indexed_list, workers_of(n))
    for epoch in (0, 1):
        local.set_epoch(epoch)
        remote.set_epoch(epoch)
        assert_same(list(remote), list(local))


def test_float_output_with_normalize_is_bit_identical_and_uint8_transfer_is_within_a_level(
    indexed_list: Path, workers_of: Any
) -> None:
    local = list(make(indexed_list, transform=NORMALIZED, dtype="float32"))
    output = list(make(indexed_list, workers_of(2), transform=NORMALIZED, dtype="float32"))
    assert_same(output, local)
    for workers in (workers_of(1, transfer="uint8"),):
        shrunk = list(make(indexed_list, workers, transform=NORMALIZED, dtype="float32"))
        for (images, labels), (theirs, their_labels) in zip(shrunk, local, strict=True):
            assert images.dtype == theirs.dtype and images.shape == theirs.shape and images.is_contiguous()
            assert np.array_equal(labels.numpy(), their_labels.numpy())
            # one uint8 level over the smallest std, the most a rounding to uint8 before Normalize moves a value
            assert float((images - theirs).abs().max()) <= 1.0 / (255 * 0.224) + 1e-5
        same = list(make(indexed_list, workers, batch_size=7))
        assert_same(same, list(make(indexed_list, batch_size=7)))


def test_echo_columns_and_channels_last_are_as_local(indexed_list: Path, workers_of: Any) -> None:
    workers = workers_of(2)
    for options in ({"echo": 2, "columns": ("index", "path")}, {"echo": 2, "echo_mode": "batch"},
                    {"transform": NORMALIZED, "dtype": "float16", "layout": "channels_last"}):
        local, remote = list(make(indexed_list, **options)), list(make(indexed_list, workers, **options))
        assert_same(remote, local)
        if options.get("layout") == "channels_last":
            assert remote[0][0].stride() == local[0][0].stride()


def test_a_state_moves_between_a_ray_loader_and_a_local_one(indexed_list: Path, workers_of: Any) -> None:
    workers = workers_of(2)
    whole = list(make(indexed_list))
    remote = make(indexed_list, workers)
    it = iter(remote)
    head = [next(it) for _ in range(3)]
    state = remote.state_dict()
    local = make(indexed_list)
    local.load_state_dict(state)
    assert_same(head + list(local), whole)

    local = make(indexed_list)
    it = iter(local)
    head = [next(it) for _ in range(5)]
    remote = make(indexed_list, workers)
    remote.load_state_dict(local.state_dict())
    assert_same(head + list(remote), whole)
    assert remote.fingerprint() == local.fingerprint()


def test_actors_killed_mid_epoch_are_replaced_and_no_sample_is_lost_or_repeated(
    indexed_list: Path, workers_of: Any
) -> None:
    workers = workers_of(2)
    remote = make(indexed_list, workers, batch_size=3)
    expected = list(make(indexed_list, batch_size=3))
    it = iter(remote)
    got = [next(it) for _ in range(2)]
    pool = workers.pool()
    first, second = pool.actors
    os.kill(ray.get(first.pid.remote()), signal.SIGKILL)  # its process, as a crashed machine would lose it
    got.append(next(it))
    ray.kill(second)  # and the other through Ray
    got.extend(it)
    assert_same(got, expected)
    assert pool.actors[0] is not first and pool.actors[1] is not second


def corrupt_listing(root: Path) -> Path:
    """12 PNGs labelled by row; row 2 fails the header check, rows 5 and 9 fail inside DALI's decoder."""
    root.mkdir(parents=True, exist_ok=True)
    lines = ["path,label"]
    for i in range(12):
        buffer = io.BytesIO()
        pixels = np.random.default_rng(i).integers(0, 256, (14, 16, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(buffer, "JPEG" if i in (5, 9) else "PNG")
        data = bytearray(buffer.getvalue())
        if i in (5, 9):
            data[data.find(b"\xff\xc0") + 4] = 3  # a JPEG claiming 3-bit samples: passes the header check
        (root / f"{i:03d}.img").write_bytes(b"not an image" if i == 2 else bytes(data))
        lines.append(f"{i:03d}.img,{i}")
    (root / "list.csv").write_text("\n".join(lines) + "\n")
    return root / "list.csv"


def test_skipped_samples_are_replaced_as_locally(tmp_path: Path, workers_of: Any) -> None:
    source = corrupt_listing(tmp_path)
    workers = workers_of(2)
    options = {"batch_size": 4, "transform": [CenterCrop(8)], "on_error": "skip"}
    for epoch in (0, 1):
        local, remote = make(source, **options), make(source, workers, **options)
        local.set_epoch(epoch)
        remote.set_epoch(epoch)
        assert_same(list(remote), list(local))
        assert remote.skipped == local.skipped and len(local.skipped) == 3
    with pytest.raises(BadSampleError, match=r"002\.img \(sample 2\)"):
        list(make(source, workers, batch_size=4, transform=[CenterCrop(8)], shuffle=False))


def test_the_stage_clock_gets_the_actors_busy_time(indexed_list: Path, workers_of: Any) -> None:
    clock = StageClock()
    batches = list(make(indexed_list, workers_of(1), clock=clock))
    augment = clock.spans("augment")
    assert len(augment) == len(batches) and all(span.duration >= 0 for span in augment)
    assert {span.batch for span in augment} == set(range(len(batches)))
    assert clock.spans("input") and clock.spans("read")


def test_bad_worker_settings_are_refused_by_name(indexed_list: Path, ray_connected: str) -> None:
    with pytest.raises(ValueError, match="num_workers must be an int >= 1, got 0"):
        RayWorkers(num_workers=0)
    with pytest.raises(ValueError, match="transfer must be 'output' or 'uint8'"):
        RayWorkers(transfer="float")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="workers must be None or stallfree.RayWorkers"):
        make(indexed_list, workers=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"start_timeout must be seconds > 0 or None \(no bound\), got 0"):
        RayWorkers(start_timeout=0)
    with pytest.raises(ValueError, match="needs Normalize as the last step"):
        make(indexed_list, RayWorkers(transfer="uint8"), transform=[Normalize((0.5,), (0.5,)), CenterCrop(8)],
             dtype="float32")


def test_bench_ray_reports_costs_and_a_projection(image_folder: Path, ray_connected: str) -> None:
    from stallfree.bench import ray as bench_ray
    from stallfree.commands.bench import options

    args = options("ray", image_folder, workers=1, batch_size=4, batches=2, repeats=1, size=16)
    args.progress = False
    out = io.StringIO()
    results = bench_ray.run(args, out)
    assert results["ray"]["bytes_per_img"] == 16 * 16 * 3 * 4  # float32 output of a 16x16 crop
    assert results["ray"]["img_per_s"] > 0 and results["local"]["img_per_s"] > 0
    assert [row["workers"] for row in results["projected"]] == list(bench_ray.PROJECTED)
    assert "projected" in out.getvalue() and "Ray, 1 x 1 CPU (output)" in out.getvalue()

def test_a_cluster_that_is_not_there_is_named_quickly(indexed_list: Path, ray_connected: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once it is closed
    address = f"127.0.0.1:{port}"
    with pytest.raises(ValueError, match=f"connected to the Ray cluster at {ray_connected}"):
        list(make(indexed_list, RayWorkers(address=address)))
    ray.shutdown()  # the next test's ray_connected connects again
    started = time.monotonic()
    with pytest.raises(ConnectionError, match=f"no Ray cluster answers at {address}"):
        list(make(indexed_list, RayWorkers(address=address)))
    assert time.monotonic() - started < 30


def test_a_cluster_that_goes_away_mid_pass_is_named(indexed_list: Path, ray_connected: str) -> None:
    """A throwaway one-node cluster of this test's own: its head's processes and the actor killed mid-pass."""
    tmp_path = Path(tempfile.mkdtemp(prefix="sf-ray-"))  # short: Ray's socket paths must fit in 107 bytes
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"127.0.0.1:{port}"
    head = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "ray"), "start", "--head", f"--port={port}", "--num-cpus=1",
         "--include-dashboard=false", "--node-ip-address=127.0.0.1", f"--temp-dir={tmp_path}",
         "--disable-usage-stats", "--block"],
        stdout=(tmp_path / "head.log").open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        ray.shutdown()  # leaves the session's cluster; the next test's ray_connected connects again
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert head.poll() is None and time.monotonic() < deadline, (tmp_path / "head.log").read_text()[-2000:]
                time.sleep(0.2)
        workers = RayWorkers(address=address)
        it = iter(make(indexed_list, workers, batch_size=2))
        next(it)
        actor_pid = ray.get(workers.pool().actors[0].pid.remote())
        os.killpg(head.pid, signal.SIGKILL)  # the head's processes (GCS, raylet) ...
        os.kill(actor_pid, signal.SIGKILL)  # ... and the machine's worker: the whole cluster is gone
        with pytest.raises(ConnectionError, match=f"the Ray cluster at {address} went away"):
            list(it)
        assert not ray.is_initialized()
    finally:
        if head.poll() is None:
            os.killpg(head.pid, signal.SIGKILL)
        head.wait(10)
        shutil.rmtree(tmp_path, ignore_errors=True)


def test_without_a_cluster_a_local_one_is_started_as_ray_init_does(
    indexed_list: Path, ray_connected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing connected, no address, no RAY_ADDRESS: RayWorkers starts a local cluster (``ray.init()``) and gives
    the local Loader's batches there."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ray.shutdown()  # leaves the session's cluster; the next test's ray_connected connects again
    workers = RayWorkers(num_workers=1)
    try:
        ours = list(make(indexed_list, workers))
        assert ray.is_initialized() and ray.get_runtime_context().gcs_address != ray_connected
    finally:
        workers.close()
        ray.shutdown()
    assert_same(ours, list(make(indexed_list)))
