"""Graph rebuilds under fire: a Loader over hostile and good images, ``on_error="skip"``, run in a loop of processes.

Every sample that fails inside DALI makes the graph rebuild its pipeline (DALI calls a failed pipeline no longer
valid), while the next batch may be in it. A rebuild that dropped the failed pipeline with a batch still scheduled,
and tore it down later while its replacement ran, crashed the process with SIGSEGV in 6 of about 66 runs. This
benchmark writes a folder of images that pass the header check but fail (or warn) in DALI's decoders, mixed with
good ones, then runs ``--runs`` processes, each iterating ``--epochs`` epochs over it, and counts how each ended:
every run should exit 0 having delivered every batch. A run that crashes is kept with its signal and last stderr.
"""

from __future__ import annotations

import argparse
import io
import signal
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:  # numpy is imported where it is used: `stallfree --help` imports no numpy
    import numpy as np

__all__ = ["add_arguments", "run", "write_hostile_folder"]

EXAMPLES = """examples:
  stallfree bench rebuilds ./hostile --runs 100
  stallfree bench rebuilds ./hostile --runs 20 --parallel 2 --json-file rebuilds.json
"""

_RUN = """
import sys
from stallfree import Loader
from stallfree.transforms import RandomHorizontalFlip, RandomResizedCrop
loader = Loader(sys.argv[1], batch_size=8, transform=[RandomResizedCrop(32), RandomHorizontalFlip()],
                on_error="skip", seed=int(sys.argv[2]), num_threads=2)
for epoch in range(int(sys.argv[3])):
    batches = sum(1 for _ in loader)
    assert batches == len(loader), (batches, len(loader))
print(len(loader.skipped))
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options."""
    parser.add_argument("data", type=Path, help="folder for the hostile images (written when it holds none)")
    parser.add_argument("--runs", type=int, default=100, help="processes to run (default 100)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs each process iterates (default 2)")
    parser.add_argument("--parallel", type=int, default=2, help="processes at once (default 2)")


def _encode(rng: np.random.Generator, fmt: str, size: tuple[int, int]) -> bytearray:
    import numpy as np
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(buffer, fmt)
    return bytearray(buffer.getvalue())


def _hostile(rng: np.random.Generator) -> dict[str, bytes]:
    """One of each kind of file that passes the header check but fails or warns in DALI's decoders."""
    import numpy as np

    jpeg, png = _encode(rng, "JPEG", (48, 64)), _encode(rng, "PNG", (48, 64))
    three_bit = bytearray(jpeg)
    three_bit[three_bit.find(b"\xff\xc0") + 4] = 3  # "Unsupported JPEG data precision 3"
    garbage = bytearray(jpeg)
    scan = garbage.find(b"\xff\xda") + 20
    garbage[scan:-2] = rng.integers(0, 256, len(garbage) - scan - 2, dtype=np.uint8).tobytes()
    idat = bytearray(png)
    at = idat.find(b"IDAT") + 8
    idat[at:at + 40] = bytes(40)  # "IDAT: invalid stored block lengths"
    webp, bmp, tiff = _encode(rng, "WEBP", (48, 64)), _encode(rng, "BMP", (48, 64)), _encode(rng, "TIFF", (48, 64))
    webp[40:80] = bytes(40)
    return {
        "jpeg-truncated.jpg": bytes(jpeg[: len(jpeg) * 6 // 10]), "jpeg-3bit.jpg": bytes(three_bit),
        "jpeg-garbage.jpg": bytes(garbage), "png-truncated.png": bytes(png[: len(png) // 2]),
        "png-idat.png": bytes(idat), "webp-damaged.webp": bytes(webp), "bmp-truncated.bmp": bytes(bmp[: len(bmp) // 3]),
        "tiff-truncated.tif": bytes(tiff[: len(tiff) // 2]),
    }


def write_hostile_folder(root: Path, *, copies: int = 12, good: int = 150, seed: int = 0) -> Path:
    """An ImageFolder tree: ``copies`` of each hostile kind in ``bad/``, ``good`` JPEGs of varied sizes in ``good/``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    (root / "bad").mkdir(parents=True, exist_ok=True)
    (root / "good").mkdir(parents=True, exist_ok=True)
    for k in range(copies):
        for name, data in _hostile(rng).items():
            (root / "bad" / f"{k:02d}-{name}").write_bytes(data)
    for k in range(good):
        size = (int(rng.integers(40, 120)), int(rng.integers(40, 120)))
        (root / "good" / f"{k:03d}.jpg").write_bytes(bytes(_encode(rng, "JPEG", size)))
    return root


def _one(script: str, data: Path, seed: int, epochs: int) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-c", script, str(data), str(seed), str(epochs)], capture_output=True,
                          text=True, timeout=600, check=False)
    return done.returncode, done.stderr[-400:]


def _ending(code: int) -> str:
    if code >= 0:
        return f"exit {code}"
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def run(args: argparse.Namespace, out: TextIO) -> dict[str, Any]:
    """Run the benchmark, print its table to ``out`` and return its results (JSON-able)."""
    from tqdm import tqdm

    if args.runs < 1 or args.epochs < 1 or args.parallel < 1:
        raise ValueError(f"--runs, --epochs and --parallel must be >= 1, got {args.runs}, {args.epochs}, "
                         f"{args.parallel}")
    data = Path(args.data)
    if not data.exists() or not any(data.rglob("*.*")):
        write_hostile_folder(data)
    start = time.perf_counter()
    endings: Counter[str] = Counter()
    failures: list[dict[str, Any]] = []
    with ThreadPoolExecutor(args.parallel) as pool, tqdm(total=args.runs, desc="runs", file=sys.stderr,
                                                         disable=not getattr(args, "progress", True)) as bar:
        for seed, (code, stderr) in enumerate(pool.map(lambda s: _one(_RUN, data, s, args.epochs), range(args.runs))):
            endings[_ending(code)] += 1
            if code != 0:
                failures.append({"seed": seed, "ending": _ending(code), "stderr": stderr})
            bar.update()
    seconds = time.perf_counter() - start
    print(f"{args.runs} runs of {args.epochs} epochs over {data} ({args.parallel} at once, {seconds:.0f} s):", file=out)
    for ending, count in sorted(endings.items()):
        print(f"  {ending:>10}: {count}", file=out)
    for failure in failures[:5]:
        print(f"  seed {failure['seed']}: {failure['ending']}: {failure['stderr'].strip()[-200:]}", file=out)
    return {"runs": args.runs, "epochs": args.epochs, "endings": dict(endings), "failures": failures,
            "seconds": seconds}
