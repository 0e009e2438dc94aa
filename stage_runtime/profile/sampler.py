"""A psutil sampler in a background thread: per-core CPU, this process tree's CPU and RSS, disk read bytes."""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import psutil

__all__ = ["ResourceSample", "ResourceSampler"]


@dataclass(frozen=True)
class ResourceSample:
    """One sample; ``t`` is ``time.perf_counter()``, rates are over the interval since the previous sample."""

    t: float
    phase: str
    cpu_percent_per_core: list[float]
    process_cores: float  # CPU seconds per second used by this process and its children (workers)
    rss_bytes: int  # this process and its children
    disk_read_bytes_per_s: float  # the whole machine (psutil.disk_io_counters); 0.0 where it is unavailable


class ResourceSampler:
    """Samples resources every ``interval`` seconds while running; use it as a context manager.

    Args:
        interval: seconds between samples.
    """

    def __init__(self, interval: float = 0.1):
        if interval <= 0:
            raise ValueError(f"interval must be positive, got {interval}")
        self.interval = interval
        self.phase = ""
        self.samples: list[ResourceSample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc = psutil.Process()

    def _tree(self) -> list[psutil.Process]:
        try:
            return [self._proc, *self._proc.children(recursive=True)]
        except psutil.Error:
            return [self._proc]

    def _cpu_and_rss(self) -> tuple[float, int]:
        cpu, rss = 0.0, 0
        for proc in self._tree():
            try:
                times = proc.cpu_times()
                cpu += times.user + times.system
                rss += proc.memory_info().rss
            except psutil.Error:  # a worker that exited between listing and reading
                continue
        return cpu, rss

    @staticmethod
    def _disk_read() -> int:
        counters = psutil.disk_io_counters()
        return int(counters.read_bytes) if counters is not None else 0

    def _loop(self) -> None:
        psutil.cpu_percent(percpu=True)  # the first call only sets the reference point
        last_t, (last_cpu, _), last_disk = time.perf_counter(), self._cpu_and_rss(), self._disk_read()
        while not self._stop.wait(self.interval):
            now = time.perf_counter()
            cpu, rss = self._cpu_and_rss()
            disk = self._disk_read()
            dt = max(now - last_t, 1e-9)
            self.samples.append(ResourceSample(now, self.phase, list(psutil.cpu_percent(percpu=True)),
                                               max(0.0, (cpu - last_cpu) / dt), rss, max(0, disk - last_disk) / dt))
            last_t, last_cpu, last_disk = now, cpu, disk

    def start(self) -> ResourceSampler:
        """Start sampling in a daemon thread."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="stallfree-psutil", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling and wait for the thread."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def __enter__(self) -> ResourceSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def between(self, start: float, end: float) -> list[ResourceSample]:
        """The samples taken in ``[start, end]``."""
        return [s for s in self.samples if start <= s.t <= end]

    def to_dicts(self, origin: float = 0.0) -> list[dict[str, Any]]:
        """JSON-able samples with ``t`` in seconds from ``origin``."""
        return [{**asdict(s), "t": round(s.t - origin, 4)} for s in self.samples]
