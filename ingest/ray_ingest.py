"""``stallfree ingest SRC OUT --ray``: the N parts of a split ingest as Ray tasks, then their merge.

A split ingest (``--part i/N`` on each part, then ``--merge``) already holds a one-part ingest's samples, labels,
bytes and rejections in the same order (:mod:`~stallfree.ingest.merge`); Ray only runs its parts at once, on a
cluster's CPUs. Each task is :func:`~stallfree.ingest.runner.ingest` of one part, so what a part does holds here
too: it locks its own part of ``OUT``, resumes after the shards it finished, and uploads to a URL ``OUT`` itself::

    driver: connect ─► N tasks, one per part ───────────────────────────► merge(OUT) ─► manifest.json
                         task i: ingest(SRC, OUT, part=(i, N))
                           └ a thread sums its finished shards' samples ─► progress actor ─► the driver's bar

Faults. A task whose process dies (killed, out of memory, its node lost) is run again by Ray (``max_retries``) and
resumes after the part's finished shards. Inside a task, an ``OSError`` (a network file system's hiccup), a store
whose retries were spent, or the part's lock still held (by the task of a driver killed a moment ago, which Ray is
stopping) are tried again after a pause (``tries``, ``backoff``); a full disk and a bad source are not. A part that
keeps failing stops the ingest with :class:`PartFailed`, naming the part; the parts done are kept, and the same call
resumes (a finished part only lists its share again, then finds every shard done).

SRC, and OUT unless it is a URL, must be on storage every node sees at the same path (a network file system); the
driver merges, so it sees OUT too.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from stallfree.core.ray_cluster import connect
from stallfree.ingest.lock import FolderLocked
from stallfree.ingest.manifest import shard_name
from stallfree.ingest.merge import merge
from stallfree.ingest.remote import RemoteStoreError, is_url, redact
from stallfree.ingest.runner import DiskFull, ingest
from stallfree.ingest.shard_plan import plan_name
from stallfree.ingest.upload import default_staging
from stallfree.ingest.writer import RECORDS, IngestOptions

__all__ = ["PartFailed", "ingest_on_ray"]

_log = logging.getLogger(__name__)

#: What a task tries again after a pause: passing faults of storage, and a lock a stopping task still holds.
_TRANSIENT = (OSError, FolderLocked, RemoteStoreError)


class PartFailed(RuntimeError):
    """A part of an ingest on Ray failed every try; the message names the part and why. The parts done are kept."""


def ingest_on_ray(
    source: str | os.PathLike[str],
    out: str | os.PathLike[str],
    options: IngestOptions = IngestOptions(),  # noqa: B008 - frozen, so a shared default is safe
    *,
    parts: int | None = None,
    address: str | None = None,
    cpus_per_task: int = 1,
    tries: int = 3,
    backoff: float = 1.0,
    max_retries: int = 3,
    progress: bool = False,
    staging: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Ingest ``source`` into ``out`` as ``parts`` Ray tasks, one per ``--part i/N``, then merge them into ``out``.

    The result equals :func:`~stallfree.ingest.runner.ingest`'s of one part (samples, labels, bytes, rejections, in
    the same order); only where shards begin and end differs.

    Args:
        source: as :func:`~stallfree.ingest.runner.ingest` takes it, at the same path on every node.
        out: the output folder, at the same path on every node (a network file system), or a URL.
        options: what to check and convert.
        parts: how many parts (tasks). By default the split ``out`` holds (a finished or unfinished ingest's, so that
            a rerun resumes it), else the cluster's CPUs divided by ``cpus_per_task``. One part is a one-part ingest,
            with nothing to merge.
        address: the cluster, used when this process is not connected to one (``ray.init`` not called): an
            address (``HOST:PORT``, ``ray://HOST:PORT``), else ``RAY_ADDRESS``, else a local cluster started here.
        cpus_per_task: the CPUs each task asks Ray for; its ingest converts with that many processes.
        tries: how often a task tries its part when it meets a passing fault (see the module's docstring).
        backoff: seconds before a task's second try, doubled for each one after.
        max_retries: how often Ray runs a task again whose process died.
        progress: a progress bar on stderr, counting the samples of every task's finished shards.
        staging: for a URL ``out``: each node's local folder for the shards before upload (default: one per part
            in the node's stallfree cache).
        storage_options: for a URL ``out``: the fsspec file system's options.

    Returns:
        The merged dataset's counts (``images``, ``rejected``, ``shards``, ``parts``), the shards written and
        resumed, sizes, rates, the cluster's ``address``, and each part's own summary (with its ``tries``).

    Raises:
        ImportError: Ray is not installed.
        ValueError: bad arguments (named), or a cluster without the CPUs one task asks for.
        PartFailed: a part failed every try (named); the parts done are kept, so the same call resumes.
        DiskFull: a part's disk filled up (the message names the part, the space needed and free).
        ConnectionError: no cluster answers at ``address``.
    """
    if parts is not None and (not isinstance(parts, int) or parts < 1):
        raise ValueError(f"parts must be an int >= 1, got {parts!r}")
    for name, value in (("cpus_per_task", cpus_per_task), ("tries", tries)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if not isinstance(max_retries, int) or max_retries < 0:
        raise ValueError(f"max_retries must be an int >= 0, got {max_retries!r}")
    if backoff < 0:
        raise ValueError(f"backoff must be >= 0 seconds, got {backoff!r}")
    if is_url(source):
        raise ValueError(f"SRC must be a path every node sees, got the URL {redact(str(source))}: download it first")
    remote = is_url(out)
    if not remote and (staging is not None or storage_options is not None):
        raise ValueError(f"staging= and storage_options= apply to an OUT at a URL (s3://, gs://, file://), but OUT "
                         f"is {str(out)!r}; drop them")
    # a task's working directory is not this process's: every path goes as an absolute one
    source_path = os.path.abspath(source)
    target = str(out) if remote else os.path.abspath(out)
    stage = os.path.abspath(staging) if staging is not None else None
    ray = _import_ray()
    _, started_here = connect(address, who="ingest_on_ray", log_to_driver=True)
    try:
        count = parts or _split_in(target) or _cluster_parts(ray, cpus_per_task)
        _check_cpus(ray, cpus_per_task)
        started = time.perf_counter()
        summaries = _run_parts(ray, source_path, target, options, count, cpus_per_task, tries, backoff, max_retries,
                               progress, stage, storage_options)
        if count == 1:  # a one-part ingest writes the whole dataset's manifest itself: nothing to merge
            merged = {**{k: summaries[0][k] for k in ("images", "rejected", "shards")}, "parts": 1}
        else:
            merged = merge(target, storage_options=storage_options) if remote else merge(target)
        where = ray.get_runtime_context().gcs_address
    finally:
        if started_here:
            ray.shutdown()
    return _summary(merged, summaries, time.perf_counter() - started, where)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as err:
        raise ImportError("ingest on Ray needs Ray: pip install 'stallfree[ray]' (on every node of the cluster "
                          "too)") from err
    return ray


def _split_in(out: str) -> int | None:
    """The ``N`` of the ingest an unfinished local ``out`` holds (so that a rerun resumes it), else None."""
    if is_url(out):
        return None
    records = Path(out, RECORDS)
    found = {1} if (records / plan_name((0, 1))).is_file() else set()
    for path in records.glob("plan.part-*.json"):
        part = json.loads(path.read_text()).get("part")
        if isinstance(part, list) and len(part) == 2 and path.name == plan_name((part[0], part[1])):
            found.add(int(part[1]))
    return found.pop() if len(found) == 1 else None  # several: the part's own check refuses the mix, naming it


def _cluster_parts(ray: Any, cpus_per_task: int) -> int:
    return max(1, int(ray.cluster_resources().get("CPU", 0)) // cpus_per_task)


def _check_cpus(ray: Any, cpus_per_task: int) -> None:
    """Refuse tasks no node could run (Ray would wait for such a node for ever)."""
    largest = max((node["Resources"].get("CPU", 0) for node in ray.nodes() if node["Alive"]), default=0)
    if cpus_per_task > largest:
        raise ValueError(f"each task asks for {cpus_per_task} CPUs (--workers), but the largest node of the Ray "
                         f"cluster has {largest:g}; ask for {int(largest) or 1} or fewer")


class _Progress:
    """A Ray actor the tasks report to: each part's samples in finished shards, and each failed try."""

    def __init__(self, parts: int):
        self._done = [0] * parts
        self._failures: list[tuple[int, int, str]] = []

    def shards(self, part: int, samples: int) -> None:
        self._done[part] = samples

    def failed(self, part: int, attempt: int, error: str) -> None:
        self._failures.append((part, attempt, error))

    def read(self, seen: int) -> tuple[list[int], list[tuple[int, int, str]]]:
        """Every part's samples done, and the failed tries after the first ``seen``."""
        return list(self._done), self._failures[seen:]


class _Reporter:
    """A thread in a task that sends its part's samples in finished shards (their records) to the progress actor."""

    def __init__(self, folder: Path, part: tuple[int, int], counter: Any, interval: float = 0.5):
        self._records = folder / RECORDS
        self._pattern = shard_name(0, part).removesuffix("00000.arrow") + "*.json"
        self._part = part[0]
        self._counter = counter
        self._interval = interval
        self._seen: dict[str, int] = {}
        self._sent = -1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stallfree-ray-progress", daemon=True)

    def __enter__(self) -> _Reporter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._send()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._send()

    def _send(self) -> None:
        for path in self._records.glob(self._pattern):  # written whole (renamed into place), never changed
            if path.name not in self._seen:
                try:
                    record = json.loads(path.read_text())
                except FileNotFoundError:  # the folder of a URL's part, removed once uploaded
                    continue
                self._seen[path.name] = int(record["rows"]) + len(record["rejected"])
        done = sum(self._seen.values())
        if done != self._sent:
            self._counter.shards.remote(self._part, done)
            self._sent = done


def _ingest_part(source: str, out: str, options: IngestOptions, part: tuple[int, int], workers: int, tries: int,
                 backoff: float, staging: str | None, storage_options: dict[str, Any] | None,
                 counter: Any) -> dict[str, Any]:
    """One Ray task: ingest ``part``, trying again after a pause on a passing fault; its summary and ``tries``."""
    url = is_url(out)
    folder = Path(staging) if staging else default_staging(out, storage_options, part) if url else Path(out)
    extra: dict[str, Any] = {"staging": staging, "storage_options": storage_options} if url else {}
    with _Reporter(folder, part, counter):
        for attempt in range(1, tries + 1):
            try:
                summary = ingest(source, out, options, workers=workers, part=part, **extra)
            except DiskFull as err:  # not tried again: the same disk is still full; the message says what to free
                # as a plain OSError: DiskFull's own arguments do not survive the pickling that carries it home
                raise OSError(errno.ENOSPC, str(err)) from None
            except _TRANSIENT as err:
                if attempt == tries:
                    raise
                counter.failed.remote(part[0], attempt, f"{type(err).__name__}: {err}")
                time.sleep(backoff * 2 ** (attempt - 1))
            else:
                return {**summary, "tries": attempt}
    raise AssertionError("unreachable: the last try returns or raises")


def _run_parts(ray: Any, source: str, out: str, options: IngestOptions, count: int, cpus: int, tries: int,
               backoff: float, max_retries: int, progress: bool, staging: str | None,
               storage_options: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Run the ``count`` parts as tasks; their summaries in part order. Raises :class:`PartFailed`."""
    from tqdm import tqdm

    counter = ray.remote(num_cpus=0)(_Progress).remote(count)
    task = ray.remote(_ingest_part)
    pending = {
        task.options(num_cpus=cpus, max_retries=max_retries, retry_exceptions=False,
                     name=f"stallfree-ingest-part-{i}-of-{count}").remote(
            source, out, options, (i, count), cpus, tries, backoff, staging, storage_options, counter): i
        for i in range(count)
    }
    summaries: dict[int, dict[str, Any]] = {}
    failures = 0
    bar = tqdm(total=None, unit="img", file=sys.stderr, disable=not progress, dynamic_ncols=True,
               desc=f"ingest, {count} parts on Ray", smoothing=0.1)
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0.5)
            for ref in ready:
                index = pending.pop(ref)
                try:
                    summaries[index] = ray.get(ref)
                except ray.exceptions.RayError as err:
                    raise _failed(ray, err, (index, count), tries, max_retries, source, out) from err
            done, failed = ray.get(counter.read.remote(failures))
            for part, attempt, error in failed:
                _log.warning("part %d/%d: try %d of %d failed (%s); trying again in %.1f s", part, count, attempt,
                             tries, error, backoff * 2 ** (attempt - 1))
            failures += len(failed)
            bar.update(sum(done) - bar.n)
            bar.set_postfix_str(f"{len(summaries)}/{count} parts done")
        bar.total = bar.n
    finally:
        for ref in pending:  # a part failed, or this process was interrupted: stop the others
            ray.cancel(ref)
        bar.close()
        ray.kill(counter)
    return [summaries[i] for i in range(count)]


def _failed(ray: Any, err: Exception, part: tuple[int, int], tries: int, max_retries: int, source: str,
            out: str) -> Exception:
    """The error that stops the ingest when ``part``'s task failed with ``err``: :class:`PartFailed`, or DiskFull."""
    index, count = part
    if isinstance(err, ray.exceptions.RayTaskError):
        cause = err.cause
        if isinstance(cause, OSError) and cause.errno == errno.ENOSPC:
            return DiskFull(f"part {index}/{count}: {cause.strerror}")
        how = f" after {tries} tr{'ies' if tries > 1 else 'y'}" if isinstance(cause, _TRANSIENT) else ""
        why = f"{type(cause).__name__}: {cause}"
    elif isinstance(err, ray.exceptions.WorkerCrashedError | ray.exceptions.NodeDiedError):
        how = f" {max_retries + 1} times (max_retries={max_retries})"
        why = "its worker process died (killed, out of memory, or its node lost)"
    else:
        how, why = "", f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"
    shown = redact(out) if is_url(out) else out
    return PartFailed(f"part {index}/{count} of the ingest of {source} into {shown} failed{how}: {why}; the parts "
                      "done are kept: run the same command again to resume")


def _summary(merged: dict[str, Any], parts: list[dict[str, Any]], seconds: float, address: str) -> dict[str, Any]:
    """The merged dataset's counts, with what the parts wrote this run and how fast."""
    written_images = sum(p["images_per_s"] * p["seconds"] for p in parts)
    read_mb = sum(p["mb_per_s"] * p["seconds"] for p in parts)
    summary = {
        "images": merged["images"],
        "rejected": merged["rejected"],
        "shards": merged["shards"],
        "parts": merged["parts"],
        "written_shards": sum(p["written_shards"] for p in parts),
        "resumed_shards": sum(p["resumed_shards"] for p in parts),
        "source_mb": sum(p["source_mb"] for p in parts),
        "shard_mb": sum(p["shard_mb"] for p in parts),
        "seconds": seconds,
        "images_per_s": written_images / seconds if seconds else 0.0,
        "mb_per_s": read_mb / seconds if seconds else 0.0,
        "address": address,
        "part_summaries": parts,
    }
    if parts and "url" in parts[0]:
        summary.update(url=parts[0]["url"], uploaded_shards=sum(p["uploaded_shards"] for p in parts),
                       stored_shards=sum(p["stored_shards"] for p in parts))
    return summary
