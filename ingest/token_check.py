"""The one check of a document's token ids, for ``stallfree ingest`` and the Loader's in-place token readers alike.

A document is a non-empty sequence of integer token ids, each in ``0 .. vocab_size - 1`` (when the vocabulary is
known; else each must fit ``int32``). What ingest accepts the readers accept, and what one refuses the other refuses,
each with the same reason (STYLE.md, "one home per shared concept"):

- ``missing (null)``: the row has no value (a null cell, a JSON ``null``);
- ``empty document (no tokens)``;
- ``a null token id``: a list holding a null;
- ``negative token id -3``;
- ``token id 50257 is beyond the vocabulary (vocab_size 50257)``, or ``... does not fit int32`` when no vocabulary
  size is known.

A row's text (before tokenizing) is checked by :func:`text_problem`. The shard's token type is :func:`token_dtype`:
``uint16`` when every id is below 65,536, else ``int32``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["INT32_MAX", "document_problem", "ids_of", "list_problems", "text_problem", "token_dtype"]

INT32_MAX = (1 << 31) - 1
_UINT16_IDS = 1 << 16


def token_dtype(vocab_size: int | None, max_id: int) -> np.dtype[Any]:
    """``uint16`` when every id fits (a vocabulary of at most 65,536; unknown: a largest id below it), else int32."""
    fits = vocab_size <= _UINT16_IDS if vocab_size is not None else max_id < _UINT16_IDS
    return np.dtype(np.uint16) if fits else np.dtype(np.int32)


def _beyond(top: int, vocab_size: int | None) -> str | None:
    if vocab_size is not None and top >= vocab_size:
        return f"token id {top} is beyond the vocabulary (vocab_size {vocab_size})"
    if vocab_size is None and top > INT32_MAX:
        return f"token id {top} does not fit int32 (pass --vocab-size if the ids are right)"
    return None


def document_problem(ids: np.ndarray, vocab_size: int | None) -> str | None:
    """Why the 1-D integer array ``ids`` is not a document, or None."""
    if len(ids) == 0:
        return "empty document (no tokens)"
    low = int(ids.min())
    if low < 0:
        return f"negative token id {low}"
    return _beyond(int(ids.max()), vocab_size)


def text_problem(value: Any) -> str | None:
    """Why a row's ``value`` is no text to tokenize, or None."""
    if value is None:
        return "missing (null)"
    if not isinstance(value, str):
        shown = repr(value)
        return f"not text ({type(value).__name__} {shown if len(shown) <= 40 else shown[:37] + '...'})"
    if not value.strip():
        return "empty text"
    return None


def ids_of(value: Any) -> np.ndarray | str:
    """A JSON value as a document's ids (int64), or the reason it is none (not a list of integers)."""
    if value is None:
        return "missing (null)"
    if not isinstance(value, list):
        return f"not a list of token ids (a JSON {type(value).__name__})"
    if any(v is None for v in value):
        return "a null token id"
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        bad = next(v for v in value if not isinstance(v, int) or isinstance(v, bool))
        return f"not a list of token ids (holds {bad!r})"
    try:
        return np.array(value, np.int64)
    except OverflowError:
        top = max(value, key=abs)
        return f"negative token id {top}" if top < 0 else f"token id {top} does not fit int64"


def list_problems(array: Any, vocab_size: int | None) -> dict[int, str]:
    """Every bad row of an Arrow list array of integers, by its index in ``array``: the reason, as for one document.

    Vectorized (per-row minimum and maximum by ``np.minimum.reduceat``), so a column of millions of documents is
    checked in about the time it takes to read it. ``array`` is a ``list<int*>`` or ``large_list<int*>`` array.
    """
    count = len(array)
    if count == 0:
        return {}
    offsets = array.offsets.to_numpy()  # the slice's own offsets, into the unsliced values
    lengths = np.diff(offsets)
    nulls = array.is_null().to_numpy(zero_copy_only=False)
    values = array.values.slice(0, int(offsets[-1]))
    held = values.is_null().to_numpy(zero_copy_only=False) if values.null_count else None
    numbers = values.fill_null(0).to_numpy(zero_copy_only=False) if values.null_count else values.to_numpy()
    reasons: dict[int, str] = {}
    filled = np.flatnonzero(lengths > 0)
    # The rows with values tile [offsets[first], offsets[-1]) exactly, so each reduceat span is one row's values.
    starts = offsets[:-1][filled]
    low = np.minimum.reduceat(numbers, starts) if len(filled) else np.empty(0, numbers.dtype)
    high = np.maximum.reduceat(numbers, starts) if len(filled) else np.empty(0, numbers.dtype)
    has_null = np.add.reduceat(held, starts) > 0 if held is not None and len(filled) else np.zeros(len(filled), bool)
    beyond = high >= vocab_size if vocab_size is not None else high > INT32_MAX
    bad = (low < 0) | beyond | has_null
    for k in np.flatnonzero(bad):
        row = int(filled[k])
        if nulls[row]:
            continue
        if has_null[k]:
            reasons[row] = "a null token id"
        elif low[k] < 0:
            reasons[row] = f"negative token id {int(low[k])}"
        else:
            reasons[row] = _beyond(int(high[k]), vocab_size) or ""
    for null in np.flatnonzero(nulls):
        reasons[int(null)] = "missing (null)"
    for empty in np.flatnonzero((lengths == 0) & ~nulls):
        reasons[int(empty)] = "empty document (no tokens)"
    return dict(sorted(reasons.items()))
