"""``stallfree ingest`` of token sequences: its flags, how a run is told from an image ingest, and its output.

A run ingests documents when a token flag is given (``--tokenizer``, ``--text-field``, ``--tokens-field``, ...) or
SRC holds token ids with no flag to say so (a JSON Lines file, a Parquet file with an ``input_ids``/``tokens``
column of integer lists, or a folder of them: ``ingest.text_sources.is_token_source``). The image flags do not
apply to it and are refused by name.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from stallfree.commands import CliError
from stallfree.commands.ingest_outcome import nothing_ingested, run_ingest
from stallfree.commands.output import emit, human, require_writable

__all__ = ["add_token_arguments", "ingest_tokens_command", "is_token_run", "token_info_lines"]

#: The token flags: (dest, flag) pairs, each None when not given.
_TOKEN_FLAGS = (("tokenizer", "--tokenizer"), ("text_field", "--text-field"), ("tokens_field", "--tokens-field"),
                ("vocab_size", "--vocab-size"), ("add_bos", "--add-bos"), ("add_eos", "--add-eos"),
                ("on_error", "--on-error"))
#: The image flags a token ingest refuses: (dest, flag, the value when not given).
_IMAGE_FLAGS = (("max_side", "--max-side", None), ("raw", "--raw", None), ("validate", "--validate", False),
                ("max_pixels", "--max-pixels", None), ("max_sample_bytes", "--max-sample-bytes", None),
                ("quality", "--quality", 90), ("part", "--part", "0/1"), ("merge", "--merge", False),
                ("ray", "--ray", None), ("parts", "--parts", None), ("staging", "--staging", None),
                ("storage_options", "--storage-options", None))


def add_token_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the token ingest's flags to ``stallfree ingest``."""
    group = parser.add_argument_group(
        "token sequences", "SRC: a .jsonl/.json, .parquet or .csv file (or a folder of them) of text, tokenized once "
        "with --tokenizer, or of token ids (docs/ingest.md, Token sequences)")
    group.add_argument("--tokenizer", metavar="PATH",
                       help="a local tokenizer.json (Hugging Face tokenizers) or a transformers tokenizer folder; "
                       "nothing is downloaded. Needs pip install 'stallfree[text]'")
    group.add_argument("--text-field", metavar="NAME", help="the column of text to tokenize (default: text)")
    group.add_argument("--tokens-field", metavar="NAME",
                       help="the column of token ids (integer lists; default: input_ids, else tokens)")
    group.add_argument("--vocab-size", type=int, metavar="N",
                       help="refuse ids >= N (default: the tokenizer's vocabulary; without one, ids are checked for "
                       "sign only and the id type is decided by the largest)")
    group.add_argument("--add-bos", nargs="?", const="", metavar="TOKEN",
                       help="put TOKEN at each document's start unless it is there (without TOKEN: a transformers "
                       "tokenizer's bos_token)")
    group.add_argument("--add-eos", nargs="?", const="", metavar="TOKEN",
                       help="put TOKEN at each document's end unless it is there (without TOKEN: a transformers "
                       "tokenizer's eos_token)")
    group.add_argument("--no-special-tokens", dest="special_tokens", action="store_false",
                       help="leave out the tokenizer's own special tokens (its post-processor's: [CLS]/[SEP], <s>), "
                       "which tokenizer.encode(text) adds")
    group.add_argument("--on-error", choices=("raise", "skip"), default=None,
                       help="a bad row (not text, empty, an id out of range, a missing field): stop with an error "
                       "naming the file and row (raise), or leave it out and list it in OUT/rejected.jsonl (skip, "
                       "the default)")


def is_token_run(args: argparse.Namespace) -> bool:
    """Whether ``stallfree ingest`` ingests documents (a token flag, or an SRC of token ids)."""
    from stallfree.ingest.text_sources import is_token_source

    if any(getattr(args, dest) is not None for dest, _ in _TOKEN_FLAGS) or not args.special_tokens:
        return True
    return len(args.paths) == 2 and not args.merge and is_token_source(args.paths[0])


def ingest_tokens_command(args: argparse.Namespace) -> int:
    """``stallfree ingest SRC OUT`` of documents: shards of token ids, a summary line, ``--json``."""
    from stallfree.ingest.token_runner import ingest_tokens
    from stallfree.ingest.token_writer import TokenOptions

    given = [flag for dest, flag, unset in _IMAGE_FLAGS if getattr(args, dest) != unset]
    if given:
        one = len(given) == 1
        raise CliError(f"{', '.join(given)} appl{'ies' if one else 'y'} to images, not to a token ingest "
                       f"(docs/ingest.md, Token sequences); drop {'it' if one else 'them'}")
    if args.workers is not None:
        raise CliError("--workers applies to images: a token ingest encodes on the tokenizer's own threads (all "
                       "cores; set RAYON_NUM_THREADS=N to use fewer)")
    if len(args.paths) != 2:
        raise CliError(f"ingest takes SRC and OUT, got {len(args.paths)} paths")
    src, out = args.paths
    options = TokenOptions(
        text_field=args.text_field, tokens_field=args.tokens_field, tokenizer=args.tokenizer,
        special_tokens=args.special_tokens, add_bos=args.add_bos, add_eos=args.add_eos, vocab_size=args.vocab_size,
        shard_mb=args.shard_size, on_error=args.on_error or "skip",
    )
    require_writable(out, "OUT")
    outcome = run_ingest(lambda: ingest_tokens(Path(src), Path(out), options,
                                               progress=args.progress and sys.stderr.isatty()))
    if isinstance(outcome, int):
        return outcome
    summary = outcome
    record = f"{out.rstrip('/')}/rejected.jsonl"
    vocab = summary["vocab_size"] if summary["vocab_size"] is not None else "unknown"
    print(
        f"{summary['documents']} documents, {summary['tokens']} tokens ({summary['token_dtype']}, vocabulary {vocab}) "
        f"in {summary['shards']} shards ({summary['shard_mb']:.1f} MB from {summary['source_mb']:.1f} MB), "
        f"{summary['rejected']} rejected" + (f" (see {record})" if summary["rejected"] else "")
        + f"; {summary['written_shards']} shards written, {summary['resumed_shards']} already done; "
        f"{summary['seconds']:.1f} s, {summary['documents_per_s']:.0f} documents/s, "
        f"{summary['tokens_per_s']:.0f} tokens/s",
        file=human(args),
    )
    emit(args, summary)
    return nothing_ingested(summary["documents"], summary["rejected"], record, "rows")


def token_info_lines(where: str, summary: dict[str, Any]) -> list[str]:
    """``stallfree info``'s lines for a folder of token shards."""
    vocab = summary["vocab_size"] if summary["vocab_size"] is not None else "unknown"
    tokenizer = summary.get("tokenizer") or {}
    return [
        f"{where}: {summary['documents']} documents, {summary['tokens']} tokens ({summary['token_dtype']}, "
        f"vocabulary {vocab}) in {summary['shards']} shards, {summary['bytes'] / 1e6:.1f} MB, {summary['rejected']} "
        "rejected at ingest",
        f"source: {summary['source']['kind']} {summary['source']['path']} (field {summary['source'].get('field')})",
        f"tokenizer: {tokenizer.get('path', 'none (token ids ingested as they were)')}",
        f"columns: {', '.join(summary['columns'])}",
    ]
