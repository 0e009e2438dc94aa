"""The one resume contract (``stallfree.core.resume``), run on every stateful part of the input path.

Each part is driven the same way: a reference runs epochs 0 and 1 start to end (the second by ``iter()``
alone); then a state is taken at batch 0, mid-epoch, after the last batch, after the epoch has ended and
mid-way through the next epoch, loaded into a new part built with other thread / prefetch / worker counts, and
that part must go on with exactly the reference's batches, into the next epoch. A part built with another seed
must refuse the state.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from stallfree import Cost, DatasetReader, Loader, Mix, Packing
from stallfree.bench.servers import RangeServer
from stallfree.core.resume import Resumable
from stallfree.ingest.manifest import read_manifest
from stallfree.ingest.runner import ingest
from stallfree.ingest.writer import IngestOptions
from stallfree.stage_runtime.train.caption_feed import CaptionBatches
from stallfree.stage_runtime.train.feed import TensorBatches, TorchFeed
from stallfree.stage_runtime.train.token_feed import TokenBatches
from stallfree.transforms import CutMix, MixUp, Normalize, RandomHorizontalFlip, RandomResizedCrop, Resize

SPEC = [RandomResizedCrop(12), RandomHorizontalFlip(), Normalize()]
Batch = tuple[torch.Tensor, ...]
Factory = Callable[[int, int], Any]  # (variant, seed) -> part; variants differ only in threads / workers


class _Pixels:
    """A map-style Dataset of decoded arrays (label = index)."""

    def __init__(self, n: int):
        self.targets = list(range(n))
        self.gen = torch.Generator().manual_seed(5)
        self.images = torch.randint(0, 256, (n, 16, 18, 3), generator=self.gen, dtype=torch.uint8).numpy()

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        return self.images[i], i


class _Mixing:
    """MixUp/CutMix over a fixed list of batches, iterated as the training loop calls them."""

    def __init__(self, mix: MixUp | CutMix, batches: list[Batch]):
        self.mix, self.batches = mix, batches

    def __len__(self) -> int:
        return len(self.batches)

    def set_epoch(self, epoch: int) -> None:
        self.mix.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        return self.mix.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mix.load_state_dict(state)

    def __iter__(self) -> Iterator[Batch]:
        for images, labels in self.batches[self.mix.batch:]:
            yield self.mix(images.clone(), labels)
        self.mix.set_epoch(self.mix.epoch + 1)


def _loader(source: Any, **extra: Any) -> Factory:
    def make(variant: int, seed: int) -> Loader:
        return Loader(source, 4, transform=SPEC, seed=seed, num_threads=1 + variant, prefetch=1 + 2 * variant,
                      io_threads=1 + variant, **extra)
    return make


@pytest.fixture(scope="module")
def shards(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("contract_shards")
    ingest(image_folder, out, IngestOptions(shard_mb=0.01))  # several shards, for the block shuffle
    return out


@pytest.fixture(scope="module")
def shards_url(shards: Path) -> Iterator[str]:
    """The shards served over HTTP (with Range) on 127.0.0.1."""
    with RangeServer(shards) as server:
        yield server.url


@pytest.fixture
def remote_cache(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture(scope="module")
def webdataset(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The image folder's files as 3 WebDataset tars (label = class folder), read in place: their pattern."""
    out = tmp_path_factory.mktemp("contract_wds")
    files = sorted(image_folder.glob("*/*"))
    classes = sorted({f.parent.name for f in files})
    for t in range(3):
        with tarfile.open(out / f"part-{t:02d}.tar", "w") as tar:
            for i, file in enumerate(files[t::3]):
                tar.add(file, f"{i:03d}{file.suffix}")
                label = out / "label.cls"
                label.write_text(str(classes.index(file.parent.name)))
                tar.add(label, f"{i:03d}.cls")
    return str(out / "part-{00..02}.tar")


def _image_text(source: Any, batch: int, **packing: Any) -> Factory:
    """A Loader of image-text packs (each image 3 positions of id 999), its images flipped at random."""
    def make(variant: int, seed: int) -> Loader:
        return Loader(source, batch, transform=[Resize((6, 6)), RandomHorizontalFlip(), Normalize()],
                      packing=Packing(seq_len=32, window=8, image_tokens=3, image_token_id=999, **packing),
                      shuffle=True, seed=seed, num_threads=1 + variant, prefetch=1 + 2 * variant)
    return make


def _factories(image_folder: Path, indexed_list: Path, shards: Path, url: str, cache: Path,
               webdataset: str, token_docs: Callable[..., Any], image_text: Path) -> dict[str, Factory]:
    gen = torch.Generator().manual_seed(1)
    tokens = token_docs(np.random.default_rng(2).integers(1, 40, 30))
    # a mixture: 30 and 12 documents, 2:1, so the small source starts its next pass within an epoch
    mix = Mix({"a": tokens, "b": token_docs(np.random.default_rng(3).integers(1, 60, 12), name="b")},
              weights={"a": 2, "b": 1})
    mix_in = [(torch.rand(4, 3, 6, 6, generator=gen), torch.randint(0, 5, (4,), generator=gen)) for _ in range(5)]
    return {
        "loader-folder": _loader(image_folder),
        "loader-file-list": _loader(indexed_list),
        "loader-dataset": _loader(DatasetReader(_Pixels(22))),
        "loader-shards": _loader(shards),
        "loader-shards-block": _loader(shards, shuffle="block", block_shards=2),
        # a cache of 3 shards' worth: shards are evicted and fetched again as the epochs go on
        "loader-http-block": _loader(url, shuffle="block", block_shards=1, cache_dir=cache,
                                     cache_limit=3 * max(s["bytes"] for s in read_manifest(shards)["shards"])),
        "loader-webdataset-block": _loader(webdataset, shuffle="block", block_shards=1, cache_dir=cache),
        # token sequences: packed into rows (the packs' plan and cursor), and padded per batch
        "loader-tokens-packed": lambda v, seed: Loader(tokens, 3, packing=Packing(seq_len=24, window=8), shuffle=True,
                                                       seed=seed, prefetch=1 + 2 * v),
        "loader-tokens-padded": lambda v, seed: Loader(tokens, 4, shuffle=True, seed=seed, prefetch=1 + 2 * v),
        "loader-tokens-balanced": lambda v, seed: Loader(
            tokens, 2, packing=Packing(seq_len=24, window=8, balance="compute", cost=Cost.attention(24),
                                       microbatches=2), shuffle=True, seed=seed, prefetch=1 + 2 * v),
        "loader-tokens-mix": lambda v, seed: Loader(mix, 3, packing=Packing(seq_len=24, window=8), shuffle=True,
                                                    seed=seed, prefetch=1 + 2 * v),
        "loader-tokens-mix-padded": lambda v, seed: Loader(mix, 4, shuffle=True, seed=seed, prefetch=1 + 2 * v),
        # image-text samples: packs with each image's positions and its pixels; balanced with a cost per image; and
        # mixed with text-only documents in one pack
        "loader-image-text": _image_text(image_text, 2),
        "loader-image-text-balanced": _image_text(image_text, 2, balance="compute", cost=Cost(1.0, image=20.0),
                                                  microbatches=2),
        "loader-image-text-mix": _image_text(Mix({"vl": image_text, "text": tokens}, weights={"vl": 1, "text": 1},
                                                 epoch_size=40), 2),
        "tensor-batches": lambda v, seed: TensorBatches(40, 6, 8, 3, seed=seed),
        "token-batches": lambda v, seed: TokenBatches(40, 6, 16, 20, seed=seed),  # a token model's generated packs
        # a vision model's generated image-text packs (issue 47): images of 8x8 pixels, 4 tokens each
        "caption-batches": lambda v, seed: CaptionBatches(40, 6, 24, image_size=8, patch=4, seed=seed),
        "torch-feed": lambda v, seed: TorchFeed(str(image_folder), 5, 12, train=True, seed=seed, replica=0,
                                                replicas=1, workers=v),
        "mixup": lambda v, seed: _Mixing(MixUp(alpha=0.5, num_classes=5, seed=seed), mix_in),
        "cutmix": lambda v, seed: _Mixing(CutMix(alpha=1.0, num_classes=5, seed=seed), mix_in),
    }


PARTS = ["loader-folder", "loader-file-list", "loader-dataset", "loader-shards", "loader-shards-block",
         "loader-http-block", "loader-webdataset-block", "loader-tokens-packed", "loader-tokens-padded",
         "loader-tokens-balanced", "loader-tokens-mix", "loader-tokens-mix-padded", "loader-image-text",
         "loader-image-text-balanced", "loader-image-text-mix", "tensor-batches", "token-batches", "caption-batches",
         "torch-feed", "mixup", "cutmix"]


@pytest.fixture
def factory(request: pytest.FixtureRequest, image_folder: Path, indexed_list: Path, shards: Path, shards_url: str,
            remote_cache: Path, webdataset: str, token_docs: Callable[..., Any],
            image_text_shards: Callable[..., Path]) -> Factory:
    image_text = image_text_shards(24, shard_mb=0.002) if request.param.startswith("loader-image-text") else Path()
    return _factories(image_folder, indexed_list, shards, shards_url, remote_cache, webdataset,
                      token_docs, image_text)[request.param]


def _fields(batch: Any) -> Batch:
    """A batch's tensors: a tuple's, or a packed dict's values (``max_seqlen``, an int, as a tensor)."""
    return tuple(torch.as_tensor(v) for v in batch.values()) if isinstance(batch, dict) else tuple(batch)


def _same(a: list[Batch], b: list[Batch]) -> bool:
    return len(a) == len(b) and all(all(torch.equal(x, y) for x, y in zip(p, q, strict=True))
                                    for p, q in zip(a, b, strict=True))


def _state_after(part: Any, epoch0: int, taken: int) -> dict[str, Any]:
    """Run ``epoch0`` whole epochs, then ``taken`` batches of the next; the state, through JSON."""
    for _ in range(epoch0):
        list(part)
    it = iter(part)
    for _ in range(taken):
        next(it)
    return json.loads(json.dumps(part.state_dict()))


@pytest.mark.parametrize("factory", PARTS, indirect=True)
def test_every_part_resumes_bit_identically_at_every_point(factory: Factory) -> None:
    reference = factory(0, 11)
    assert isinstance(reference, Resumable)
    epochs = [[_fields(b) for b in reference] for _ in range(3)]
    n = len(epochs[0])
    assert n >= 3 and not _same(epochs[0], epochs[1]), "the epochs must differ for the test to mean anything"
    points = {"batch 0": (0, 0), "mid-epoch": (0, n // 2), "last batch": (0, n), "epoch ended": (1, 0),
              "next epoch": (1, 1)}
    for name, (epoch0, taken) in points.items():
        state = _state_after(factory(0, 11), epoch0, taken)
        resumed = factory(1, 11)
        resumed.load_state_dict(state)
        resumed.set_epoch(state["epoch"])  # as a training loop does: setting the loaded epoch keeps the position
        rest = [_fields(b) for b in resumed]
        assert _same(rest, epochs[epoch0][taken:]), f"{name}: the rest of the epoch differs"
        following = [_fields(b) for b in resumed]
        assert _same(following, epochs[epoch0 + 1]), f"{name}: the epoch after the resumed one differs"


@pytest.mark.parametrize("factory", PARTS, indirect=True)
def test_setting_another_epoch_drops_a_loaded_position(factory: Factory) -> None:
    reference = factory(0, 11)
    epoch2 = [_fields(b) for b in (reference.set_epoch(2), reference)[1]]
    state = _state_after(factory(0, 11), 0, 2)
    resumed = factory(1, 11)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)
    assert _same([_fields(b) for b in resumed], epoch2)


@pytest.mark.parametrize("factory", PARTS, indirect=True)
def test_a_state_from_another_seed_is_refused(factory: Factory) -> None:
    state = _state_after(factory(0, 11), 0, 1)
    with pytest.raises(ValueError, match="state has seed=11 but this .* has seed=12"):
        factory(0, 12).load_state_dict(state)


@pytest.mark.parametrize("factory", PARTS, indirect=True)
def test_a_damaged_state_is_refused_naming_the_field(factory: Factory) -> None:
    # Before (issue 37, case 11): KeyError, TypeError or a strange epoch later, naming nothing.
    state = json.loads(json.dumps(factory(0, 11).state_dict()))
    # the batch counter, at the top or in the batcher's part of a state that nests its stages' (the Loader's)
    part = "batcher" if "batcher" in state else None
    counter = "batch" if "batch" in state else "batches"
    for where, key in ((None, "epoch"), (part, counter)):
        named = f"{where}.{key}" if where else key

        def damaged(value: object, where: str | None = where, key: str = key) -> dict[str, object]:
            out = json.loads(json.dumps(state))
            inner = out[where] if where else out
            if value is None:
                del inner[key]
            else:
                inner[key] = value
            return out

        cases = [(damaged(-1), rf"state has {named}=-1: expected an int (>= 0|in 0\.\.)"),
                 (damaged("1"), rf"state has {named}='1': expected an int"),
                 (damaged(None), rf"state has no '{named}' field")]
        for bad, match in cases:
            with pytest.raises(ValueError, match=match):
                factory(0, 11).load_state_dict(bad)
    with pytest.raises(ValueError, match="state must be a dict"):
        factory(0, 11).load_state_dict(None)  # type: ignore[arg-type]
