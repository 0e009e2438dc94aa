"""A read-only current folder: the commands that write there by default refuse in one line, before any work.

Issue 44, item 16: ``train`` (default ``--out``), ``ingest`` (a relative OUT) and ``profile`` (default ``--out``)
ended in an ``OSError: [Errno 30] Read-only file system`` traceback (``profile`` after all its measurements). The
folder is made read-only as a read-only bind mount in a mount namespace of the command's own: the tests run as root,
for whom ``chmod 0o555`` stops no write.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# Run "$@" in "$0", a folder bind-mounted read-only over itself, in a user and mount namespace of its own.
READ_ONLY = 'mount --bind -o ro "$0" "$0" && cd "$0" && exec "$@"'


@pytest.fixture
def read_only(tmp_path: Path) -> Path:
    folder = tmp_path / "read-only"
    folder.mkdir()
    probe = subprocess.run(["unshare", "--map-root-user", "--mount", "sh", "-c", f"{READ_ONLY} 2>&1", str(folder),
                            "touch", "probe"], capture_output=True, text=True, timeout=60)
    if probe.returncode == 0 or "Read-only file system" not in probe.stdout:
        pytest.skip(f"cannot make a read-only bind mount here (unshare --map-root-user --mount): {probe.stdout!r}")
    return folder


def _run_in(folder: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["unshare", "--map-root-user", "--mount", "sh", "-c", READ_ONLY, str(folder),
                           sys.executable, "-m", "stallfree", *argv],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240)


@pytest.mark.slow
@pytest.mark.parametrize(("argv", "default", "flag"), [
    (["train", "--synthetic", "64", "--model", "mlp", "--image-size", "4", "--batch-size", "8", "--stages", "1",
      "--max-steps", "1", "--timeout", "60"], "stallfree-train", "--out"),
    (["ingest", "{data}", "shards", "--workers", "1"], "shards", "OUT"),
    (["profile", "{data}", "--batch-size", "4", "--image-size", "16", "--batches", "2", "--threads", "1",
      "--accelerator", "sim:200"], "profile-out", "--out"),
    (["demo", "--skip-bench", "--epochs", "1"], "stallfree-demo", "--out"),
])
def test_a_read_only_current_folder_is_one_line_naming_the_flag(read_only: Path, image_folder: Path,
                                                                 argv: list[str], default: str, flag: str) -> None:
    done = _run_in(read_only, *(a.format(data=image_folder) for a in argv))
    assert done.stderr.splitlines() == [
        f"stallfree {argv[0]}: error: cannot write the output folder {read_only / default} (it would be made in "
        f"{read_only}): Read-only file system; give {flag} a folder you can write"], done.stderr[-3000:]
    assert done.returncode == 2 and done.stdout == ""


def test_a_read_only_out_that_exists_is_named_itself(read_only: Path, image_folder: Path) -> None:
    done = _run_in(read_only, "ingest", str(image_folder), ".", "--workers", "1")
    assert done.returncode == 2
    assert done.stderr == (f"stallfree ingest: error: cannot write the output folder {read_only}: Read-only file "
                           "system; give OUT a folder you can write\n")
