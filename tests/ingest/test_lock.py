"""One ingest at a time per output folder (issue #37, cases 7 and 8), with real ``stallfree ingest`` processes.

Before: two runs into one OUT both exited 0 and OUT could hold a mix of both; a ``kill -9`` left
``.shard-00000.arrow.tmp-HOST-PID-TID`` files that survived every rerun; a full disk ended in a traceback.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stallfree.ingest.lock import FolderLocked, ingest_lock
from stallfree.ingest.merge import merge
from stallfree.ingest.runner import ingest
from stallfree.ingest.verify import verify
from stallfree.ingest.writer import IngestOptions

SHARD_MB = "0.002"  # about one image per shard: many shards, so that a run can be caught between them
OPTIONS = IngestOptions(shard_mb=float(SHARD_MB))

# A real ingest (the CLI's entry) that stops inside the atomic write of shard 1, after its bytes are on disk and
# before the rename, and waits there until the file GO exists: a run held mid-write, to be refused or killed.
HELD = """
import sys, time
from pathlib import Path
from stallfree.core import atomic
from stallfree.cli import main

source, out, go, shard_mb = sys.argv[1:5]
flush = atomic._fsync_file

def held(path):
    flush(path)
    if ".shard-00001.arrow.tmp-" in path.name:
        Path(go + ".held").write_text(str(path))
        deadline = time.monotonic() + 120
        while not Path(go).exists() and time.monotonic() < deadline:
            time.sleep(0.02)

atomic._fsync_file = held
sys.exit(main(["ingest", source, out, "--shard-size", shard_mb, "--quiet"]))
"""


def _cli(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stallfree", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def _hold(source: Path, out: Path) -> subprocess.Popen:
    """An ingest of ``source`` into ``out`` held inside its write of shard 1 (see HELD); returns once it is."""
    run = subprocess.Popen([sys.executable, "-c", HELD, str(source), str(out), str(out.parent / "go"), SHARD_MB],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out.parent / "go.held").exists():
        if run.poll() is not None or time.monotonic() > deadline:
            run.kill()
            pytest.fail(f"the held ingest ended or hung before shard 1: {run.communicate()}")
        time.sleep(0.02)
    return run


def _temporaries(out: Path) -> list[str]:
    return sorted(p.name for folder in (out, out / ".ingest") for p in folder.iterdir() if ".tmp" in p.name)


@pytest.fixture
def other(tmp_path, folder):
    """Another source: the same images under other class names, so that a mix would show."""
    other = tmp_path / "other"
    for old in sorted(folder.iterdir()):
        shutil.copytree(old, other / f"x-{old.name}")
    return other


@pytest.mark.slow
@pytest.mark.parametrize("second", ["the same source", "another source"])
def test_a_second_ingest_into_a_folder_being_written_is_refused_naming_the_first(folder, other, tmp_path, second):
    out = tmp_path / "out"
    first = _hold(folder, out)
    try:
        refused = _cli("ingest", folder if second == "the same source" else other, out, "--shard-size", SHARD_MB,
                       "--quiet")
    finally:
        (tmp_path / "go").touch()
        first_err = first.communicate(timeout=300)[1]
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"stallfree ingest: error: {out} is being written by stallfree ingest pid {first.pid} on "
        f"{socket.gethostname()} of {folder}, started "), refused.stderr
    assert lines[0].endswith("; wait for it to end, or pass another OUT folder")
    assert first.returncode == 0, first_err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source"]["path"] == str(folder.resolve())
    assert manifest["classes"] == sorted(p.name for p in folder.iterdir())
    assert verify(out) == [] and _temporaries(out) == []


@pytest.mark.slow
def test_a_killed_run_s_lock_and_temporary_files_go_with_it(folder, tmp_path, shard_rows):
    reference = tmp_path / "reference"
    ingest(folder, reference, OPTIONS)
    out = tmp_path / "out"
    held = _hold(folder, out)
    os.kill(held.pid, signal.SIGKILL)
    held.communicate()
    left = _temporaries(out)
    assert any(name.startswith(".shard-00001.arrow.tmp-") for name in left), left  # what kill -9 leaves
    (out / ".ingest" / ".shard-00003.json.tmp-otherhost-1-2").write_text("{")  # another host's record, half
    (out / ".shard-00004.arrow.tmp").write_bytes(b"half a shard")  # an older stallfree's temporary name
    (out / ".notes.tmp-mine").write_text("not ingest's")  # a user's file: left alone
    rerun = _cli("ingest", folder, out, "--shard-size", SHARD_MB, "--quiet")
    assert rerun.returncode == 0, rerun.stderr  # the kernel released the dead run's lock
    assert _temporaries(out) == [".notes.tmp-mine"]
    assert shard_rows(out) == shard_rows(reference) and verify(out) == []


FULL = """
import errno, sys
from stallfree.core import atomic
from stallfree.cli import main

flush = atomic._fsync_file

def full(path):
    if ".shard-00003.arrow.tmp-" in path.name:
        raise OSError(errno.ENOSPC, "No space left on device")
    flush(path)

atomic._fsync_file = full
sys.exit(main(["ingest", *sys.argv[1:3], "--shard-size", sys.argv[3], "--quiet"]))
"""


@pytest.mark.slow
def test_a_full_disk_is_one_line_and_exit_1_and_loses_nothing_written(folder, tmp_path, shard_rows):
    reference = tmp_path / "reference"
    ingest(folder, reference, OPTIONS)
    out = tmp_path / "out"
    full = subprocess.run([sys.executable, "-c", FULL, str(folder), str(out), SHARD_MB], capture_output=True,
                          text=True, timeout=300)
    assert full.returncode == 1, full.stderr
    lines = full.stderr.strip().splitlines()
    shards = len(json.loads((reference / "manifest.json").read_text())["shards"])
    assert len(lines) == 1 and lines[0].startswith(
        f"stallfree ingest: error: no space left on device in {out}: about "), full.stderr
    assert re.search(rf"about \d+(\.\d)? [Mk]B more are needed for the {shards - 3} shard\(s\) not yet "
                     r"written and the manifest, \d+(\.\d)? [Mk]B are free; free some space", lines[0]), lines[0]
    assert lines[0].endswith("run the same command again, which keeps the 3 shard(s) written")
    for name in ("shard-00000.arrow", "shard-00001.arrow", "shard-00002.arrow"):
        assert (out / name).read_bytes() == (reference / name).read_bytes()
    assert _temporaries(out) == [] and not (out / "shard-00003.arrow").exists()
    rerun = _cli("ingest", folder, out, "--shard-size", SHARD_MB, "--quiet", "--json")
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["resumed_shards"] == 3
    assert shard_rows(out) == shard_rows(reference) and verify(out) == []


# The same on a real full disk: a 48 kB tmpfs, mounted in a user and mount namespace, then grown for the rerun.
TMPFS = """
mount -t tmpfs -o size=48k tmpfs "$DISK" || exit 0
touch "$TMP/mounted"
"$PY" -m stallfree ingest "$SRC" "$DISK/out" --shard-size "$MB" --quiet 2> "$TMP/err"; echo $? > "$TMP/rc"
ls "$DISK/out" > "$TMP/kept"
mount -o remount,size=4m "$DISK"
"$PY" -m stallfree ingest "$SRC" "$DISK/out" --shard-size "$MB" --quiet --json > "$TMP/rerun"; echo $? > "$TMP/rc2"
cp -a "$DISK/out" "$TMP/copy"
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("unshare") is None,
                    reason="needs Linux's unshare for a tmpfs of its own")
def test_a_real_full_tmpfs_is_one_line_and_exit_1_then_resumes(folder, tmp_path, shard_rows):
    reference = tmp_path / "reference"
    ingest(folder, reference, OPTIONS)
    disk = tmp_path / "disk"
    disk.mkdir()
    env = {**os.environ, "DISK": str(disk), "TMP": str(tmp_path), "PY": sys.executable, "SRC": str(folder),
           "MB": SHARD_MB}
    ran = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", TMPFS], env=env,
                         capture_output=True, text=True, timeout=300)
    if not (tmp_path / "mounted").exists():
        pytest.skip(f"no tmpfs can be mounted here (unshare: {ran.returncode}, {ran.stderr.strip()[:200]})")
    lines = (tmp_path / "err").read_text().strip().splitlines()
    assert (tmp_path / "rc").read_text().strip() == "1", lines
    assert len(lines) == 1 and lines[0].startswith(
        f"stallfree ingest: error: no space left on device in {disk / 'out'}: about "), lines
    kept = [name for name in (tmp_path / "kept").read_text().split() if name.startswith("shard-")]
    assert kept and all((reference / name).read_bytes() == (tmp_path / "copy" / name).read_bytes() for name in kept)
    assert (tmp_path / "rc2").read_text().strip() == "0", ran.stderr
    assert json.loads((tmp_path / "rerun").read_text())["resumed_shards"] >= 1
    assert shard_rows(tmp_path / "copy") == shard_rows(reference) and verify(tmp_path / "copy") == []


def test_parts_share_a_folder_but_exclude_a_whole_run_a_merge_and_themselves(tmp_path):
    out = tmp_path / "out"
    with ingest_lock(out, out / ".ingest", "/src", (0, 2)), ingest_lock(out, out / ".ingest", "/src", (1, 2)):
        with pytest.raises(FolderLocked, match=rf"pid {os.getpid()} .* of /src --part 0/2, started .*; "
                                               rf"stallfree ingest pid {os.getpid()} .* of /src --part 1/2"):
            with ingest_lock(out, out / ".ingest", "/other", (0, 1)):
                pass
        for _ in range(2):  # a refused run leaves the holder's record as it was
            with pytest.raises(FolderLocked, match=rf"written by stallfree ingest pid {os.getpid()} on \S+ of /src "
                                                   r"--part 1/2, started [^;]*; wait for it to end"):
                with ingest_lock(out, out / ".ingest", "/src", (1, 2)):
                    pass
        with pytest.raises(FolderLocked, match=r"--part 0/2"):
            merge(out)
    with ingest_lock(out, out / ".ingest", "--merge", None):
        with pytest.raises(FolderLocked, match=rf"written by stallfree ingest --merge pid {os.getpid()} on \S+, "
                                               r"started [^;]*; wait"):
            with ingest_lock(out, out / ".ingest", "/src", (0, 2)):
                pass
    with ingest_lock(out, out / ".ingest", "/src", (0, 1)):
        with pytest.raises(FolderLocked, match=r"of /src, started"):
            with ingest_lock(out, out / ".ingest", "/src", (1, 2)):
                pass
    with ingest_lock(out, out / ".ingest", "/src", (0, 1)):  # released at the end of the block
        pass


FORKED = """
import os, signal, sys, time
from stallfree.ingest.lock import FolderLocked, ingest_lock

out = sys.argv[1]
ready, started = os.pipe()
with ingest_lock(out, out + "/.ingest", "/src"):
    child = os.fork()  # as the ingest's worker pool forks its workers
    if child == 0:
        os.write(started, b"1")  # a worker running: its start (and the fork's hooks) is over
        time.sleep(60)
        os._exit(0)
    os.read(ready, 1)
try:
    with ingest_lock(out, out + "/.ingest", "/src"):
        print("free")
except FolderLocked as err:
    print(err)
finally:
    os.kill(child, signal.SIGKILL)
"""


def test_a_forked_worker_does_not_keep_the_run_s_lock(tmp_path):
    # A worker that outlived its run (it sleeps, or its parent-death signal is late) held the lock it inherited:
    # the folder stayed locked after the run ended.
    ran = subprocess.run([sys.executable, "-c", FORKED, str(tmp_path / "out")], capture_output=True, text=True,
                         timeout=120)
    assert ran.stdout.strip() == "free", ran.stdout + ran.stderr
