"""The reader contract: :class:`Reader`, every member the Loader uses, and :class:`BaseReader`, its base class.

A reader answers "row i" for a dataset; the sampler decides the order. The Loader and its stages call only what
:class:`Reader` declares. :class:`BaseReader` gives the optional hooks their defaults (no columns, no shards, nothing
to follow or close, an identity hashed from the labels), pickles as *how to open it* where a reader holds open files
or threads, and checks its own rules when the Loader opens it. A user's class that has only the required members
(``classes``, ``encoded``, ``columns``, ``__len__``, ``labels``, ``read``, ``describe``, ``column``) is wrapped by
:func:`as_reader` so that the hooks are there too.
"""

from __future__ import annotations

import functools
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from stallfree.ingest.fields import IMAGE, IMAGE_FIELDS, Field

__all__ = ["REQUIRED", "BaseReader", "Reader", "Sample", "as_reader", "sample_of"]

#: A sample's per-sample fields by name (an image reader's ``read`` may also give the image array alone).
Sample = Mapping[str, np.ndarray] | np.ndarray

#: The members a reader must have; the others (``fingerprint``, ``shard_rows``, ``follow``, ``close``) have defaults.
REQUIRED = ("classes", "encoded", "columns", "__len__", "labels", "read", "describe", "column")


@runtime_checkable
class Reader(Protocol):
    """Row access to a dataset: every member the Loader and its stages use.

    ``read`` may raise ``OSError`` for a missing or unreadable file. Subclass :class:`BaseReader` to get the hooks'
    defaults; a class with only the required members (see :data:`REQUIRED`) is accepted too and given them.

    Attributes:
        classes: class names, index = label.
        encoded: ``True`` when :meth:`read` gives encoded bytes (decoded in the graph), ``False`` for HWC uint8
            pixels.
        columns: names :meth:`column` answers for (``Loader(columns=...)``); empty when there are none.
        rejected: what the reader left out of the source when it opened it (``{"path", "reason"}`` records: a tar
            member that is no sample, under ``on_error="skip"``); a Loader's state carries them.
        fields: what a sample holds (:mod:`stallfree.ingest.fields`): the image kind's ``image`` and ``label``
            unless the reader says otherwise. :meth:`read` returns the per-sample fields by name; the label field
            is :meth:`labels`, read for every row at once.
    """

    classes: list[str]
    encoded: bool
    columns: Sequence[str]
    rejected: Sequence[Mapping[str, str]]
    fields: Sequence[Field]

    def __len__(self) -> int: ...

    def labels(self) -> np.ndarray:
        """Every row's label, int64, without reading any image."""
        ...

    def read(self, index: int) -> Sample:
        """Row ``index``'s per-sample fields by name: ``{"image": ...}`` for the image kind.

        An image is a 1-D uint8 array of encoded bytes, or HWC uint8 pixels (``encoded=False``). A reader of the
        image kind may return the image array alone (the form readers had before fields were named).
        """
        ...

    def describe(self, index: int) -> str:
        """Where row ``index`` lives, for error messages (a path, or a shard and row)."""
        ...

    def column(self, name: str, rows: np.ndarray) -> np.ndarray | list[Any]:
        """Column ``name`` at ``rows``: a NumPy array for numeric columns, else a list.

        Raises:
            KeyError: ``name`` is not one of :attr:`columns`.
        """
        ...

    def fingerprint(self) -> str:
        """What the data is, wherever it lies: a state taken over other data is refused by it."""
        ...

    def shard_rows(self) -> Sequence[int] | None:
        """Rows per shard, in order, for ``shuffle="block"``; ``None`` for a source without shards."""
        ...

    def follow(self, rows: np.ndarray) -> None:
        """The rows about to be read, in order (a remote reader fetches ahead along them)."""
        ...

    def close(self) -> None:
        """Stop whatever the reader runs (downloads, read-ahead); reads after it are not expected."""
        ...

    @property
    def kind(self) -> str:
        """The reader's type name, for messages."""
        ...


def sample_of(value: Sample) -> dict[str, np.ndarray]:
    """What a reader's ``read`` returned, by field name: an image array alone is the image kind's ``image``."""
    if isinstance(value, Mapping):
        return {str(name): _array(field) for name, field in value.items()}
    return {IMAGE.name: _array(value)}


def _array(value: Any) -> np.ndarray:
    """A field as an array: bytes (an encoded image) as its uint8 bytes, without a copy."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return np.frombuffer(value, np.uint8)
    return np.asarray(value)


def identity(kind: str, name: str, labels: np.ndarray) -> str:
    """The default identity of a source without its own: its kind, name, length and labels, hashed."""
    digest = hashlib.sha256(f"{kind}:{name}:{len(labels)}:".encode())
    digest.update(np.ascontiguousarray(labels, np.int64).tobytes())
    return digest.hexdigest()


class BaseReader(ABC):
    """The base of a reader: the optional hooks' defaults, pickling by reopening, and a check of its own rules.

    A subclass sets ``classes`` (and ``encoded``/``columns`` where they differ from the defaults) in its
    ``__init__``, which must call ``super().__init__()``; :meth:`check` (run when the Loader opens the reader) says
    so by name when it did not. A reader that holds open files, locks or threads calls :meth:`reopen_with` with the
    arguments it was built from: it then pickles as those arguments and is opened afresh where it is unpickled
    (another process, a Ray worker), which is what lets the graph run there.
    """

    classes: list[str]
    encoded: bool = True
    columns: Sequence[str] = ()
    rejected: Sequence[Mapping[str, str]] = ()
    fields: Sequence[Field] = IMAGE_FIELDS
    #: A name that, with the labels, identifies the data when the reader defines no ``fingerprint`` of its own.
    name: str = ""

    def __init__(self) -> None:
        self._based = True
        self._opened: tuple[tuple[Any, ...], dict[str, Any]] | None = None

    @property
    def kind(self) -> str:
        """The reader's type name, for messages."""
        return type(self).__name__

    def reopen_with(self, *args: Any, **kwargs: Any) -> None:
        """Pickle as ``type(self)(*args, **kwargs)``: the reader is opened afresh where it is unpickled."""
        self._opened = (args, kwargs)

    def reopened(self) -> BaseReader:
        """A fresh copy of a reader that holds open files, locks or threads (:meth:`reopen_with`), else itself.

        A forked child's Loader reads through it: a lock the parent's threads held at the fork is never released.
        """
        opened = getattr(self, "_opened", None)
        if opened is None:
            return self
        args, kwargs = opened
        return type(self)(*args, **kwargs)

    def __reduce__(self) -> str | tuple[Any, ...]:
        opened = getattr(self, "_opened", None)
        if opened is None:
            return super().__reduce__()
        args, kwargs = opened
        build: Callable[..., Any] = functools.partial(type(self), **kwargs) if kwargs else type(self)
        return build, args

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def labels(self) -> np.ndarray:
        """Every row's label, int64, without reading any image."""

    @abstractmethod
    def read(self, index: int) -> Sample:
        """Row ``index``'s per-sample fields by name (``{"image": ...}``; see :meth:`Reader.read`)."""

    @abstractmethod
    def describe(self, index: int) -> str:
        """Where row ``index`` lives, for error messages."""

    def column(self, name: str, rows: np.ndarray) -> np.ndarray | list[Any]:
        """No columns by default."""
        raise KeyError(f"no column {name!r} in this {type(self).__name__}: only ingested shards carry extra columns")

    def fingerprint(self) -> str:
        """By default the reader's kind, :attr:`name` and labels, hashed."""
        return identity(type(self).__qualname__, self.name, self.labels())

    def shard_rows(self) -> Sequence[int] | None:
        """No shards by default."""
        return None

    def follow(self, rows: np.ndarray) -> None:
        """Nothing to fetch ahead by default."""
        return None

    def close(self) -> None:
        """Nothing to stop by default."""
        return None

    def check(self) -> None:
        """The reader's own rules, each broken one named (the Loader calls this when it opens the reader).

        Raises:
            TypeError: ``__init__`` did not call ``super().__init__()``, or a member has the wrong type.
        """
        kind = type(self).__name__
        if not getattr(self, "_based", False):
            raise TypeError(f"{kind}.__init__ did not call super().__init__(): a BaseReader subclass must (did you "
                            "forget it?)")
        classes = getattr(self, "classes", None)
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            raise TypeError(f"{kind}.classes must be a list of class names (str), got {classes!r}")
        if not isinstance(self.encoded, (bool, np.bool_)):
            raise TypeError(f"{kind}.encoded must be True or False, got {self.encoded!r}")
        if isinstance(self.columns, str) or not all(isinstance(c, str) for c in self.columns):
            raise TypeError(f"{kind}.columns must be a sequence of column names, got {self.columns!r}")


class _Adapted(BaseReader):
    """A user's reader with only the required members, given the hooks' defaults (its own where it has them)."""

    def __init__(self, inner: Any):
        super().__init__()
        self.inner = inner
        self.classes = list(inner.classes)
        self.encoded = bool(inner.encoded)
        self.columns = tuple(inner.columns)
        self.rejected = list(getattr(inner, "rejected", ()))
        self.fields = tuple(getattr(inner, "fields", IMAGE_FIELDS))
        self.name = str(getattr(inner, "name", ""))

    @property
    def kind(self) -> str:
        return type(self.inner).__name__

    def __len__(self) -> int:
        return len(self.inner)

    def labels(self) -> np.ndarray:
        return np.asarray(self.inner.labels())

    def read(self, index: int) -> Sample:
        return sample_of(self.inner.read(index))

    def describe(self, index: int) -> str:
        return str(self.inner.describe(index))

    def column(self, name: str, rows: np.ndarray) -> np.ndarray | list[Any]:
        return self.inner.column(name, rows)

    # The optional hooks: the user's own where the class defines them (looked up here, once, and nowhere else).
    def fingerprint(self) -> str:
        own = getattr(self.inner, "fingerprint", None)
        return str(own()) if callable(own) else identity(type(self.inner).__qualname__, self.name, self.labels())

    def shard_rows(self) -> Sequence[int] | None:
        own = getattr(self.inner, "shard_rows", None)
        return own() if callable(own) else None

    def follow(self, rows: np.ndarray) -> None:
        own = getattr(self.inner, "follow", None)
        if callable(own):
            own(rows)

    def close(self) -> None:
        own = getattr(self.inner, "close", None)
        if callable(own):
            own()


def as_reader(source: Any) -> BaseReader | None:
    """``source`` as a :class:`BaseReader` (checked), a wrapped reader of the required members, or ``None``.

    Raises:
        TypeError: a BaseReader that breaks its rules, or an object with ``read``/``labels``/``describe`` that lacks
            other required members (named).
    """
    if isinstance(source, BaseReader):
        source.check()
        return source
    if not all(hasattr(source, m) for m in ("read", "labels", "describe")):
        return None
    missing = [m for m in REQUIRED if not hasattr(source, m)]
    if missing:
        raise TypeError(f"{type(source).__name__} looks like a Reader but lacks {', '.join(missing)}: a Reader "
                        "declares encoded (bool), columns (names, () for none) and column(name, rows), or subclasses "
                        "stallfree.pipeline.reader_base.BaseReader (stallfree.pipeline.readers.Reader)")
    adapted = _Adapted(source)
    adapted.check()
    return adapted
