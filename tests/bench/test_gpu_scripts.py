"""bench/gpu_wheels.sh and bench/gpu_check.sh on the CPU: the split, the checksums, the reassembly and the
offline install, on a small wheel made here and parts of a few KiB (the GPU steps run only on a lent machine)."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PART = 16 * 1024


def _wheel(folder: Path, name: str = "sfdummy", size: int = 50_000) -> Path:
    """A minimal valid wheel holding ``name/__init__.py`` and ``size`` incompressible bytes (so it splits)."""
    folder.mkdir(parents=True, exist_ok=True)
    payload = os.urandom(size)
    files = {f"{name}/__init__.py": b"VALUE = 42\n", f"{name}/blob.bin": payload,
             f"{name}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
             f"{name}-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                             b"Tag: py3-none-any\n"}
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{name}-1.0.dist-info/RECORD,,")
    files[f"{name}-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as z:
        for path, data in files.items():
            z.writestr(path, data)
    return wheel


def _sh(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.fixture()
def parts(tmp_path: Path) -> Path:
    _wheel(tmp_path / "wheels")
    _wheel(tmp_path / "wheels", "sfother", 1000)
    done = _sh("bench/gpu_wheels.sh", "--wheels", str(tmp_path / "wheels"), "--out", str(tmp_path / "parts"),
               "--part-bytes", str(PART))
    assert done.returncode == 0, done.stderr
    return tmp_path / "parts"


def test_the_wheels_are_split_into_parts_no_larger_than_asked_with_a_checksum_each(parts: Path) -> None:
    names = sorted(p.name for p in parts.glob("part-*"))
    assert len(names) >= 4 and all((parts / n).stat().st_size <= PART for n in names)
    sums = dict(reversed(line.split()) for line in (parts / "SHA256SUMS").read_text().splitlines())
    assert set(sums) == {*names, "bundle.tar"}
    for name in names:
        assert hashlib.sha256((parts / name).read_bytes()).hexdigest() == sums[name]
    whole = b"".join((parts / n).read_bytes() for n in names)
    assert hashlib.sha256(whole).hexdigest() == sums["bundle.tar"]


def test_the_printed_sequence_carries_one_part_a_call_and_runs_the_check_last(tmp_path: Path) -> None:
    _wheel(tmp_path / "wheels")
    done = _sh("bench/gpu_wheels.sh", "--wheels", str(tmp_path / "wheels"), "--out", str(tmp_path / "p"),
               "--part-bytes", str(PART))
    calls = [line.strip() for line in done.stdout.splitlines() if line.strip().startswith("run(")]
    parts = sorted((tmp_path / "p").glob("part-*"))
    assert len(calls) == len(parts)
    for call, part in zip(calls[:-1], parts[:-1], strict=False):
        assert f'carry=["{part}"]' in call and "gpu_check.sh" not in call
    assert "bash bench/gpu_check.sh" in calls[-1] and "SHA256SUMS" in calls[-1] and parts[-1].name in calls[-1]


def test_reassembled_parts_install_offline_into_a_site_folder(parts: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = _sh("bench/gpu_check.sh", "--parts", str(parts), "--site", str(site), "--install-only")
    assert done.returncode == 0, done.stderr
    assert "intact" in done.stdout
    check = subprocess.run([sys.executable, "-c", "import sfdummy, sfother; print(sfdummy.VALUE)"],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(site)}, timeout=60)
    assert check.stdout.strip() == "42", check.stderr


def test_a_missing_part_says_the_machine_is_fresh_and_to_start_again(parts: Path, tmp_path: Path) -> None:
    (parts / "part-01").unlink()
    done = _sh("bench/gpu_check.sh", "--parts", str(parts), "--site", str(tmp_path / "site"), "--install-only")
    assert done.returncode == 3
    assert "part-01 is missing" in done.stderr and "start the sequence again from the first call" in done.stderr
    assert not (tmp_path / "site").exists() or not any((tmp_path / "site").iterdir())


def test_a_corrupt_part_is_named_with_its_checksum(parts: Path, tmp_path: Path) -> None:
    data = bytearray((parts / "part-02").read_bytes())
    data[100] ^= 0xFF
    (parts / "part-02").write_bytes(bytes(data))
    done = _sh("bench/gpu_check.sh", "--parts", str(parts), "--site", str(tmp_path / "site"), "--install-only")
    assert done.returncode == 3 and "part-02 is corrupt (sha256 " in done.stderr and "carry it again" in done.stderr


def test_without_the_checksum_list_the_check_says_to_carry_it(parts: Path, tmp_path: Path) -> None:
    (parts / "SHA256SUMS").unlink()
    done = _sh("bench/gpu_check.sh", "--parts", str(parts), "--site", str(tmp_path / "site"), "--install-only")
    assert done.returncode == 3 and "SHA256SUMS is missing: carry it with the last part" in done.stderr


@pytest.mark.parametrize("script", ["bench/gpu_wheels.sh", "bench/gpu_check.sh"])
def test_help_shows_usage_and_an_example(script: str) -> None:
    done = _sh(script, "--help")
    assert done.returncode == 0 and "Usage: bash " + script in done.stdout and "Example" in done.stdout


def test_the_stallfree_commands_of_the_check_parse_with_this_cli() -> None:
    # Was: the check called `bench loader ... --json PATH` after --json became a flag (the path is --json-file).
    import shlex

    from stallfree.cli import build_parser

    script = (ROOT / "bench" / "gpu_check.sh").read_text().replace("\\\n", " ")
    commands = [line.split("stallfree ", 1)[1] for line in script.splitlines()
                if line.lstrip().startswith("step ") and " stallfree " in line]
    assert len(commands) >= 3
    for command in commands:
        words = shlex.split(command.replace("$out", "/tmp/out").replace("$(nproc)", "2"))
        if words[:2] == ["bench", "e2e"]:
            continue  # the script runs it only where `stallfree bench e2e --help` succeeds
        args = build_parser().parse_args(words)
        assert args.json_file is not None, command
