"""``stallfree demo --vision``: a vision-language model trained end to end on generated captions, from one command.

1. Generate: ``--images`` captioned images of coloured shapes (``make_caption_dataset``: JPEGs, ``captions.jsonl``,
   a word-level ``tokenizer.json``), and a held-out quarter of another seed.
2. Ingest them as image-text shards (``stallfree ingest --layout caption``'s library call).
3. Train ``vlm_tiny`` (``gpt_tiny`` with a patch-embedding vision stem) in 2 pipeline stages with 1F1B, fed by the
   Loader's image-text packs (each image 4 tokens of a 32-token row, resized in the DALI graph), and report the loss
   from its first steps to its last and the held-out next-token accuracy beside what the text alone allows.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from stallfree.commands.output import emit, human

__all__ = ["TEXT_ALONE", "vision_demo"]

TEXT_ALONE = 0.66  # about the caption words' accuracy a model can reach without reading the image (docs/train.md)


def _step(title: str) -> None:
    print(f"\n== {title}", file=sys.stderr, flush=True)


def vision_demo(args: argparse.Namespace, images: int, epochs: int) -> int:
    """Run the vision demo under ``args`` (``out``, ``keep_data``, ``progress``, ``json``); 0 when it trained."""
    from stallfree.core.atomic import atomic_write
    from stallfree.core.dali import require_dali

    require_dali()  # before the images are written, not after
    from stallfree.ingest.image_text_runner import ImageTextOptions, ingest_image_text
    from stallfree.ingest.synthetic_captions import make_caption_dataset
    from stallfree.stage_runtime.jobs import train
    from stallfree.stage_runtime.train.report import format_summary
    from stallfree.stage_runtime.train.trainer import vision_demo_config

    out = human(args)
    result: dict[str, Any] = {"ingest": {}, "out": str(args.out)}
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="stallfree-demo-vision-") as tmp:
        data = args.out / "data" if args.keep_data else Path(tmp)
        _step(f"1/3 generate {images} captioned images of coloured shapes (and a held-out {max(16, images // 4)})")
        captions = {split: make_caption_dataset(data / "captions" / split, count=count, size=(48, 48),
                                                vary_size=True, seed=seed)
                    for split, count, seed in (("train", images, 0), ("val", max(16, images // 4), 1))}
        _step("2/3 ingest them as image-text shards (stallfree ingest --layout caption)")
        for split, source in captions.items():
            options = ImageTextOptions(layout="caption", tokenizer=str(source.parent / "tokenizer.json"),
                                       add_eos="</s>")
            summary = ingest_image_text(source, data / "shards" / split, options, progress=args.progress)
            result["ingest"][split] = summary
        _step("3/3 train vlm_tiny (a patch-embedding vision stem + transformer) in 2 pipeline stages with 1F1B, fed "
              "by the Loader's image-text packs")
        config = vision_demo_config(str(data / "shards" / "train"), str(data / "shards" / "val"),
                                    str(args.out / "run-vision"), epochs=epochs, progress=args.progress)
        result["train"] = train(config)
        print(format_summary(result["train"]), file=out)
        rows = (args.out / "run-vision" / "train.jsonl").read_text().splitlines()
        losses = [json.loads(line)["loss"] for line in rows if "loss" in json.loads(line)]
        result["loss_first"], result["loss_last"] = losses[0], losses[-1]
        print(f"\nloss {losses[0]:.2f} at the first step, {losses[-1]:.2f} at the last", file=out)
        accuracy = result["train"].get("eval_top1")
        if accuracy is not None:
            print(f"held-out next-token accuracy {accuracy:.1%}; reading the captions alone, without their images, "
                  f"allows about {TEXT_ALONE:.0%}", file=out)
    atomic_write(args.out / "demo-vision.json", (json.dumps(result, indent=1, default=str) + "\n").encode())
    kept = ["run-vision/ (summary.json, trace.json, checkpoints)", "demo-vision.json"]
    kept += ["data/ (the captions and their shards)"] if args.keep_data else []
    print(f"\nresults in {args.out}: {', '.join(kept)}", file=out)
    emit(args, result)
    return 0
