"""WebDataset tars read in place: ``Loader("path/or/url/train-{000000..000099}.tar", ...)``, without ingest.

The source is a tar's path or URL (``s3://``, ``gs://``, ``http(s)://``, ``file://``), or a pattern of them with
brace ranges (:func:`expand`). Each tar is indexed once: its member headers are walked (locally through the file;
remotely in 1 MiB ranged reads that seek over large members) and grouped into samples by
:func:`stallfree.ingest.tars.samples`, the grouping ``stallfree ingest`` uses, so the two accept and refuse the
same members. The index is kept in the index cache (:mod:`~stallfree.pipeline.tar_index`): a tar that changed is
walked again. After that, a sample is one ranged
read (a local ``seek`` + ``read``, or a ranged GET), retried on transient failures. At a URL, the rows the sampler
reads next are fetched ahead into memory (:class:`~stallfree.pipeline.read_ahead.RangeReadAhead`): their ranges
sorted by tar and offset and merged where close, ``downloads`` requests in flight
(:func:`~stallfree.ingest.fetch.fetch_ranges`), so a block shuffle costs a few large requests per stretch of rows and
a global one many small concurrent ones. A tar whose server ignores Range is fetched whole, once, and read on local
disk (:mod:`~stallfree.pipeline.whole_tars`).

The sampler, shuffle (``shuffle="block"`` takes a tar as a shard), resume and error rules are the Loader's, as for
any source. A compressed or damaged tar (a header that does not parse, a member whose data runs past the tar's
end) is a ``ValueError`` naming the tar and member; a refused sample (no image or no ``.cls``, a label that is not
a class number by ingest's rule (:func:`stallfree.ingest.labels.parse_label`), a member name found twice, a link,
``..`` or an absolute name) is a ``ValueError`` under ``on_error="raise"`` and left out with a warning under
``on_error="skip"`` (:attr:`WebDatasetReader.rejected` lists them).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import re
import threading
import urllib.parse
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from stallfree.ingest.fetch import Ignored, Stopped, fetch_ranges
from stallfree.ingest.labels import class_numbers
from stallfree.ingest.remote import RangeIgnored, Retry, is_url, open_store, read_range, redact, retried
from stallfree.pipeline import tar_index
from stallfree.pipeline.read_ahead import RangeReadAhead
from stallfree.pipeline.reader_base import BaseReader, Sample
from stallfree.pipeline.whole_tars import WholeTars

__all__ = ["WebDatasetReader", "expand", "is_webdataset"]

_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"(\d+)\.\.(\d+)")
_MAX_TARS = 1_000_000
#: What says a remote tar changed, by client (s3fs, gcsfs, fsspec's HTTP), in order of preference.
_STAMPS = ("ETag", "etag", "Last-Modified", "LastModified", "mtime", "updated")
_READ_AHEAD = 64 << 20  # bytes of coming samples a remote reader holds in memory, by default


def is_webdataset(source: Any) -> bool:
    """Whether ``source`` is a string or path naming WebDataset tars: a ``{a..b}`` range, or ending in ``.tar``."""
    if not isinstance(source, (str, os.PathLike)):
        return False
    text = os.fspath(source)
    if not isinstance(text, str):
        return False
    path = urllib.parse.urlsplit(text).path if is_url(text) else text
    return bool(_BRACE.search(text)) or path.lower().endswith(".tar")


def expand(pattern: str) -> list[str]:
    """Every name of a brace pattern, in order: ``a-{00..02}.tar`` gives ``a-00.tar``, ``a-01.tar``, ``a-02.tar``.

    A range keeps the first number's width (``{000000..000099}`` gives six digits; ``{1..10}`` none); several
    ranges give every combination, the last varying fastest. A pattern without braces is one name.

    Raises:
        ValueError: a brace that is not ``{first..last}`` of digits, a range that runs backwards, an unmatched
            brace, or more than a million names.
    """
    texts: list[str] = []
    ranges: list[tuple[int, int, int]] = []  # first, last, width
    last = 0
    for match in _BRACE.finditer(pattern):
        texts.append(pattern[last : match.start()])
        numbers = _RANGE.fullmatch(match[1])
        if numbers is None:
            raise ValueError(f"WebDataset pattern {redact(pattern)!r}: {match[0]!r} is not a range; write "
                             "{first..last} with digits, e.g. train-{000000..000099}.tar")
        first, end = int(numbers[1]), int(numbers[2])
        if first > end:
            raise ValueError(f"WebDataset pattern {redact(pattern)!r}: the range {match[0]} runs backwards; write "
                             f"{{{numbers[2]}..{numbers[1]}}}")
        ranges.append((first, end, len(numbers[1])))
        last = match.end()
    texts.append(pattern[last:])
    if any("{" in text or "}" in text for text in texts):
        raise ValueError(f"WebDataset pattern {redact(pattern)!r} has an unmatched or nested brace; write "
                         "{first..last} with digits, e.g. train-{000000..000099}.tar")
    count = math.prod(end - first + 1 for first, end, _ in ranges)
    if count > _MAX_TARS:
        raise ValueError(f"WebDataset pattern {redact(pattern)!r} names {count} tars, over {_MAX_TARS}; are the "
                         "ranges right?")
    choices = [[str(n).zfill(width) for n in range(first, end + 1)] for first, end, width in ranges]
    return ["".join(itertools.chain.from_iterable(zip(texts, (*chosen, ""), strict=True)))
            for chosen in itertools.product(*choices)]


@dataclass
class _Tar:
    """One tar: where it is (``fs`` None for a local file), how it is shown in messages, and its samples' keys.

    Its samples' offsets, sizes and labels are rows ``first:first + len(keys)`` of the reader's arrays; ``size``
    and ``stamp`` (ETag or modification time) are what its index was checked against.
    """

    location: str
    shown: str
    fs: Any
    path: str
    keys: list[str]
    first: int
    size: int
    stamp: str


class WebDatasetReader(BaseReader):
    """Samples of WebDataset tars read in place (the :class:`~stallfree.pipeline.readers.Reader` protocol).

    Rows are the tars' samples in the pattern's order, each tar's in member order (the order ``stallfree ingest``
    gives the same tars).

    Args:
        source: a tar's path or URL, or a pattern of them (:func:`expand`).
        cache_dir: where the tars' indexes are kept (default
            :func:`~stallfree.pipeline.tar_index.default_index_dir`).
        storage_options: passed to the fsspec file system of a URL (credentials, ``endpoint_url``...).
        retry: how remote requests are retried, and their timeout.
        on_error: ``"raise"``: a refused sample is a ValueError; ``"skip"``: it is left out, with a warning.
        downloads: tars at a URL: ranged requests in flight at once, for the read-ahead (under a global shuffle
            each is one sample, so they bound the rate at ``downloads`` / the store's latency).
        read_ahead: tars at a URL: bytes of coming samples fetched ahead and held in memory (default 64 MiB).
        cache_limit: tars at a URL whose server ignores Range are fetched whole to local disk
            (:mod:`~stallfree.pipeline.whole_tars`): the bytes they may hold there (``None``: no limit).

    Raises:
        FileNotFoundError: a tar does not exist (named).
        ValueError: a malformed pattern, a compressed or damaged tar, a refused sample under ``on_error="raise"``,
            or tars that hold no sample.
        RemoteStoreError: the store did not answer.
    """

    encoded = True
    columns: Sequence[str] = ()

    def __init__(self, source: str | os.PathLike[str], *, cache_dir: str | os.PathLike[str] | None = None,
                 storage_options: dict[str, Any] | None = None, retry: Retry | None = None,
                 on_error: Literal["raise", "skip"] = "raise", downloads: int = 64, read_ahead: int | None = None,
                 cache_limit: int | None = None):
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        super().__init__()
        self.reopen_with(source, cache_dir=cache_dir, storage_options=storage_options, retry=retry,
                         on_error=on_error, downloads=downloads, read_ahead=read_ahead, cache_limit=cache_limit)
        self.pattern = os.fspath(source)
        self.retry = retry or Retry()
        self.cache_limit, self.downloads = cache_limit, downloads
        self._whole: WholeTars | None = None  # made when a tar's server is found to ignore Range
        self._whole_lock = threading.Lock()
        self._ranged: set[str] = set()  # tars seen to answer a ranged request (the read-ahead asks them freely)
        self.index_dir = Path(cache_dir) if cache_dir is not None else tar_index.default_index_dir()
        self.walked = 0  # tars whose headers were walked, not loaded from the index cache (for tests)
        self.rejected: list[dict[str, str]] = []  # the samples left out under on_error="skip"
        self._options = storage_options or {}
        self._tars: list[_Tar] = []
        indexes = [self._tar(location) for location in _progress(expand(self.pattern))]
        if self.rejected and on_error == "raise":
            first = self.rejected[0]
            raise ValueError(f"{first['path']}: {first['reason']} ({len(self.rejected)} sample(s) refused in "
                             f"{redact(self.pattern)}); pass on_error='skip' to leave them out")
        if self.rejected:
            first = self.rejected[0]
            warnings.warn(f"{len(self.rejected)} sample(s) of {redact(self.pattern)} left out (on_error='skip'), "
                          f"the first {first['path']}: {first['reason']}", UserWarning, stacklevel=2)
        counts = [len(t.keys) for t in self._tars]
        self._count = sum(counts)
        if len(self) == 0:
            raise ValueError(f"no WebDataset samples (.jpg/.png + .cls) in {redact(self.pattern)}")
        # One array per field for all tars' samples, indexed by row: what the read-ahead and a read look up.
        self._offsets = np.concatenate([np.asarray(i["offsets"], np.int64) for i in indexes])
        self._sizes = np.concatenate([np.asarray(i["sizes"], np.int64) for i in indexes])
        self._labels = np.concatenate([np.asarray(i["labels"], np.int64) for i in indexes])
        self._tar_of = np.repeat(np.arange(len(self._tars)), counts)
        self.classes = class_numbers(self._labels)
        remote = any(t.fs is not None for t in self._tars)
        self.read_ahead = RangeReadAhead(self._ranges, self._fetch_ranges, read_ahead or _READ_AHEAD,
                                         rows_per_step=8 * downloads, ranges_per_fetch=downloads,
                                         wait=self.retry.timeout) if remote else None

    def _tar(self, location: str) -> dict[str, Any]:
        """The tar's index (walked once, then loaded from the index cache); the tar joins ``self._tars``."""
        if is_url(location):
            fs, path = open_store(location, self._options, self.retry.timeout)  # fsspec reuses one client
            shown = redact(location)
        else:
            fs, path = None, location
            shown = os.path.abspath(location)
        size, stamp = self._stat(fs, path, shown)
        index = tar_index.load(self.index_dir, shown, size, stamp)
        if index is None:
            if fs is None:
                with open(path, "rb") as f:
                    index = tar_index.walk(f, shown, size)
            else:
                try:
                    index = tar_index.walk_remote(fs, path, shown, size, self.retry)  # each range retried
                except RangeIgnored:  # the tar is fetched whole, once, and walked on local disk
                    with self._whole_tars().opened(fs, path, shown, size, stamp) as f:
                        index = tar_index.walk(f, shown, size)
            self.walked += 1
            tar_index.save(self.index_dir, index, shown, size, stamp)
        self.rejected += index["refused"]
        first = self._tars[-1].first + len(self._tars[-1].keys) if self._tars else 0
        self._tars.append(_Tar(location, shown, fs, path, list(index["keys"]), first, size, stamp))
        return index

    def _whole_tars(self) -> WholeTars:
        """Where tars whose server ignores Range are fetched whole (made on first need)."""
        with self._whole_lock:  # the reads' threads and the read-ahead's may meet the server at once
            if self._whole is None:
                self._whole = WholeTars(self.index_dir, self.cache_limit, self.retry, min(self.downloads, 8))
            return self._whole

    def _asks_whole(self, tar: _Tar) -> bool:
        """Whether ``tar``'s server ignored Range (its samples are read from the whole tar from then on)."""
        return self._whole is not None and tar.path in self._whole.no_range

    def _stat(self, fs: Any, path: str, shown: str) -> tuple[int, str]:
        """The tar's size and what says it changed: its modification time, or the store's ETag."""
        try:
            if fs is None:
                stat = os.stat(path)
                return stat.st_size, str(stat.st_mtime_ns)
            info = retried(lambda: fs.info(path), shown, self.retry)
        except FileNotFoundError:
            raise FileNotFoundError(f"WebDataset tar {shown} does not exist (from {redact(self.pattern)})") from None
        if info.get("size") is None:
            raise ValueError(f"{shown}: the store gives no size for it (no Content-Length), so its members cannot be "
                             "read by range; serve it with one, or ingest the tars")
        stamp = next((str(info[k]) for k in _STAMPS if info.get(k)), "")
        return int(info["size"]), stamp

    def __len__(self) -> int:
        return self._count

    def labels(self) -> np.ndarray:
        """Every sample's label (from its ``.cls``), int64."""
        return self._labels

    def shard_rows(self) -> list[int]:
        """Samples per tar, in order (the shards of ``shuffle="block"``)."""
        return [len(t.keys) for t in self._tars]

    def _locate(self, index: int) -> tuple[_Tar, int]:
        """Row ``index``'s tar and its place among the tar's samples."""
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} out of range for {len(self)} samples in {redact(self.pattern)}")
        tar = self._tars[int(self._tar_of[index])]
        return tar, index - tar.first

    def read(self, index: int) -> Sample:
        """Row ``index``'s fields: ``{"image": ...}`` (:meth:`read_image`)."""
        return {"image": self.read_image(index)}

    def read_image(self, index: int) -> np.ndarray:
        """Sample ``index``'s image bytes: one ranged read of its member.

        A tar whose server ignores Range is read from its whole copy (:mod:`~stallfree.pipeline.whole_tars`).

        Raises:
            OSError: the tar cannot be read, or ends inside the member (it changed since it was indexed).
            RemoteStoreError: the store did not answer, or refused or lacks the tar; a tar that must be read whole
                and is larger than ``cache_limit``.
        """
        ahead = self.read_ahead.take(index) if self.read_ahead is not None else None
        if ahead is not None:
            return np.frombuffer(ahead, np.uint8)
        tar, row = self._locate(index)
        offset, size = int(self._offsets[index]), int(self._sizes[index])
        if tar.fs is None:
            with open(tar.path, "rb") as f:
                f.seek(offset)
                data = f.read(size)
        elif self._asks_whole(tar):
            data = self._whole_tars().read(tar.fs, tar.path, tar.shown, tar.size, tar.stamp, offset, size)
        else:
            try:
                data = read_range(tar.fs, tar.path, tar.shown, offset, offset + size, self.retry)
            except RangeIgnored:
                data = self._whole_tars().read(tar.fs, tar.path, tar.shown, tar.size, tar.stamp, offset, size)
        if len(data) != size:
            raise OSError(f"{tar.shown}:{tar.keys[row]}: the tar ends inside this member ({len(data)} of its {size} "
                          "bytes): it changed since it was indexed")
        return np.frombuffer(data, np.uint8)

    def follow(self, rows: np.ndarray) -> None:
        """The rows this rank reads next, in order: tars at a URL have them fetched ahead (by range, merged)."""
        if self.read_ahead is not None:
            self.read_ahead.follow(rows)

    def close(self) -> None:
        """Stop the read-ahead and drop what it holds."""
        if self.read_ahead is not None:
            self.read_ahead.close()

    def _ranges(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each row's tar number, image offset and size."""
        return self._tar_of[rows], self._offsets[rows], self._sizes[rows]

    def _fetch_ranges(self, tars: list[int], starts: list[int], ends: list[int]) -> list[Any]:
        """The ranges' bytes (or the exception that ended each), ``downloads`` requests at a time per store.

        A tar whose server ignored Range is not asked (its rows are read from the whole tar). A tar not yet seen to
        answer a range is asked one range first, alone: a server that ignores Range then costs one request (closed
        by :func:`~stallfree.ingest.fetch.fetch_ranges` before its body), not one per range in flight.
        """
        answers: list[Any] = [None] * len(tars)
        probes: dict[str, int] = {}  # the first range of each tar not yet seen to answer one
        for i, t in enumerate(tars):
            if self._tars[t].path not in self._ranged:
                probes.setdefault(self._tars[t].path, i)
        first = set(probes.values())
        for chosen in (sorted(first), [i for i in range(len(tars)) if i not in first]):
            by_store: dict[int, list[int]] = {}
            for i in chosen:
                if not self._asks_whole(self._tars[tars[i]]):
                    by_store.setdefault(id(self._tars[tars[i]].fs), []).append(i)
            for group in by_store.values():
                fs = self._tars[tars[group[0]]].fs
                try:
                    got = fetch_ranges(fs, [self._tars[tars[i]].path for i in group], [starts[i] for i in group],
                                       [ends[i] for i in group], self.retry.pace, self.downloads)
                except Stopped:  # the program is exiting
                    return answers
                for i, data in zip(group, got, strict=True):
                    answers[i] = data
                    if isinstance(data, Ignored):
                        self._whole_tars().no_range.add(self._tars[tars[i]].path)
                    elif isinstance(data, bytes):
                        self._ranged.add(self._tars[tars[i]].path)
        return answers

    def describe(self, index: int) -> str:
        """``<tar>:<key>``: the tar's path or (redacted) URL and the sample's key."""
        tar, row = self._locate(index)
        return f"{tar.shown}:{tar.keys[row]}"

    def column(self, name: str, rows: np.ndarray) -> np.ndarray | list[Any]:
        raise KeyError(f"no column {name!r} in WebDataset tars {redact(self.pattern)}: only ingested shards carry "
                       "extra columns")

    def fingerprint(self) -> str:
        """The tars' names, and their samples' keys, sizes and labels, hashed: the same wherever the tars lie."""
        digest = hashlib.sha256()
        for tar in self._tars:
            rows = slice(tar.first, tar.first + len(tar.keys))
            digest.update(f"{tar.shown.rsplit('/', 1)[-1]}\0{chr(0).join(tar.keys)}\0".encode())
            digest.update(self._sizes[rows].tobytes())
            digest.update(self._labels[rows].tobytes())
        return digest.hexdigest()


def _progress(locations: list[str]) -> Any:
    """The tars, with a progress bar on stderr while they are indexed (a terminal only, and from 8 tars on)."""
    from tqdm import tqdm

    return tqdm(locations, desc="indexing tars", unit="tar", disable=None if len(locations) >= 8 else True,
                leave=False)
