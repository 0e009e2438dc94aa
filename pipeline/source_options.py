"""How the Loader reads its source: checksums, and for data at a URL, the cache and the requests (docs/remote.md).

One frozen part of the Loader's options (:mod:`.options`). Which of its fields apply depends on the source, which is
known only when it is opened: an ingested dataset at a URL takes them all; WebDataset tars take the index cache,
and at a URL the store's options, the requests' bounds and ``cache_limit`` (for a tar a server will only send
whole); a local source takes none, and a field set for a source it does not apply to is refused by name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

from stallfree.ingest.remote import Retry
from stallfree.pipeline.arguments import is_int
from stallfree.pipeline.shards import VERIFY_MODES, Verify

__all__ = ["SourceOptions"]

#: The fields a WebDataset source takes at a URL (its tars are read by range: no shard cache to size, but a tar a
#: server sends only whole is held within ``cache_limit``).
_WEBDATASET = ("cache_dir", "cache_limit", "storage_options", "retries", "remote_timeout", "remote_min_rate",
               "remote_rate_window", "downloads", "read_ahead")


@dataclass(frozen=True)
class SourceOptions:
    """The Loader's ``verify`` and remote keywords (see :class:`~stallfree.pipeline.loader.Loader` for each)."""

    verify: Verify = "first-use"
    cache_dir: str | os.PathLike[str] | None = None
    cache_limit: int | None = None
    storage_options: dict[str, Any] | None = None
    downloads: int | None = None
    read_ahead: int | None = None
    retries: int = 5
    remote_timeout: float = 60.0
    remote_min_rate: float = 1024.0  # a trickle: under 1 KiB/s averaged over remote_rate_window seconds
    remote_rate_window: float = 30.0

    def __post_init__(self) -> None:
        if self.verify not in VERIFY_MODES:
            raise ValueError(f"verify must be one of {VERIFY_MODES}, got {self.verify!r}")
        if self.cache_dir is not None and not isinstance(self.cache_dir, (str, os.PathLike)):
            raise ValueError(f"cache_dir must be a path or None, got {self.cache_dir!r}")
        if self.storage_options is not None and not isinstance(self.storage_options, dict):
            raise ValueError(f"storage_options must be a dict of the store's options (e.g. {{'endpoint_url': ...}}), "
                             f"got {type(self.storage_options).__name__}")
        for name in ("cache_limit", "read_ahead"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or value <= 0):
                raise ValueError(f"{name} must be a positive number of bytes or None, got {value!r}")
        if self.downloads is not None and (not is_int(self.downloads) or self.downloads < 1):
            raise ValueError(f"downloads must be an int >= 1 (concurrent downloads) or None, got {self.downloads!r}")
        self.retry()  # retries, remote_timeout, remote_min_rate and remote_rate_window, checked by Retry

    def retry(self) -> Retry:
        """How each request is retried and when it is stalled."""
        return Retry(attempts=int(self.retries) if is_int(self.retries) else self.retries,
                     timeout=self.remote_timeout, min_rate=self.remote_min_rate, rate_window=self.remote_rate_window)

    def reader_keywords(self, source: Any, *, remote: bool, webdataset: bool, on_error: str,
                        rank: int) -> dict[str, Any] | None:
        """The keywords of the reader that opens ``source`` (``None`` for a local one that takes none).

        Args:
            source: the Loader's source, for messages.
            remote: it is at a URL.
            webdataset: it is WebDataset tars.
            on_error: the Loader's (tars refuse samples while indexing).
            rank: the default shard cache is one folder per rank.

        Raises:
            ValueError: a remote field set for a source it does not apply to (named, with what the source takes).
        """
        allowed: tuple[str, ...] = (_WEBDATASET if remote else ("cache_dir",)) if webdataset else (
            self._remote_fields() if remote else ())
        defaults = SourceOptions()
        refused = [name for name in self._remote_fields()
                   if getattr(self, name) != getattr(defaults, name) and name not in allowed]
        if refused and webdataset:
            where = "at a URL" if remote else "on local disk"
            raise ValueError(f"{', '.join(n + '=' for n in refused)} apply to an ingested dataset at a URL, not to "
                             f"WebDataset tars {where} ({source!r}), which take only "
                             f"{', '.join(n + '=' for n in allowed)}; drop them")
        if refused:
            raise ValueError(f"{', '.join(n + '=' for n in refused)} apply to a dataset at a URL (s3://, gs://, "
                             f"https://, file://), but the source is {source!r}; drop them")
        if not remote and not webdataset:
            return None
        # None: the reader's own default (8 shard downloads; 64 ranged requests for tars, each one sample or a few)
        downloads = {} if self.downloads is None else {"downloads": int(self.downloads)}
        common = {"cache_dir": self.cache_dir, "cache_limit": self.cache_limit, "read_ahead": self.read_ahead,
                  "storage_options": self.storage_options, "retry": self.retry(), **downloads}
        return {**common, "on_error": on_error} if webdataset else {**common, "rank": rank}

    @staticmethod
    def _remote_fields() -> tuple[str, ...]:
        return tuple(f.name for f in fields(SourceOptions) if f.name != "verify")
