"""RangeReadAhead: a read waits for its row's fetch in flight, and a step's rows arrive call by call."""

from __future__ import annotations

import threading

import numpy as np

from stallfree.pipeline.read_ahead import RangeReadAhead

SIZE = 100  # bytes per row; row r lies at r MiB in file r % 2, so no two rows are near enough to merge
MIB = 1 << 20


def _locate(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return rows % 2, rows * MIB, np.full(len(rows), SIZE)


def _bytes(row: int) -> bytes:
    return bytes([row % 256]) * SIZE


class _Store:
    """fetch() answers each range, but waits for ``release`` from its ``hold``-th call on."""

    def __init__(self, hold: int):
        self.calls: list[list[int]] = []
        self.hold, self.release = hold, threading.Event()

    def fetch(self, files: list[int], starts: list[int], ends: list[int]) -> list[bytes]:
        self.calls.append([s // MIB for s in starts])
        if len(self.calls) >= self.hold:
            assert self.release.wait(10)
        return [_bytes(s // MIB) for s in starts]


def test_a_read_waits_for_its_row_in_flight_instead_of_reading_it_again() -> None:
    store = _Store(hold=1)
    ahead = RangeReadAhead(_locate, store.fetch, budget=1 << 20, rows_per_step=8, ranges_per_fetch=8)
    rows = np.array([5, 2, 7, 0, 3, 1, 6, 4])
    ahead.follow(rows)
    while not store.calls:
        threading.Event().wait(0.01)
    threading.Timer(0.2, store.release.set).start()  # the fetch is in flight while the read asks for row 5
    assert ahead.take(5) == _bytes(5)
    assert [ahead.take(int(r)) for r in rows[1:]] == [_bytes(int(r)) for r in rows[1:]]
    assert ahead.hits == 8 and ahead.misses == 0 and len(store.calls) == 1
    ahead.close()


def test_rows_arrive_call_by_call_in_the_order_they_are_read() -> None:
    store = _Store(hold=2)  # the second call of the step blocks until released
    ahead = RangeReadAhead(_locate, store.fetch, budget=1 << 20, rows_per_step=6, ranges_per_fetch=2)
    rows = np.array([9, 4, 1, 8, 3, 6])
    ahead.follow(rows)
    assert ahead.take(9) == _bytes(9) and ahead.take(4) == _bytes(4)  # the first call's rows, the second blocked
    assert store.calls[0] == [9, 4]  # fetched in stream order, not by file and offset
    store.release.set()
    assert [ahead.take(int(r)) for r in rows[2:]] == [_bytes(int(r)) for r in rows[2:]]
    assert ahead.misses == 0 and store.calls[1:] == [[1, 8], [3, 6]]
    ahead.close()


def test_a_read_gives_up_waiting_after_wait_seconds() -> None:
    store = _Store(hold=1)  # never released: a store that does not answer
    ahead = RangeReadAhead(_locate, store.fetch, budget=1 << 20, rows_per_step=4, wait=0.2)
    ahead.follow(np.arange(4))
    while not store.calls:
        threading.Event().wait(0.01)
    assert ahead.take(0) is None and ahead.misses == 1  # the read goes to the store itself, which raises in time
    store.release.set()
    ahead.close()
