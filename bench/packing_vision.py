"""``bench packing``'s image-text mix: captioned images packed with their vision tokens, against a DataLoader.

The data is the generated caption task (:mod:`stallfree.ingest.synthetic_captions`) at photographs' size: JPEGs of
about 375x500 (each side 75-125% of it), each with a text of its caption repeated ``k`` times, ``k`` lognormal
(median 8, sigma 1.0, clipped to 1-170: 7 to about 1,200 tokens, as a detailed-description set's replies vary),
written as a caption-pair JSON Lines file and ingested as image-text shards by the library call ``stallfree ingest
--layout caption`` makes, with the word-level tokenizer written beside the images (nothing downloaded)::

    DATA/image-text/         image-text shards (manifest.json, shard-*.arrow, lengths.npy, image_counts.npy)
    DATA/image-text.json     the settings it was made with (a rerun with the same ones reuses it)

Each image stands for ``(336 / 14)**2 = 576`` tokens (LLaVA-1.5's CLIP ViT-L/14 at 336 px), so a document is its
text's tokens + 576, all counted in a row's ``S``. Two contenders read the same shards:

- ``packed``: stallfree's Loader with ``Packing(seq_len=S, image_tokens=576, image_token_id=V)`` and
  ``transform=[Resize((336, 336)), Normalize()]``: the images decoded and resized in its DALI graph (CPU operators on
  a machine without a GPU), B rows of S;
- ``torch-pad``: torch's ``DataLoader`` over the shards' documents (:class:`ShardImageText`: each row's image bytes
  decoded by PIL, ``convert("RGB")``, resized to 336x336 by torchvision's ``Resize`` (bilinear, antialiased) where
  ``torchvision`` imports, else PIL's ``resize`` (bilinear), normalized the same), collated by ``transformers``'
  ``DataCollatorForLanguageModeling(mlm=False)`` (the ``input_ids``: 576 image ids then the text, padded to the
  batch's longest) and ``pixel_values`` stacked: ``B_pad`` = round(B * S / the mean document length) documents a
  batch, ``--workers`` workers.

Both give ``pixel_values`` [N_images, 3, 336, 336] float32 and count their real tokens (image tokens included) against
their slots. The table adds samples/s (documents, one image each, delivered a second).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from stallfree.bench.packing_feeds import Feed, _dataloader, _pad_tokenizer, padded_batch_size
from stallfree.bench.packing_mixes import Mix, MixData

__all__ = ["IMAGE_SIDE", "IMAGE_TEXT", "IMAGE_TOKENS", "VISION_CONTENDERS", "ShardImageText", "prepare_image_text",
           "print_vision", "resizer", "vision_feed"]

IMAGE_SIDE, PATCH = 336, 14
IMAGE_TOKENS = (IMAGE_SIDE // PATCH) ** 2  # 576
SETTINGS = "image-text.json"
VISION_CONTENDERS = {"packed": "stallfree packed (DALI decode + resize)",
                     "torch-pad": "DataLoader + PIL + resize + DataCollatorForLanguageModeling"}


def _not_drawn(*args: Any) -> Any:
    raise TypeError("the image-text mix is generated as captioned images (prepare_image_text), not drawn as lengths")


IMAGE_TEXT = Mix("image-text", "captioned images", f"one ~375x500 JPEG ({IMAGE_TOKENS} tokens at 336 px, patch "
                 f"{PATCH}) + its caption repeated k times, k lognormal (median 8, sigma 1.0, clipped to 1-170): "
                 "7 to ~1,200 text tokens", _not_drawn)


def resizer() -> tuple[Any, str]:
    """The DataLoader's resize to 336x336 of a PIL image, and its name: torchvision's ``Resize`` or PIL's."""
    try:
        from torchvision.transforms import InterpolationMode, Resize
    except ImportError:
        from PIL import Image

        return ((lambda image: image.resize((IMAGE_SIDE, IMAGE_SIDE), Image.Resampling.BILINEAR)),
                "PIL resize (bilinear, antialiased; torchvision not importable)")
    return (Resize((IMAGE_SIDE, IMAGE_SIDE), InterpolationMode.BILINEAR, antialias=True),
            "torchvision Resize (bilinear, antialiased)")


class ShardImageText:
    """The documents of an image-text shard folder as a map-style Dataset, each as a DataLoader user reads it.

    Row ``i``: ``{"input_ids": [image id] * 576 + its text ids, "pixel_values": (3, 336, 336) float32}``, its image
    decoded by PIL and resized (:func:`resizer`), then scaled to 0-1 and normalized with ImageNet's mean and std.
    """

    def __init__(self, folder: Path, image_token_id: int):
        from stallfree.pipeline.image_text_reader import ImageTextShardReader

        self.folder, self.image_token_id = folder, image_token_id
        self._reader = ImageTextShardReader(folder)
        self._resize, self.resize_name = resizer()

    def __len__(self) -> int:
        return len(self._reader)

    def __getitem__(self, index: int) -> dict[str, Any]:
        import numpy as np
        import torch
        from PIL import Image

        from stallfree.stage_runtime.baseline import MEAN, STD

        row = self._reader.read(index)
        pixels = []
        for encoded in row["images"]:
            image = self._resize(Image.open(io.BytesIO(bytes(encoded))).convert("RGB"))
            x = torch.from_numpy(np.asarray(image, np.float32) / 255).permute(2, 0, 1)
            pixels.append((x - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None])
        ids = [self.image_token_id] * (IMAGE_TOKENS * len(pixels)) + row["tokens"].tolist()
        return {"input_ids": ids, "pixel_values": torch.stack(pixels)}


class _Collate:
    """``DataCollatorForLanguageModeling(mlm=False)`` on the ids; the rows' images stacked beside."""

    def __init__(self) -> None:
        from transformers import DataCollatorForLanguageModeling

        self.text = DataCollatorForLanguageModeling(_pad_tokenizer(), mlm=False)

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        batch = dict(self.text([{"input_ids": r["input_ids"]} for r in rows]))
        batch["pixel_values"] = torch.cat([r["pixel_values"] for r in rows])
        return batch


def _count(mask_key: str) -> Any:
    def count(batch: Any) -> tuple[int, int, tuple[int, ...]]:
        ids = batch["input_ids"]
        real = int((batch[mask_key] >= 0).sum()) if mask_key == "document_index" else int(batch[mask_key].sum())
        return real, ids.numel(), tuple(ids.shape)

    return count


def _images(batch: Any) -> int:
    return int(batch["pixel_values"].shape[0])


def _settings(images: int, seed: int) -> dict[str, Any]:
    return {"images": images, "seed": seed, "law": IMAGE_TEXT.lengths}


def _write_source(src: Path, images: int, seed: int) -> Path:
    """Write the captioned JPEGs and their JSON Lines (texts repeated as the law says) under ``src``."""
    import numpy as np

    from stallfree.ingest.synthetic_captions import make_caption_dataset

    captions = make_caption_dataset(src, count=images, size=(375, 500), vary_size=True, seed=seed)
    rng = np.random.default_rng([seed, 47])
    repeats = np.clip(np.rint(rng.lognormal(np.log(8), 1.0, images)), 1, 170).astype(int)
    rows = [json.loads(line) for line in captions.read_text().splitlines()]
    out = src / "image-text.jsonl"
    out.write_text("".join(json.dumps({"image": r["image"], "text": " ".join([r["text"]] * int(k))}) + "\n"
                           for r, k in zip(rows, repeats, strict=True)))
    return out


def prepare_image_text(data: Path, *, images: int, seed: int, progress: bool) -> MixData:
    """The image-text mix in ``data/image-text``: generated and ingested there first, unless a run of these did.

    Raises:
        ValueError: ``data/image-text`` holds a mix of other settings.
    """
    import numpy as np

    from stallfree.ingest.image_text_runner import ImageTextOptions, ingest_image_text
    from stallfree.pipeline.image_text_reader import ImageTextShardReader

    settings, folder, saved = _settings(images, seed), data / "image-text", data / SETTINGS
    if saved.is_file() and json.loads(saved.read_text()) != settings:
        raise ValueError(f"DATA {data} holds an image-text mix made with other settings ({saved.read_text().strip()},"
                         f" here {json.dumps(settings)}): pass another folder, or the --images and --seed it was made "
                         "with")
    data.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(settings) + "\n")
    if not (folder / "manifest.json").is_file():
        if progress:
            print(f"writing the image-text mix ({images:,} captioned images) to {folder} ...", file=sys.stderr)
        with tempfile.TemporaryDirectory(dir=data, prefix=".generated-") as scratch:
            source = _write_source(Path(scratch), images, seed)
            options = ImageTextOptions(layout="caption", tokenizer=str(Path(scratch) / "tokenizer.json"),
                                       add_eos="</s>", on_error="raise")
            ingest_image_text(source, folder, options, progress=progress)
    reader = ImageTextShardReader(folder)
    lengths = np.asarray(reader.lengths(), np.int64) + IMAGE_TOKENS * np.asarray(reader.image_counts(), np.int64)
    return MixData(IMAGE_TEXT, folder, lengths)


def _vocab(folder: Path) -> int:
    from stallfree.pipeline.image_text_reader import ImageTextShardReader

    vocab = ImageTextShardReader(folder).vocab_size
    if vocab is None:  # the bench ingests with a tokenizer, whose size the manifest keeps
        raise ValueError(f"image-text shards {folder} do not know their vocabulary; delete the folder to remake it")
    return int(vocab)


@contextmanager
def vision_feed(name: str, mix: MixData, args: argparse.Namespace) -> Iterator[Feed]:
    """Contender ``name`` (:data:`VISION_CONTENDERS`) over the image-text ``mix``; shut down on exit."""
    import stallfree
    from stallfree.transforms import Normalize, Resize

    vocab = _vocab(mix.folder)  # the image token's id: one past the text's
    if name == "packed":
        packing = stallfree.Packing(seq_len=args.seq_len, image_tokens=IMAGE_TOKENS, image_token_id=vocab)
        loader = stallfree.Loader(mix.folder, args.batch_size, packing=packing, shuffle=True, seed=args.seed,
                                  transform=[Resize((IMAGE_SIDE, IMAGE_SIDE)), Normalize()])
        with loader:
            yield Feed(lambda: loader, _count("document_index"), images=_images)
        return
    if name != "torch-pad":
        raise ValueError(f"no image-text contender {name!r}; they are {', '.join(VISION_CONTENDERS)}")
    dataset = ShardImageText(mix.folder, vocab)
    batch = padded_batch_size(args.batch_size, args.seq_len, float(mix.lengths.mean()))
    made = _dataloader(dataset, batch, args.workers, _Collate(), args.seed)
    yield Feed(lambda: made, _count("attention_mask"), images=_images, note=dataset.resize_name)


def print_vision(result: dict[str, Any], out: TextIO) -> None:
    """The image-text mix's rows again, in samples: what the two contenders deliver a second, images included."""
    rows = [r for r in result["results"] if r["mix"] == IMAGE_TEXT.name and "skipped" not in r]
    if not rows:
        return
    print(f"\n| image-text contender | samples/s (each one image decoded + resized to {IMAGE_SIDE}x{IMAGE_SIDE}) | "
          "useful tokens/s | efficiency (vision tokens counted) | cores busy | resize |", file=out)
    print("|---|---:|---:|---:|---:|---|", file=out)
    for r in rows:
        print(f"| {r['label']} | {r['samples_per_s']:,.1f} | {r['tokens_per_s']:,.0f} | {r['efficiency']:.3f} | "
              f"{r['cores']:.2f} | {r.get('note', 'DALI Resize (bilinear, antialiased)')} |", file=out)
