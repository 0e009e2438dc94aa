"""``stallfree ingest``, ``stallfree verify`` and ``stallfree info``: datasets into Arrow shards, and their checks."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from stallfree.commands.ingest_image_text import (
    add_image_text_arguments,
    image_text_info_lines,
    ingest_image_text_command,
    is_image_text_run,
)
from stallfree.commands.ingest_tokens import (
    add_token_arguments,
    ingest_tokens_command,
    is_token_run,
    token_info_lines,
)
from stallfree.commands.output import add_json_arguments, add_progress_argument, emit, human, require_writable

__all__ = ["register"]

_FORMAT = argparse.RawDescriptionHelpFormatter


def _raw(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)[xX](\d+)", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"--raw must be HxW, e.g. 32x32, got {text!r}")
    return int(match[1]), int(match[2])


def _storage_options(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"--storage-options must be a JSON object, got {text!r} ({err})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"--storage-options must be a JSON object ({{...}}), got {text!r}")
    return value


def _add_storage_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--storage-options", type=_storage_options, metavar="JSON",
                        help="for a URL: the fsspec file system's options as a JSON object, e.g. "
                        "'{\"endpoint_url\": \"https://s3.example.com\"}'; leave credentials to the environment "
                        "(AWS_*, ~/.aws, Google's default credentials), where other users' ps does not show them")


def _shown(where: str) -> str:
    """``where`` as printed: a URL without its credentials."""
    from stallfree.ingest.remote import is_url, redact

    return redact(where) if is_url(where) else where


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``stallfree ingest``, ``stallfree verify`` and ``stallfree info``."""
    parser = sub.add_parser(
        "ingest",
        help="turn a dataset into memory-mapped Arrow shards the Loader reads zero-copy",
        description="Write SRC (an ImageFolder tree, a CSV/Parquet file list with path and label columns, Parquet "
        "holding image bytes, or WebDataset .tar shards) into OUT as uncompressed Arrow IPC shards and a "
        "manifest.json. Images failing their checks go to OUT/rejected.jsonl. Interrupted runs (killed, or "
        "stopped by a full disk: exit code 1) resume when run again with the same arguments; one run at a time may "
        "write OUT (or each --part of it): a second is refused, naming the first's pid and source. OUT may be a URL "
        "(s3://, gs://, file://): shards are written to a local staging folder and each is uploaded once complete, "
        "the manifest last, so a reader never finds a manifest whose shards are missing; a rerun uploads only what "
        "is missing. SRC may also be documents (a .jsonl, .parquet or .csv file or a folder of them): text tokenized "
        "once with --tokenizer, or token ids, written as token shards (docs/ingest.md, Token sequences); with "
        "--layout, image-text samples (caption pairs, LLaVA conversations) as image-text shards (docs/ingest.md, "
        "Image-text samples). Docs: docs/ingest.md, docs/remote.md.",
        usage="%(prog)s [options] SRC OUT\n       %(prog)s --merge [options] OUT",
        epilog="examples:\n"
        "  stallfree ingest ~/imagenet/train ./shards/train --workers 8 --max-side 256\n"
        "  stallfree ingest ./cifar-folder ./shards/cifar --raw 32x32\n"
        "  stallfree ingest ~/imagenet/train s3://bucket/imagenet/train/ --max-side 256   # upload as shards finish\n"
        "  stallfree ingest list.csv ./shards --part 0/4      # on each of 4 machines, i = 0..3\n"
        "  stallfree ingest --merge ./shards                   # then once, after copying the parts together\n"
        "  stallfree ingest ~/imagenet/train s3://bucket/train/ --part 0/4   # parts straight to a store,\n"
        "  stallfree ingest --merge s3://bucket/train/                       # then joined there\n"
        "  stallfree ingest /nfs/imagenet/train /nfs/shards/train --ray 10.0.0.5:6379   # parts as Ray tasks, merged\n"
        "  stallfree ingest ./cifar-folder ./shards/cifar --ray --parts 8   # RAY_ADDRESS's cluster, or a local one\n"
        "  stallfree ingest corpus.jsonl ./shards/text --tokenizer tokenizer.json --add-eos '</s>'   # token shards\n"
        "  stallfree ingest ./parquet-folder ./shards/ids --tokens-field input_ids --vocab-size 50257\n"
        "  stallfree ingest captions.jsonl ./shards/vl --tokenizer tokenizer.json --layout caption\n"
        "  stallfree ingest llava.json ./shards/chat --tokenizer ./tok --layout conversations --image-root ./images",
        formatter_class=_FORMAT,
    )
    parser.add_argument("paths", nargs="+", metavar="SRC OUT",
                        help="source and output folder or URL (with --merge: only the output folder)")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes checking and converting images (default: the cores this process may use; "
                        "with --ray: per task, each task asking Ray for that many CPUs, default 1)")
    parser.add_argument("--shard-size", type=float, default=256.0, metavar="MB",
                        help="target shard size in MB, estimated from source bytes (default 256)")
    parser.add_argument("--max-side", type=int, metavar="N",
                        help="re-encode images whose longer side exceeds N as JPEG with longer side N")
    parser.add_argument("--quality", type=int, default=90, help="JPEG quality of re-encoded images (default 90)")
    parser.add_argument("--raw", type=_raw, metavar="HxW",
                        help="store decoded RGB uint8 pixels resized to HxW (small images: no decode at load time)")
    parser.add_argument("--validate", action="store_true", help="decode every image fully, not only its header")
    parser.add_argument("--max-pixels", type=int, default=None,
                        help="reject images whose header claims more pixels (default 178956970)")
    parser.add_argument("--max-sample-bytes", type=int, default=None, metavar="BYTES",
                        help="reject samples (files, tar members, Parquet cells) larger than this before reading "
                        "them (default 268435456 = 256 MiB)")
    parser.add_argument("--part", default="0/1", metavar="i/N",
                        help="list and ingest only the i-th of N contiguous slices of SRC (its class folders, rows, "
                        "row groups or tars); then --merge")
    parser.add_argument("--merge", action="store_true", help="join OUT's manifest.part-*.json into manifest.json")
    parser.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                        help="run the parts as Ray tasks on a cluster, then merge them into OUT: the cluster at "
                        "ADDRESS (HOST:PORT), or without a value RAY_ADDRESS's, else a local one. SRC and OUT must be "
                        "at the same path on every node (a network file system), or OUT a URL. A rerun resumes. "
                        "Needs pip install 'stallfree[ray]' (docs/ingest.md, Ray)")
    parser.add_argument("--parts", type=int, metavar="N",
                        help="with --ray: how many parts (tasks) (default: the split an unfinished OUT holds, else "
                        "the cluster's CPUs / --workers)")
    parser.add_argument("--staging", type=Path, metavar="DIR",
                        help="with OUT a URL: write the shards here before uploading them, and keep them (default: a "
                        "folder per URL under $STALLFREE_CACHE_DIR/ingest, by default ~/.cache/stallfree/ingest, "
                        "removed once the manifest is uploaded)")
    _add_storage_options(parser)
    add_token_arguments(parser)
    add_image_text_arguments(parser)
    add_json_arguments(parser)
    add_progress_argument(parser, quiet=True)
    parser.set_defaults(func=_ingest)

    verify = sub.add_parser(
        "verify",
        help="re-check an ingested dataset's shard checksums (and decode with --decode)",
        description="Check that every shard in OUT exists, has its manifest size and SHA-256 and opens as Arrow; "
        "exit code 1 and one line per problem when something is wrong. OUT may be a URL (s3://, gs://, https://, "
        "file://): each shard is downloaded in turn to a temporary folder and checked there.",
        epilog="examples:\n  stallfree verify ./shards/train\n  stallfree verify ./shards/train --decode\n"
        "  stallfree verify s3://bucket/imagenet/train/",
        formatter_class=_FORMAT,
    )
    verify.add_argument("out", help="an ingested folder (holding manifest.json), or its URL")
    verify.add_argument("--decode", action="store_true", help="also decode every image")
    add_progress_argument(verify, quiet=True)
    _add_storage_options(verify)
    add_json_arguments(verify)
    verify.set_defaults(func=_verify)

    info = sub.add_parser(
        "info",
        help="summarise an ingested dataset: rows, classes, size, per-class counts",
        description="Print what OUT's manifest says: rows, shards, size, classes with counts, source and options. "
        "OUT may be a URL (s3://, gs://, https://, file://): only its manifest is read.",
        epilog="examples:\n  stallfree info ./shards/train\n  stallfree info ./shards/train --json | jq .classes\n"
        "  stallfree info https://data.example.com/imagenet/train/",
        formatter_class=_FORMAT,
    )
    info.add_argument("out", help="an ingested folder (holding manifest.json), or its URL")
    _add_storage_options(info)
    add_json_arguments(info)
    add_progress_argument(info)  # it shows none (one manifest is read), but every command takes the flag
    info.set_defaults(func=_info)


def _ingest(args: argparse.Namespace) -> int:
    from stallfree.ingest.merge import merge
    from stallfree.ingest.remote import is_url
    from stallfree.ingest.runner import DiskFull, ingest, parse_part
    from stallfree.ingest.sources import DEFAULT_MAX_SAMPLE_BYTES
    from stallfree.ingest.validate import DEFAULT_MAX_PIXELS
    from stallfree.ingest.writer import IngestOptions

    if is_image_text_run(args):
        return ingest_image_text_command(args)
    if is_token_run(args):
        return ingest_tokens_command(args)
    if args.parts is not None and args.ray is None:
        raise ValueError("--parts applies to --ray; split by hand with --part i/N")
    if args.ray is not None and (args.merge or args.part != "0/1"):
        raise ValueError("--ray runs every part and merges them itself; drop --merge and --part")
    if args.merge:
        if len(args.paths) != 1:
            raise ValueError(f"--merge takes only the output folder, got {len(args.paths)} paths")
        target = args.paths[0]
        if is_url(target):
            if args.staging is not None:
                raise ValueError("--staging applies to an ingest, not to --merge")
            summary = merge(target, storage_options=args.storage_options)
        elif args.storage_options is not None or args.staging is not None:
            raise ValueError(f"--staging and --storage-options apply to parts at a URL, but OUT is {target!r}; drop "
                             "them")
        else:
            require_writable(target, "OUT")
            summary = merge(target)
        print(f"merged {summary['parts']} parts: {summary['images']} images in {summary['shards']} shards, "
              f"{summary['rejected']} rejected", file=human(args))
        emit(args, summary)
        return _nothing_ingested(summary, f"{_shown(target).rstrip('/')}/rejected.jsonl")
    if len(args.paths) != 2:
        raise ValueError(f"ingest takes SRC and OUT, got {len(args.paths)} paths")
    options = IngestOptions(
        shard_mb=args.shard_size, max_side=args.max_side, quality=args.quality, raw=args.raw,
        validate=args.validate, max_pixels=args.max_pixels or DEFAULT_MAX_PIXELS,
        max_sample_bytes=DEFAULT_MAX_SAMPLE_BYTES if args.max_sample_bytes is None else args.max_sample_bytes,
    )
    src, out = args.paths
    remote = is_url(out)
    if not remote:
        require_writable(out, "OUT")
    if not remote and (args.staging is not None or args.storage_options is not None):
        raise ValueError(f"--staging and --storage-options apply to an OUT at a URL (s3://, gs://, file://), but OUT "
                         f"is {out!r}; drop them")
    extra = {"staging": args.staging, "storage_options": args.storage_options} if remote else {}
    if args.ray is not None:
        return _ingest_on_ray(args, src, out, options, extra)
    try:
        summary = ingest(Path(src), out if remote else Path(out), options,
                         workers=len(os.sched_getaffinity(0)) if args.workers is None else args.workers,
                         part=parse_part(args.part), progress=args.progress and sys.stderr.isatty(), **extra)
    except DiskFull as err:  # not a usage error (exit 2): the same command succeeds once there is room
        print(f"stallfree ingest: error: {err}", file=sys.stderr)
        return 1
    index, count = parse_part(args.part)
    name = "rejected.jsonl" if count == 1 else f"manifest.part-{index}-of-{count}.json"
    record = f"{_shown(out).rstrip('/')}/{name}"
    uploads = (f"; {summary['uploaded_shards']} shards uploaded to {summary['url']}, {summary['stored_shards']} "
               "there already" if remote else "")
    print(
        f"{summary['images']} images in {summary['shards']} shards ({summary['shard_mb']:.1f} MB from "
        f"{summary['source_mb']:.1f} MB), {summary['rejected']} rejected"
        + (f" (see {record})" if summary["rejected"] else "")
        + f"; {summary['written_shards']} shards written, {summary['resumed_shards']} already done{uploads}; "
        f"{summary['seconds']:.1f} s, {summary['images_per_s']:.0f} images/s, {summary['mb_per_s']:.1f} MB/s",
        file=human(args),
    )
    emit(args, summary)
    return _nothing_ingested(summary, record)


def _ingest_on_ray(args: argparse.Namespace, src: str, out: str, options: Any, extra: dict[str, Any]) -> int:
    """``stallfree ingest SRC OUT --ray [ADDRESS]``: the parts as Ray tasks, then merged."""
    from stallfree.ingest.ray_ingest import PartFailed, ingest_on_ray
    from stallfree.ingest.runner import DiskFull

    try:
        summary = ingest_on_ray(src, out, options, parts=args.parts, address=args.ray or None,
                                cpus_per_task=1 if args.workers is None else args.workers,
                                progress=args.progress and sys.stderr.isatty(), **extra)
    except (PartFailed, DiskFull, ConnectionError) as err:  # not usage errors (exit 2): a rerun may succeed
        print(f"stallfree ingest: error: {err}", file=sys.stderr)
        return 1
    record = f"{_shown(out).rstrip('/')}/rejected.jsonl"
    uploads = (f"; {summary['uploaded_shards']} shards uploaded to {summary['url']}, {summary['stored_shards']} "
               "there already" if "url" in summary else "")
    print(
        f"{summary['images']} images in {summary['shards']} shards ({summary['shard_mb']:.1f} MB from "
        f"{summary['source_mb']:.1f} MB), {summary['rejected']} rejected"
        + (f" (see {record})" if summary["rejected"] else "")
        + f"; {summary['parts']} parts on the Ray cluster at {summary['address']}: {summary['written_shards']} shards "
        f"written, {summary['resumed_shards']} already done{uploads}; {summary['seconds']:.1f} s, "
        f"{summary['images_per_s']:.0f} images/s, {summary['mb_per_s']:.1f} MB/s",
        file=human(args),
    )
    emit(args, summary)
    return _nothing_ingested(summary, record)


def _nothing_ingested(summary: dict[str, Any], record: str) -> int:
    """Exit code 1 and one line when every sample was rejected: a dataset of no images is not a success."""
    if summary["images"] or not summary["rejected"]:
        return 0
    print(f"stallfree ingest: error: nothing was ingested: all {summary['rejected']} samples were rejected; "
          f"the reasons are in {record}", file=sys.stderr)
    return 1


def _verify(args: argparse.Namespace) -> int:
    from stallfree.ingest.remote import is_url
    from stallfree.ingest.verify import verify

    out = args.out if is_url(args.out) else Path(args.out)
    problems = verify(out, decode=args.decode, storage_options=args.storage_options,
                      progress=args.progress and sys.stderr.isatty())
    for problem in problems:
        print(problem, file=human(args))
    print(f"{_shown(args.out)}: {'OK' if not problems else f'{len(problems)} problem(s)'}", file=sys.stderr)
    emit(args, {"out": _shown(args.out), "ok": not problems, "problems": problems})
    return 1 if problems else 0


def _info(args: argparse.Namespace) -> int:
    from stallfree.ingest.remote import is_url
    from stallfree.ingest.verify import info

    summary = info(args.out if is_url(args.out) else Path(args.out), args.storage_options)
    emit(args, summary)
    if args.json:
        return 0  # the JSON holds everything the text would say
    if summary.get("kind") == "tokens":
        print("\n".join(token_info_lines(_shown(args.out), summary)))
        return 0
    if summary.get("kind") == "image_text":
        print("\n".join(image_text_info_lines(_shown(args.out), summary)))
        return 0
    kind = summary["image"]["kind"] + (f" {summary['image']['shape']}" if summary["image"]["shape"] else "")
    print(f"{_shown(args.out)}: {summary['rows']} rows in {summary['shards']} shards, {summary['bytes'] / 1e6:.1f} MB, "
          f"images {kind}, {summary['rejected']} rejected at ingest")
    print(f"source: {summary['source']['kind']} {summary['source']['path']}")
    print(f"columns: {', '.join(summary['columns'])}")
    print(f"{len(summary['classes'])} classes:")
    width = max((len(name) for name in summary["classes"]), default=0)
    for name, count in summary["classes"].items():
        print(f"  {name:<{width}}  {count}")
    return 0
