"""``stallfree ingest --layout``: image-text rows (caption pairs, LLaVA conversations) into image-text shards.

A run ingests image-text samples when ``--layout`` is given; the token flags (``--tokenizer``, ``--text-field``,
``--add-bos``...) apply as for a token ingest, ``--max-pixels`` as for images, and the other image flags (and
``--tokens-field``: the text is tokenized here) are refused by name.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from stallfree.commands import CliError
from stallfree.commands.output import emit, human, require_writable

__all__ = ["add_image_text_arguments", "image_text_info_lines", "ingest_image_text_command", "is_image_text_run"]

#: The image-text flags: (dest, flag); each None when not given.
_FLAGS = (("image_field", "--image-field"), ("conversations_field", "--conversations-field"),
          ("image_root", "--image-root"), ("image_placeholder", "--image-placeholder"))
#: The flags an image-text ingest refuses: (dest, flag, the value when not given).
_REFUSED = (("max_side", "--max-side", None), ("raw", "--raw", None), ("validate", "--validate", False),
            ("max_sample_bytes", "--max-sample-bytes", None), ("quality", "--quality", 90), ("part", "--part", "0/1"),
            ("merge", "--merge", False), ("ray", "--ray", None), ("parts", "--parts", None),
            ("staging", "--staging", None), ("storage_options", "--storage-options", None),
            ("tokens_field", "--tokens-field", None), ("workers", "--workers", None))

#: How a summary names a layout's samples.
_NOUNS = {"caption": "caption pairs", "conversations": "conversations"}


def add_image_text_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the image-text ingest's flags to ``stallfree ingest``."""
    group = parser.add_argument_group(
        "image-text samples", "SRC: a .jsonl/.json or .parquet file (or a folder of them) of rows holding images "
        "(paths or bytes) and a caption or a LLaVA conversation; text tokenized once with --tokenizer "
        "(docs/ingest.md, Image-text samples)")
    group.add_argument("--layout", choices=("caption", "conversations"), default=None,
                       help="caption: a row's images, then its text (--text-field, default text), all of it a "
                       "target; conversations: LLaVA's list of turns (--conversations-field), in LLaVA v1's "
                       "template, each <image> placeholder where an image goes, the assistant replies the targets")
    group.add_argument("--image-field", metavar="NAME",
                       help="the field of a row's images: one (a path, bytes, or {bytes, path}) or a list (default: "
                       "image, else images)")
    group.add_argument("--conversations-field", metavar="NAME",
                       help="the field of a conversation's turns (default: conversations)")
    group.add_argument("--image-root", metavar="DIR",
                       help="the folder relative image paths start from (default: the source file's folder)")
    group.add_argument("--image-placeholder", metavar="TEXT",
                       help="the text marking an image's place in a conversation (default: <image>)")


def is_image_text_run(args: argparse.Namespace) -> bool:
    """Whether ``stallfree ingest`` ingests image-text samples (``--layout``).

    Raises:
        CliError: an image-text flag without ``--layout``.
    """
    if args.layout is not None:
        return True
    given = [flag for dest, flag in _FLAGS if getattr(args, dest) is not None]
    if given:
        raise CliError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to image-text samples: pass "
                       "--layout caption or --layout conversations too")
    return False


def ingest_image_text_command(args: argparse.Namespace) -> int:
    """``stallfree ingest SRC OUT --layout L``: image-text shards, a summary line, ``--json``."""
    from stallfree.ingest.image_text_runner import ImageTextOptions, ingest_image_text
    from stallfree.ingest.images import DEFAULT_MAX_PIXELS
    from stallfree.ingest.runner import DiskFull

    given = [flag for dest, flag, unset in _REFUSED if getattr(args, dest) != unset]
    if given:
        one = len(given) == 1
        raise CliError(f"{', '.join(given)} do{'es' if one else ''} not apply to an image-text ingest (--layout; "
                       f"docs/ingest.md, Image-text samples); drop {'it' if one else 'them'}")
    other = ({"--conversations-field": args.conversations_field, "--image-placeholder": args.image_placeholder}
             if args.layout == "caption" else {"--text-field": args.text_field})
    given = [flag for flag, value in other.items() if value is not None]
    if given:
        raise CliError(f"{', '.join(given)} do{'es' if len(given) == 1 else ''} not apply to --layout {args.layout}; "
                       "drop it (docs/ingest.md, Image-text samples)")
    if len(args.paths) != 2:
        raise CliError(f"ingest takes SRC and OUT, got {len(args.paths)} paths")
    if args.tokenizer is None:
        raise CliError(f"--layout {args.layout} tokenizes text at ingest: pass --tokenizer PATH (a tokenizer.json, or "
                       "a transformers tokenizer folder)")
    src, out = args.paths
    named = {dest: getattr(args, dest) for dest, _ in _FLAGS if getattr(args, dest) is not None}
    options = ImageTextOptions(
        layout=args.layout, tokenizer=args.tokenizer, text_field=args.text_field or "text",
        special_tokens=args.special_tokens, add_bos=args.add_bos, add_eos=args.add_eos, vocab_size=args.vocab_size,
        shard_mb=args.shard_size, max_pixels=args.max_pixels or DEFAULT_MAX_PIXELS,
        on_error=args.on_error or "skip", **named)
    require_writable(out, "OUT")
    try:
        summary = ingest_image_text(Path(src), Path(out), options, progress=args.progress and sys.stderr.isatty())
    except ImportError as err:  # tokenizers (or transformers) is not installed: the message says what to install
        raise CliError(str(err)) from None
    except DiskFull as err:  # not a usage error (exit 2): the same command succeeds once there is room
        print(f"stallfree ingest: error: {err}", file=sys.stderr)
        return 1
    record = f"{out.rstrip('/')}/rejected.jsonl"
    print(
        f"{summary['documents']} {_NOUNS[args.layout]} with {summary['images']} images and {summary['tokens']} text "
        f"tokens ({summary['token_dtype']}, vocabulary {summary['vocab_size']}) in {summary['shards']} shards "
        f"({summary['shard_mb']:.1f} MB), {summary['rejected']} rejected"
        + (f" (see {record})" if summary["rejected"] else "")
        + f"; {summary['written_shards']} shards written, {summary['resumed_shards']} already done; "
        f"{summary['seconds']:.1f} s, {summary['documents_per_s']:.0f} samples/s",
        file=human(args),
    )
    emit(args, summary)
    if summary["documents"] or not summary["rejected"]:
        return 0
    print(f"stallfree ingest: error: nothing was ingested: all {summary['rejected']} rows were rejected; the reasons "
          f"are in {record}", file=sys.stderr)
    return 1


def image_text_info_lines(where: str, summary: dict[str, Any]) -> list[str]:
    """``stallfree info``'s lines for a folder of image-text shards."""
    tokenizer = summary.get("tokenizer") or {}
    return [
        f"{where}: {summary['documents']} {_NOUNS[summary['layout']]}, {summary['images']} images, {summary['tokens']} "
        f"text tokens ({summary['token_dtype']}, vocabulary {summary['vocab_size']}) in {summary['shards']} shards, "
        f"{summary['bytes'] / 1e6:.1f} MB, {summary['rejected']} rejected at ingest",
        f"source: {summary['source']['path']} (fields {', '.join(summary['source'].get('fields', []))})",
        f"tokenizer: {tokenizer.get('path')}; image placeholder {summary['image_placeholder']!r}",
        f"columns: {', '.join(summary['columns'])}",
    ]
