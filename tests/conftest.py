"""Shared fixtures: a fixed seed for every test, the `gpu` and `torchvision` markers' skips, small generated data."""

from __future__ import annotations

import importlib.util
import io
import os
import random
import socket
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

# gcsfs reads this when it is first imported: on (its default) it asks the gRPC control API for a bucket's layout,
# which gcp-storage-emulator does not serve, and waits out a minute's timeout on every read. stallfree.bench.stores'
# gcs_server sets it when it starts, too late once another test has imported gcsfs (Lightning's Trainer does).
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"


@pytest.fixture(autouse=True, scope="session")
def _cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Verified-once markers go to a folder of this run, not the user's cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STALLFREE_CACHE_DIR", str(tmp_path_factory.mktemp("stallfree-cache")))
        yield


@pytest.fixture(autouse=True)
def _seed() -> None:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skips = {}
    if not torch.cuda.is_available():
        skips["gpu"] = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    if {name for _, name in socket.if_nameindex()} != {"lo"}:
        skips["ray"] = pytest.mark.skip(
            reason="runs in a loopback-only network namespace: the README's second test command (tests/ray)")
    if importlib.util.find_spec("torchvision") is None:
        skips["torchvision"] = pytest.mark.skip(
            reason="needs torchvision (pip install torch==2.14.1 torchvision==0.29.1)")
    for item in items:
        for marker, skip in skips.items():
            if marker in item.keywords:
                item.add_marker(skip)


def write_indexed_list(root: Path, count: int, size: tuple[int, int] = (20, 24), fmt: str = "PNG") -> Path:
    """`count` images whose label is their row index, listed in root/list.csv; returns the list's path."""
    rng = np.random.default_rng(count)
    root.mkdir(parents=True, exist_ok=True)
    lines = ["path,label"]
    for i in range(count):
        pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
        name = f"img{i:04d}.{fmt.lower()}"
        Image.fromarray(pixels).save(root / name, fmt)
        lines.append(f"{name},{i}")
    (root / "list.csv").write_text("\n".join(lines) + "\n")
    return root / "list.csv"


def _write_tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="session")
def write_tar() -> Callable[[Path, list[tuple[str, bytes]]], None]:
    """``write_tar(path, [(member name, bytes), ...])``: an uncompressed tar with those members, in that order."""
    return _write_tar


@pytest.fixture(scope="session")
def indexed_list(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """37 PNGs (a prime count), label = row index, so a batch's labels say which samples it holds."""
    return write_indexed_list(tmp_path_factory.mktemp("indexed"), 37)


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from stallfree.ingest.synthetic import make_image_folder

    return make_image_folder(tmp_path_factory.mktemp("folder"), num_classes=3, per_class=8, size=(40, 48),
                             vary_size=True)


class TokenDocs:
    """An in-memory token source: document ``i`` is ``i * 1000 + 1, ..., i * 1000 + length`` (its tokens name it)."""

    def __new__(cls, lengths: list[int] | np.ndarray, name: str = "docs") -> Any:
        from stallfree.ingest.fields import TOKEN_FIELDS
        from stallfree.pipeline.reader_base import BaseReader

        class _Docs(BaseReader):
            fields = TOKEN_FIELDS
            encoded = False

            def __init__(self) -> None:
                super().__init__()
                self.classes: list[str] = []
                self.name = f"{name}:{len(lengths)}"
                self._lengths = np.asarray(lengths, np.int64)

            def __len__(self) -> int:
                return len(self._lengths)

            def labels(self) -> np.ndarray:
                return np.zeros(len(self._lengths), np.int64)

            def lengths(self) -> np.ndarray:
                return self._lengths

            def read(self, index: int) -> dict[str, np.ndarray]:
                return {"tokens": np.arange(1, self._lengths[index] + 1, dtype=np.int32) + 1000 * index}

            def describe(self, index: int) -> str:
                return f"doc {index}"

        return _Docs()


@pytest.fixture(scope="session")
def token_docs() -> Callable[..., Any]:
    """An in-memory token source of given lengths (a ``BaseReader`` of the token-sequence kind)."""
    return TokenDocs


# Words of generated documents: ASCII, accents, CJK and punctuation, so that the BPE learns multi-byte pieces.
_WORDS = ("the a of data token pack loader shard model train batch sequence document length epoch rank window "
          "café naïve 東京 データ über señor — , . ! ? 42 1970 x").split()


def _texts(count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(_WORDS, int(rng.integers(1, 120)))) for _ in range(count)]


@pytest.fixture(scope="session")
def texts() -> list[str]:
    """120 generated documents of 1 to 119 words each."""
    return _texts(120, 0)


@pytest.fixture(scope="session")
def bpe_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer trained here on generated text (nothing downloaded), with ``<s>``/``</s>`` special
    tokens and no post-processor; saved as ``tokenizer.json``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(_texts(400, 1), trainer)
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def image_text_documents(count: int, seed: int = 0, broken: dict[int, bytes] | None = None) -> list[Any]:
    """``count`` generated image-text documents: document ``i``'s text ids are ``1000 * i + 1, ...`` (they name it),
    0 to 2 small PNG images (a left-to-right gradient, so a flip shows, tinted by the document) placed anywhere in the
    text, and ``assistant`` marks on its second half. ``broken`` puts those bytes in place of a document's last
    image (given one)."""
    from stallfree.ingest.image_text_writer import ImageTextDocument

    rng = np.random.default_rng(seed)
    documents = []
    for i in range(count):
        n, k = int(rng.integers(2, 14)), int(rng.integers(0, 3))
        images = []
        for j in range(k):
            h, w = int(rng.integers(6, 20)), int(rng.integers(6, 20))
            pixels = np.zeros((h, w, 3), np.uint8)
            pixels[..., 0] = np.linspace(0, 255, w, dtype=np.uint8)[None, :]
            pixels[..., 1], pixels[..., 2] = (37 * i) % 256, (91 * j + 11 * i) % 256
            out = io.BytesIO()
            Image.fromarray(pixels).save(out, "PNG")
            images.append(out.getvalue())
        sizes = [Image.open(io.BytesIO(b)).size[::-1] for b in images]
        if broken and i in broken and images:
            images[-1] = broken[i]
        assistant = (np.arange(n) >= n // 2).astype(np.uint8)
        at = sorted(int(a) for a in rng.integers(0, n + 1, k))
        documents.append(ImageTextDocument(np.arange(1, n + 1) + 1000 * i, images, at, sizes, assistant,
                                           f"generated.jsonl:{i}"))
    return documents


@pytest.fixture(scope="session")
def image_text_shards(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Writes :func:`image_text_documents` as an image-text shard folder (``count``, ``seed``, ``broken``,
    ``shard_mb``)."""
    from stallfree.ingest.image_text_writer import write_image_text_shards

    def make(count: int, seed: int = 0, broken: dict[int, bytes] | None = None, shard_mb: float = 256.0) -> Path:
        out = tmp_path_factory.mktemp("image-text") / "shards"
        write_image_text_shards(out, image_text_documents(count, seed, broken), shard_mb=shard_mb)
        return out

    return make
