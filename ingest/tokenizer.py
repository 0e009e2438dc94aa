"""Text to token ids, once, at ingest: Hugging Face ``tokenizers`` (the Rust library), encoding in parallel.

A tokenizer is a local ``tokenizer.json`` (read with ``tokenizers.Tokenizer.from_file``) or a local ``transformers``
tokenizer folder (read with ``transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)`` when
``transformers`` is installed; its fast tokenizer's Rust backend does the encoding). Nothing is downloaded: a path
that does not exist is an error, never a hub name.

Encoding is ``Tokenizer.encode_batch``, which runs on the library's own threads (all cores; ``RAYON_NUM_THREADS``
limits them). Each document's ids equal ``tokenizer.encode(text).ids``:

- the tokenizer's own special tokens (its post-processor: BERT's ``[CLS] ... [SEP]``, Llama's ``<s>``) are added,
  as ``tokenizer.encode(text)`` and ``transformers``' ``tokenizer(text)`` add them; ``special_tokens=False`` leaves
  them out;
- its truncation and padding, if the file sets any, are turned off: a document is tokenized whole (the Loader's
  packing splits what is longer than a row), never cut to a length found in the file.

``--add-bos``/``--add-eos`` then put a token at a document's start or end unless it is already there (the
post-processor may have put it); :class:`Specials` holds their ids.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["TEXT_EXTRA", "Specials", "TextTokenizer"]

#: What to install for tokenizing.
TEXT_EXTRA = "pip install 'stallfree[text]' (Hugging Face tokenizers)"


@dataclass(frozen=True)
class Specials:
    """Token ids put at each document's start (``bos``) and end (``eos``) unless already there; None: nothing."""

    bos: int | None = None
    eos: int | None = None

    def apply(self, ids: np.ndarray) -> np.ndarray:
        """``ids`` with the BOS and EOS tokens added where they are missing."""
        head = [self.bos] if self.bos is not None and (len(ids) == 0 or ids[0] != self.bos) else []
        tail = [self.eos] if self.eos is not None and (len(ids) == 0 or ids[-1] != self.eos) else []
        if not head and not tail:
            return ids
        return np.concatenate([np.asarray(head, np.int64), ids.astype(np.int64, copy=False),
                               np.asarray(tail, np.int64)])


class TextTokenizer:
    """A local tokenizer: a ``tokenizer.json`` file or a ``transformers`` tokenizer folder (see the module).

    Args:
        path: the file or folder.
        special_tokens: add the tokenizer's own special tokens (its post-processor), as ``tokenizer.encode`` does.

    Attributes:
        vocab_size: the vocabulary's size, added tokens included: every id is below it.
        identity: SHA-256 of the tokenizer's serialized form (what decides its ids).
        bos_token, eos_token: a ``transformers`` tokenizer's BOS and EOS tokens (None for a ``tokenizer.json``).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ImportError: ``tokenizers`` (or, for a folder, ``transformers``) is not installed; the message says what to
            install.
        ValueError: the file is not a tokenizer, or the folder holds no fast tokenizer.
    """

    def __init__(self, path: str | os.PathLike[str], *, special_tokens: bool = True):
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"--tokenizer {self.path} does not exist (a local tokenizer.json, or a "
                                    "transformers tokenizer folder: nothing is downloaded)")
        try:
            import tokenizers
        except ImportError as err:
            raise ImportError(f"tokenizing text needs Hugging Face tokenizers: {TEXT_EXTRA}") from err
        self.special_tokens = special_tokens
        self.bos_token: str | None = None
        self.eos_token: str | None = None
        if self.path.is_dir():
            backend = self._from_folder()
        else:
            try:
                backend = tokenizers.Tokenizer.from_file(str(self.path))
            except Exception as err:  # the Rust library raises a bare Exception for a file it cannot parse
                raise ValueError(f"--tokenizer {self.path} is not a tokenizers tokenizer.json ({err})") from None
        backend.no_truncation()  # a document is tokenized whole: see the module's docstring
        backend.no_padding()
        self.backend = backend
        self.vocab_size = int(backend.get_vocab_size(with_added_tokens=True))
        self.identity = hashlib.sha256(backend.to_str().encode()).hexdigest()

    def _from_folder(self) -> Any:
        try:
            from transformers import AutoTokenizer
        except ImportError as err:
            raise ImportError(f"--tokenizer {self.path} is a folder, read with transformers' AutoTokenizer: pip "
                              f"install transformers (or pass the folder's tokenizer.json itself)") from err
        try:
            loaded = AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
        except (OSError, ValueError) as err:
            raise ValueError(f"--tokenizer {self.path}: transformers could not load a tokenizer from it "
                             f"({err})") from None
        backend = getattr(loaded, "backend_tokenizer", None)
        if not getattr(loaded, "is_fast", False) or backend is None:
            raise ValueError(f"--tokenizer {self.path} holds a slow (Python) tokenizer, {type(loaded).__name__}: "
                             "ingest needs a fast one (a tokenizer.json); convert it with "
                             "AutoTokenizer.from_pretrained(path).save_pretrained(path) where a fast class exists")
        self.bos_token, self.eos_token = loaded.bos_token, loaded.eos_token
        return backend

    def token_id(self, token: str, flag: str) -> int:
        """The id of ``token`` (``flag`` names the option that asked for it, for the message).

        Raises:
            ValueError: the vocabulary has no such token.
        """
        found = self.backend.token_to_id(token)
        if found is None:
            raise ValueError(f"{flag} {token!r}: {self.path} has no such token")
        return int(found)

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """Each text's ids (int64), encoded in parallel by the library's threads."""
        encodings = self.backend.encode_batch(texts, add_special_tokens=self.special_tokens)
        return [np.asarray(encoding.ids, np.int64) for encoding in encodings]

    def encode_pieces(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each text's ids (int64) and each id's end in characters, without the special tokens (parts of a document).

        The parts of one document (the text between two images) are encoded apart, as LLaVA's
        ``tokenizer_image_token`` does; :meth:`wrapping` gives the special tokens that go around the whole.
        """
        encodings = self.backend.encode_batch(texts, add_special_tokens=False)
        return [(np.asarray(e.ids, np.int64), np.asarray([end for _, end in e.offsets], np.int64).reshape(-1))
                for e in encodings]

    def wrapping(self) -> tuple[list[int], list[int]]:
        """The special tokens the post-processor puts before and after one text (none without ``special_tokens``)."""
        if not self.special_tokens:
            return [], []
        encoding = self.backend.encode("a", add_special_tokens=True)
        ids, special = list(encoding.ids), list(encoding.special_tokens_mask)
        first = special.index(0) if 0 in special else len(ids)
        last = len(ids) - special[::-1].index(0) if 0 in special else len(ids)
        return ids[:first], ids[last:]
