"""``bench packing``'s data: three generated length mixes, ingested into token shards as a user's documents would be.

Each mix is a set of documents whose lengths follow a stated law and whose ids are uniform in ``1 .. vocab - 1``
(id 0 is left to padding, so that a collator that finds padding by its id finds only padding), drawn from
``(seed, mix)`` alone: the same settings give the same documents. They are written as a Parquet file with an
``input_ids`` column and ingested by the library call ``stallfree ingest`` makes
(:func:`~stallfree.ingest.token_runner.ingest_tokens`), so every contender reads real token shards::

    DATA/bench-packing.json     the settings the data was made with (a rerun with the same ones reuses it)
    DATA/chat/  DATA/long/  DATA/bimodal/     token shards (manifest.json, shard-*.arrow, lengths.npy)

Documents are drawn until their tokens reach the mix's budget (``--tokens``).
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

__all__ = ["MIXES", "MixData", "Mix", "prepare"]

SETTINGS = "bench-packing.json"


@dataclass(frozen=True)
class Mix:
    """A law of document lengths: ``draw(rng, n, seq_len)`` gives ``n`` lengths (int64, each >= 1)."""

    name: str
    kind: str  # what documents it stands for
    lengths: str  # the law, in words: what --help and the table say
    draw: Callable[[np.random.Generator, int, int], np.ndarray]


def _lognormal(median: float, sigma: float, low: int, high: int) -> Callable[..., np.ndarray]:
    def draw(rng: np.random.Generator, n: int, seq_len: int) -> np.ndarray:
        import numpy as np

        return np.clip(np.rint(rng.lognormal(np.log(median), sigma, n)), low, high).astype(np.int64)

    return draw


def _bimodal(rng: np.random.Generator, n: int, seq_len: int) -> np.ndarray:
    import numpy as np

    short = rng.integers(16, 129, n)
    near = rng.integers(max(1, (3 * seq_len) // 4), seq_len + 1, n)
    return np.where(rng.random(n) < 0.75, short, near).astype(np.int64)


MIXES = {
    mix.name: mix
    for mix in (
        Mix("chat", "chat/instruction", "lognormal, median 200 tokens, sigma 1.0 (mean ~330), clipped to 16-4096: "
            "most 50-800, a tail to 4096", _lognormal(200, 1.0, 16, 4096)),
        Mix("long", "long documents", "lognormal, median 3000 tokens, sigma 0.6, clipped to 256-32768: 90% within "
            "1.1k-8k, many longer than S (split over rows)", _lognormal(3000, 0.6, 256, 32768)),
        Mix("bimodal", "bimodal", "75% very short (uniform 16-128 tokens), 25% near S (uniform 0.75 S - S)", _bimodal),
    )
}


@dataclass(frozen=True)
class MixData:
    """An ingested mix: its token-shard folder, every document's length, and the law they follow."""

    mix: Mix
    folder: Path
    lengths: np.ndarray  # int64, in row order

    def stats(self, seq_len: int) -> dict[str, Any]:
        """The lengths in numbers: what the table states beside the law."""
        import numpy as np

        n = self.lengths
        return {"kind": self.mix.kind, "lengths": self.mix.lengths, "documents": len(n), "tokens": int(n.sum()),
                "mean": float(n.mean()), "p50": int(np.percentile(n, 50)), "p95": int(np.percentile(n, 95)),
                "max": int(n.max()), "longer_than_seq_len": float((n > seq_len).mean())}


def _settings(names: list[str], tokens: int, seq_len: int, seed: int, vocab: int) -> dict[str, Any]:
    # bimodal's law depends on S, so the data does too
    return {"tokens_per_mix": tokens, "seq_len": seq_len, "seed": seed, "vocab_size": vocab,
            "laws": {name: MIXES[name].lengths for name in names}}


def _check_data(data: Path, settings: dict[str, Any]) -> None:
    """Refuse a DATA that is a file, or a non-empty folder that holds no data of these settings."""
    if data.exists() and not data.is_dir():
        raise ValueError(f"DATA {data} is a file: pass an empty (or new) folder for the bench's token shards")
    if not data.exists() or not any(data.iterdir()):
        return
    saved_path = data / SETTINGS
    saved = json.loads(saved_path.read_text()) if saved_path.is_file() else None
    if saved is None:
        raise ValueError(f"DATA {data} is not empty and holds no bench packing data: pass an empty (or new) folder, "
                         "where the bench writes its generated documents")
    mine = {k: v for k, v in settings.items() if k != "laws"}
    theirs = {k: v for k, v in saved.items() if k != "laws"}
    if mine != theirs or any(saved["laws"].get(k, v) != v for k, v in settings["laws"].items()):
        raise ValueError(f"DATA {data} holds bench packing data made with other settings ({theirs}, here {mine}): "
                         "pass an empty (or new) folder, or the settings it was made with")


def _generate(mix: Mix, index: int, tokens: int, seq_len: int, seed: int, vocab: int, parquet: Path) -> None:
    """Write ``mix``'s documents (``tokens`` in all, at least) as a Parquet file of ``input_ids``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng([seed, index])
    parts: list[np.ndarray] = []
    total = 0
    while total < tokens:  # draw in blocks until the budget is reached, then cut at the first document past it
        block = mix.draw(rng, 4096, seq_len)
        parts.append(block)
        total += int(block.sum())
    lengths = np.concatenate(parts)
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), tokens)) + 1]
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = rng.integers(1, vocab, int(offsets[-1]), dtype=np.uint16 if vocab <= 1 << 16 else np.int32)
    column = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(ids))
    pq.write_table(pa.table({"input_ids": column}), parquet, row_group_size=16384)


def prepare(data: Path, names: list[str], *, tokens: int, seq_len: int, seed: int, vocab: int,
            progress: bool) -> dict[str, MixData]:
    """The mixes ``names`` in ``data``: generated and ingested there first, unless a run of these settings did.

    Raises:
        ValueError: ``data`` is a file, or a non-empty folder that holds no bench data of these settings.
    """
    import numpy as np

    from stallfree.ingest.token_runner import ingest_tokens
    from stallfree.ingest.token_writer import TokenOptions
    from stallfree.pipeline.token_readers import TokenShardReader

    settings = _settings(names, tokens, seq_len, seed, vocab)
    _check_data(data, settings)
    data.mkdir(parents=True, exist_ok=True)
    saved_path = data / SETTINGS
    if saved_path.is_file():  # this run may add mixes an earlier one left out
        settings["laws"] = {**json.loads(saved_path.read_text())["laws"], **settings["laws"]}
    saved_path.write_text(json.dumps(settings, indent=1) + "\n")
    mixes = {}
    for name in names:
        folder = data / name
        if not (folder / "manifest.json").is_file():  # an ingest cut short resumes where it stopped
            if progress:
                print(f"writing the {name} mix ({tokens:,} tokens) to {folder} ...", file=sys.stderr)
            with tempfile.TemporaryDirectory(dir=data, prefix=".generated-") as scratch:
                parquet = Path(scratch) / f"{name}.parquet"
                _generate(MIXES[name], list(MIXES).index(name), tokens, seq_len, seed, vocab, parquet)
                ingest_tokens(parquet, folder, TokenOptions(tokens_field="input_ids", vocab_size=vocab,
                                                            on_error="raise"), progress=progress)
        lengths = np.asarray(TokenShardReader(folder).lengths(), np.int64)
        mixes[name] = MixData(MIXES[name], folder, lengths)
    return mixes
