"""Image-text samples read in place: JSON Lines, Parquet, LLaVA's ``.json`` array or a ``datasets.Dataset``.

No ``stallfree ingest``: :class:`ImageTextFileReader` (a file or a folder of them) and :class:`ImageTextDatasetReader`
(a Hugging Face ``datasets.Dataset``) give the Loader the rows :class:`~stallfree.pipeline.image_text_reader.
ImageTextShardReader` gives for the same samples ingested, so the batches are the same, bit for bit. When it opens, a
reader does what the ingest does, with the ingest's own code (:func:`~stallfree.ingest.image_text_runner.
plan_image_text` and :func:`~stallfree.ingest.image_text_runner.row_documents`): each row rendered in its layout
(a caption pair, or a LLaVA conversation in LLaVA v1's template), each image read and passed through the one image
check (its size known), the text tokenized once. It keeps each document's ids, ``image_at`` and ``assistant`` marks
and where each image is, never the image bytes::

    rows ─► layout ─► images read + checked (sizes) ─► tokenized once ─► kept: ids, image_at, assistant, image refs
    read(i) ─► each image read again (its file, or its row's bytes) ─► {"tokens", "images", "image_at", "assistant"}

An image is read when a batch needs it: a path from its file (relative paths from ``image_root``, else the source
file's folder), bytes from the row's cell (a Parquet file's image column is read into Arrow once, when the reader
opens; a dataset's stays memory-mapped). A bad row (a missing field, empty text, placeholders that do not match the
images, an image missing or refused by the check) follows ``on_error`` when the reader opens: ``"raise"`` raises a
``ValueError`` naming the file and row; ``"skip"`` leaves the row out and lists it in :attr:`rejected`
(``{"path": "FILE:ROW", "reason"}``), as ingest's ``rejected.jsonl`` does. An image that became unreadable after
the reader opened raises, naming the row, when a batch reads it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from typing import Any, Literal

import numpy as np

from stallfree.ingest.image_refs import ImageProblem, image_refs, load_image
from stallfree.ingest.image_text_runner import ImageTextOptions, image_field_of, plan_image_text, row_documents
from stallfree.ingest.image_text_writer import DEFAULT_PLACEHOLDER, ImageTextDocument, Layout
from stallfree.ingest.images import DEFAULT_MAX_PIXELS
from stallfree.ingest.record_sources import RecordFile, is_dataset, read_records
from stallfree.ingest.remote import is_url, redact
from stallfree.ingest.text_sources import TOKEN_COLUMNS, Bad, columns_of, list_text_files
from stallfree.pipeline.image_text_reader import ImageTextKind
from stallfree.pipeline.reader_base import BaseReader, Sample
from stallfree.pipeline.token_readers import TokenKind

__all__ = ["ImageTextDatasetReader", "ImageTextFileReader", "refuse_image_text"]

OnError = Literal["raise", "skip"]


def _kept(ref: Any, cells: bool) -> Any:
    """What a document keeps of an image reference: a path as it is, bytes as ``None`` where a cell holds them.

    ``cells``: the row's cell can be read again (a Parquet file, a dataset); a JSON row's bytes are kept as they are.
    """
    if isinstance(ref, str):
        return ref
    if isinstance(ref, dict) and ref.get("bytes") is None:
        return {"path": ref.get("path")}
    return None if cells else ref


class _Cells:
    """The image cells of a Parquet file (its column read into Arrow once) or a dataset (its memory-mapped table)."""

    def __init__(self, file: RecordFile, field: str):
        self.field = field
        if file.dataset is not None:
            self._dataset = file.dataset.with_format("arrow")
            self._column = None
        else:
            import pyarrow.parquet as pq

            assert file.text is not None  # a RecordFile is a dataset or a file
            self._column = pq.read_table(file.text.path, columns=[field], memory_map=True).column(field)

    def value(self, row: int) -> Any:
        """Row ``row``'s cell (an image, or a list of them), as Python values."""
        if self._column is not None:
            return self._column[row].as_py()
        return self._dataset[row : row + 1].column(self.field).to_pylist()[0]


class _InPlace(ImageTextKind, TokenKind, BaseReader):
    """The image-text documents of a source, read once when it opens (see the module)."""

    def __init__(self, source: Any, tokenizer: str | os.PathLike[str], layout: Layout, *, image_field: str | None,
                 text_field: str, conversations_field: str, image_root: str | os.PathLike[str] | None,
                 image_placeholder: str, special_tokens: bool, add_bos: str | None, add_eos: str | None,
                 vocab_size: int | None, max_pixels: int, on_error: OnError):
        super().__init__()
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.reopen_with(source, tokenizer=tokenizer, layout=layout, image_field=image_field, text_field=text_field,
                         conversations_field=conversations_field, image_root=image_root,
                         image_placeholder=image_placeholder, special_tokens=special_tokens, add_bos=add_bos,
                         add_eos=add_eos, vocab_size=vocab_size, max_pixels=max_pixels, on_error=on_error)
        options = ImageTextOptions(
            layout=layout, tokenizer=os.fspath(tokenizer), image_field=image_field, text_field=text_field,
            conversations_field=conversations_field,
            image_root=None if image_root is None else os.fspath(image_root), image_placeholder=image_placeholder,
            special_tokens=special_tokens, add_bos=add_bos, add_eos=add_eos, vocab_size=vocab_size,
            max_pixels=max_pixels, on_error=on_error)
        plan = plan_image_text(source, options)
        self.classes = []
        self.columns = ["length", "source", "image_count"]
        self.layout: str = layout
        self.vocab_size: int = plan.vocab_size
        self.token_dtype = plan.dtype
        self._files, self._roots, self._max_pixels = plan.files, plan.roots, max_pixels
        self._cells: dict[int, _Cells] = {}  # file -> its image cells, where a document kept bytes as None
        docs: list[ImageTextDocument] = []
        where: list[tuple[int, int]] = []
        self._refs: list[Any] = []
        bad: list[tuple[int, int, str]] = []
        for index, file in enumerate(plan.files):
            cells = file.dataset is not None or (file.text is not None and file.text.format == "parquet")
            for batch in read_records(file, plan.fields):
                records = {row: record for row, record in batch if not isinstance(record, Bad)}
                for row, value, refs in row_documents(plan, options, index, batch):
                    if isinstance(value, Bad):
                        bad.append((index, row, value.reason))
                        continue
                    docs.append(replace(value, images=[]))  # the bytes go: read again when a batch needs them
                    where.append((index, row))
                    kept = [_kept(ref, cells) for ref in refs]
                    if None in kept and index not in self._cells:
                        self._cells[index] = _Cells(file, image_field_of(options, records[row]))
                    self._refs += kept
        if bad and on_error == "raise":
            index, row, reason = bad[0]
            raise ValueError(f"{self._shown(index)} row {row}: {reason}; fix the row, or pass on_error='skip' to "
                             "leave such rows out (listed in the reader's rejected)")
        self.rejected = [{"path": f"{plan.files[index].name}:{row}", "reason": reason} for index, row, reason in bad]
        self._where = np.asarray(where, np.int64).reshape(-1, 2)  # (file, row) of each document
        self._keep(docs)

    def _keep(self, docs: list[ImageTextDocument]) -> None:
        """The documents' ids, marks and image places, in flat arrays (document ``i`` a span of each)."""
        self._lengths = np.asarray([len(d.tokens) for d in docs], np.int64)
        self._counts = np.asarray([len(d.image_sizes) for d in docs], np.int64)
        self._starts = np.concatenate([[0], np.cumsum(self._lengths)]).astype(np.int64)
        self._firsts = np.concatenate([[0], np.cumsum(self._counts)]).astype(np.int64)
        self._tokens = _join([d.tokens for d in docs], self.token_dtype)
        self._assistant = _join([d.assistant for d in docs], np.dtype(np.uint8))
        self._at = _join([d.image_at for d in docs], np.dtype(np.int32))
        self._sizes = _join([np.asarray(d.image_sizes, np.int32).reshape(-1, 2) for d in docs],
                            np.dtype(np.int32)).reshape(-1, 2)

    def _shown(self, index: int) -> str:
        """File ``index`` as messages name it: its path, or the dataset."""
        file = self._files[index]
        return str(file.text.path) if file.text is not None else "the datasets.Dataset"

    def image_sizes(self) -> np.ndarray:
        """Every image's ``(height, width)`` from the one image check at open (int32 ``[images, 2]``, in row order)."""
        return self._sizes

    def describe(self, index: int) -> str:
        """``FILE row R`` (for a dataset, ``the datasets.Dataset row R``): where document ``index`` came from."""
        file, row = self._where[index]
        return f"{self._shown(int(file))} row {int(row)}"

    def read(self, index: int) -> Sample:
        """Document ``index``: ``{"tokens", "images" (each read now), "image_at", "assistant"}``, as a shard's row.

        Raises:
            ImageProblem: an image that was read and checked when the reader opened no longer is (named with its row).
        """
        if not 0 <= index < len(self._lengths):
            raise IndexError(f"row {index} out of range for {len(self._lengths)} documents in {self.name}")
        t0, t1 = int(self._starts[index]), int(self._starts[index + 1])
        i0, i1 = int(self._firsts[index]), int(self._firsts[index + 1])
        images = [self._image(index, j) for j in range(i1 - i0)]
        fields: dict[str, Any] = {"tokens": self._tokens[t0:t1], "images": images, "image_at": self._at[i0:i1],
                                  "assistant": self._assistant[t0:t1]}
        return fields

    def _image(self, index: int, j: int) -> np.ndarray:
        file, row = (int(v) for v in self._where[index])
        ref = self._refs[int(self._firsts[index]) + j]
        if ref is None:  # bytes: the row's cell holds them
            cells = self._cells[file]
            ref = image_refs(cells.value(row), cells.field)[j]
        try:
            data, _ = load_image(ref, self._roots[file], f"image {j}", self._max_pixels)
        except ImageProblem as err:
            raise ImageProblem(f"{self.describe(index)}: {err} (it passed the check when the reader opened: the "
                               "source changed since)") from None
        return np.frombuffer(data, np.uint8)

    def column(self, name: str, rows: np.ndarray) -> np.ndarray | list[Any]:
        """Column ``name`` at ``rows``: ``length``, ``image_count``, or ``source`` (``FILE:ROW``, as a shard's)."""
        rows = np.asarray(rows, np.int64)
        if name == "length":
            return np.array(self._lengths[rows], np.int64)
        if name == "image_count":
            return self._image_count_column(rows)
        if name == "source":
            return [f"{self._files[int(f)].name}:{int(r)}" for f, r in self._where[rows]]
        raise KeyError(f"no column {name!r} in {self.name}; its columns are {self.columns}")

    def fingerprint(self) -> str:
        """What the documents are, wherever the files lie: sources, ids, marks, image places and sizes, hashed.

        A state taken over other rows, another tokenizer or another layout is refused by it.
        """
        digest = hashlib.sha256(f"{type(self).__qualname__}:{self.layout}:".encode())
        digest.update("\0".join(f.name for f in self._files).encode())
        for part in (self._where, self._lengths, self._counts, self._tokens, self._assistant, self._at, self._sizes):
            digest.update(np.ascontiguousarray(part).tobytes())
        return digest.hexdigest()


def _join(parts: list[Any], dtype: np.dtype[Any]) -> np.ndarray:
    return np.concatenate([np.asarray(p, dtype) for p in parts]) if parts else np.empty(0, dtype)


class ImageTextFileReader(_InPlace):
    """Image-text rows of a ``.jsonl``/``.parquet`` file, LLaVA's one-array ``.json``, or a folder of them, in place.

    The Loader reads it as it reads the same rows ingested (``stallfree ingest --layout``): the same batches.

    Args:
        path: the file, or a folder of them (its own files, in name order); rows numbered from 0 in each file.
        tokenizer: a local ``tokenizer.json`` or ``transformers`` tokenizer folder (the text is tokenized once, now).
        layout: ``"caption"`` (images, then a text) or ``"conversations"`` (LLaVA's, with ``<image>`` placeholders).
        image_field: the field of a row's images (one, or a list; default ``image``, else ``images``).
        text_field: a caption's text field.
        conversations_field: a conversation's list of turns.
        image_root: the folder relative image paths start from (default: the source file's folder; for a dataset,
            the working folder).
        image_placeholder: the text that marks an image's place in a conversation.
        special_tokens, add_bos, add_eos, vocab_size, max_pixels: as ``stallfree ingest``'s (``ImageTextOptions``).
        on_error: a bad row raises (``"raise"``) or is left out and listed in :attr:`rejected` (``"skip"``).

    Raises:
        FileNotFoundError: ``path``, the tokenizer or ``image_root`` does not exist.
        TypeError: a ``datasets.Dataset`` (read it with :class:`ImageTextDatasetReader`).
        ValueError: a URL, a CSV file, a file lacking the layout's columns, a bad option, or a bad row under
            ``on_error="raise"`` (naming the file and row, and why).
    """

    def __init__(self, path: str | os.PathLike[str], tokenizer: str | os.PathLike[str], layout: Layout = "caption", *,
                 image_field: str | None = None, text_field: str = "text", conversations_field: str = "conversations",
                 image_root: str | os.PathLike[str] | None = None, image_placeholder: str = DEFAULT_PLACEHOLDER,
                 special_tokens: bool = True, add_bos: str | None = None, add_eos: str | None = None,
                 vocab_size: int | None = None, max_pixels: int = DEFAULT_MAX_PIXELS, on_error: OnError = "raise"):
        if is_dataset(path):
            raise TypeError("ImageTextFileReader reads files; read a datasets.Dataset with "
                            "stallfree.ImageTextDatasetReader(dataset, tokenizer=..., layout=...)")
        if isinstance(path, str) and is_url(path):
            raise ValueError(f"ImageTextFileReader reads local files, got the URL {redact(path)}: download it, or "
                             "ingest it (`stallfree ingest --layout`) and read the shards at their URL")
        super().__init__(path, tokenizer, layout, image_field=image_field, text_field=text_field,
                         conversations_field=conversations_field, image_root=image_root,
                         image_placeholder=image_placeholder, special_tokens=special_tokens, add_bos=add_bos,
                         add_eos=add_eos, vocab_size=vocab_size, max_pixels=max_pixels, on_error=on_error)
        self.name = str(path)


class ImageTextDatasetReader(_InPlace):
    """Image-text rows of a Hugging Face ``datasets.Dataset``, in place (an ``Image()`` column is never decoded).

    Images are an ``Image()`` feature's ``{"bytes", "path"}``, bytes, or paths; bytes are read from the dataset's
    memory-mapped table when a batch needs them. The dataset's row order is the source's.

    Args:
        dataset: a map-style ``datasets.Dataset``.
        tokenizer: a local ``tokenizer.json`` or ``transformers`` tokenizer folder (the text is tokenized once, now).
        layout: ``"caption"`` (images, then a text) or ``"conversations"`` (LLaVA's, with ``<image>`` placeholders).
        image_field: the field of a row's images (one, or a list; default ``image``, else ``images``).
        text_field: a caption's text field.
        conversations_field: a conversation's list of turns.
        image_root: the folder relative image paths start from (default: the source file's folder; for a dataset,
            the working folder).
        image_placeholder: the text that marks an image's place in a conversation.
        special_tokens, add_bos, add_eos, vocab_size, max_pixels: as ``stallfree ingest``'s (``ImageTextOptions``).
        on_error: a bad row raises (``"raise"``) or is left out and listed in :attr:`rejected` (``"skip"``).

    Raises:
        TypeError: not a ``datasets.Dataset`` (a ``DatasetDict``: pass one split).
        ValueError: a dataset lacking the layout's columns, a bad option, or a bad row under ``on_error="raise"``.
    """

    def __init__(self, dataset: Any, tokenizer: str | os.PathLike[str], layout: Layout = "caption", *,
                 image_field: str | None = None, text_field: str = "text", conversations_field: str = "conversations",
                 image_root: str | os.PathLike[str] | None = None, image_placeholder: str = DEFAULT_PLACEHOLDER,
                 special_tokens: bool = True, add_bos: str | None = None, add_eos: str | None = None,
                 vocab_size: int | None = None, max_pixels: int = DEFAULT_MAX_PIXELS, on_error: OnError = "raise"):
        if not is_dataset(dataset):
            hint = " (a DatasetDict: pass one split, ds['train'])" if type(dataset).__name__.endswith("DatasetDict") \
                else "; read a file with stallfree.ImageTextFileReader"
            raise TypeError(f"ImageTextDatasetReader reads a datasets.Dataset, got {type(dataset).__name__}{hint}")
        super().__init__(dataset, tokenizer, layout, image_field=image_field, text_field=text_field,
                         conversations_field=conversations_field, image_root=image_root,
                         image_placeholder=image_placeholder, special_tokens=special_tokens, add_bos=add_bos,
                         add_eos=add_eos, vocab_size=vocab_size, max_pixels=max_pixels, on_error=on_error)
        self.name = f"datasets.Dataset:{getattr(dataset, '_fingerprint', '')}"


#: A row's text field, and the layout it goes with.
_TEXTS = {"text": "caption", "conversations": "conversations", "messages": "conversations"}


def refuse_image_text(source: Any) -> None:
    """Refuse image-text rows given to the Loader as a bare path or dataset, naming the reader that reads them.

    Raises:
        ValueError: ``source`` (a dataset, or the first file of a path) holds image-text rows and no token ids: an
            image or a list of them with a caption or a conversation, or a conversation.
    """
    if is_dataset(source):
        features = getattr(source, "features", None) or {}
        if any(type(feature).__name__ == "ClassLabel" for feature in features.values()):
            return  # images with a class: the image kind's
        names, where, reader = list(source.column_names), "the datasets.Dataset", "ImageTextDatasetReader(dataset"
    elif isinstance(source, (str, os.PathLike)):
        names, where, reader = _first_fields(source), str(source), f"ImageTextFileReader({str(source)!r}"
    else:
        return
    text = next((name for name in _TEXTS if name in names), None)
    images = {"image", "images"} & set(names)
    if text is None or set(TOKEN_COLUMNS) & set(names) or not (images or text == "conversations"):
        return
    layout = _TEXTS[text]
    field = ", conversations_field='messages'" if text == "messages" else ""
    raise ValueError(f"{where} holds image-text rows (its fields {names[:8]}): the Loader reads them in place with "
                     f"stallfree.{reader}, tokenizer='tokenizer.json', layout={layout!r}{field}), or from the shards "
                     f"`stallfree ingest SRC OUT --tokenizer PATH --layout {layout}` writes (docs/sequences.md, "
                     "\"Image-text samples\")")


def _first_fields(path: str | os.PathLike[str]) -> list[str]:
    """The fields of the first row of ``path``'s first file (a ``.json`` array's first element); [] where unknown."""
    files = list_text_files(path)
    names = columns_of(files[0]) if files else []
    if names or not files or files[0].path.suffix.lower() != ".json":
        return names
    with open(files[0].path, "rb") as f:
        head = f.read(1 << 20).decode("utf-8", "replace").lstrip()
    try:
        first, _ = json.JSONDecoder().raw_decode(head[1:].lstrip()) if head.startswith("[") else ({}, 0)
    except ValueError:  # an element longer than the head read, or no JSON: no hint
        return []
    return list(first) if isinstance(first, dict) else []
