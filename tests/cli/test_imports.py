"""Starting light: ``--help`` imports nothing but the standard library, and the commands that do not train (ingest,
verify, info) and their worker processes import no torch, DALI or Numba (each costs seconds per process:
``stallfree --help`` took 4 s and every ingest part process 7 s). A closed stdout ends quietly.

The tests assert on what got imported, not on the time it took: a shared 2-core machine times nothing reliably.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stallfree.ingest.runner import ingest

HEAVY = ("torch", "nvidia.dali", "numba")
# Building the parser needs none of these either; numpy and pyarrow alone cost 0.2-1 s of a --help.
NOT_FOR_HELP = ("torch", "numba", "nvidia", "numpy", "pyarrow", "PIL", "tqdm")


def _python(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=timeout)


def test_every_help_exits_0_without_importing_torch_dali_numba_or_numpy() -> None:
    # Was: `stallfree --help` imported torch.distributed.pipelining (4 s), `ingest --help` took 6.6 s.
    done = _python(f"""
        import json, sys
        from stallfree.cli import main
        from stallfree.commands.bench import BENCHMARKS
        commands = [[], ["demo"], ["ingest"], ["verify"], ["info"], ["train"], ["bench"], ["profile"], ["plan"],
                    *[["bench", name] for name in BENCHMARKS]]
        codes = {{}}
        for argv in commands:
            try:
                main([*argv, "--help"])
            except SystemExit as end:
                codes[" ".join(argv)] = end.code
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in {NOT_FOR_HELP!r})
        sys.stderr.write(json.dumps({{"codes": codes, "heavy": heavy}}))
    """)
    result = json.loads(done.stderr.strip().splitlines()[-1])
    assert result["heavy"] == [], "building a parser imported: " + ", ".join(result["heavy"][:5])
    assert set(result["codes"].values()) == {0}, result["codes"]
    from stallfree.commands.bench import BENCHMARKS

    assert len(result["codes"]) == 9 + len(BENCHMARKS)  # every command and every benchmark answered


@pytest.mark.parametrize("command", [["--help"], ["ingest", "--help"]])
def test_python_m_stallfree_help_imports_no_torch(command: list[str]) -> None:
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "stallfree", *command], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "usage: stallfree" in done.stdout
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "stallfree.cli" in imported
    assert not {m for m in imported if m.split(".")[0] in NOT_FOR_HELP}


def test_importing_the_package_and_the_ingest_library_leaves_torch_out() -> None:
    done = _python(f"""
        import sys
        import stallfree, stallfree.cli, stallfree.ingest.runner, stallfree.ingest.verify, stallfree.ingest.sources
        import stallfree.stage_runtime.config.train_config, stallfree.stage_runtime.schedules
        assert stallfree.__version__
        loaded = [m for m in {HEAVY!r} if m in sys.modules]
        assert not loaded, loaded
    """)
    assert done.returncode == 0, done.stderr


# Runs `stallfree ingest` with 2 workers, each converted chunk reporting which heavy modules its process holds.
WORKER_PROBE = """
import json, os, sys
import stallfree.ingest.workers as workers
from stallfree.cli import main

HEAVY = ("torch", "nvidia.dali", "numba")
# Building the parser needs none of these either; numpy and pyarrow alone cost 0.2-1 s of a --help.
NOT_FOR_HELP = ("torch", "numba", "nvidia", "numpy", "pyarrow", "PIL", "tqdm")
convert = workers.convert_items  # what the pool's workers run

def probe(*args, **kwargs):
    loaded = [m for m in HEAVY if m in sys.modules]
    with open(os.path.join(sys.argv[3], f"{os.getpid()}.json"), "w") as f:
        json.dump(loaded, f)
    return convert(*args, **kwargs)

workers.convert_items = probe
print(os.getpid())
code = main(["ingest", sys.argv[1], sys.argv[2], "--workers", "2", "--shard-size", "0.001", "--quiet"])
assert code == 0, code
loaded = [m for m in HEAVY if m in sys.modules]
assert not loaded, f"the ingest process imported {loaded}"
"""


@pytest.mark.slow
def test_ingest_worker_processes_import_no_torch_dali_or_numba(image_folder: Path, tmp_path: Path) -> None:
    probes = tmp_path / "probes"
    probes.mkdir()
    script = tmp_path / "probe.py"  # a file, so that the forked workers find `probe` in their __main__
    script.write_text(WORKER_PROBE)
    done = subprocess.run([sys.executable, str(script), str(image_folder), str(tmp_path / "out"), str(probes)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    reports = {p.stem: json.loads(p.read_text()) for p in probes.glob("*.json")}
    parent = done.stdout.split()[0]
    assert reports and parent not in reports  # the chunks ran in worker processes
    assert all(loaded == [] for loaded in reports.values()), reports


def test_bundled_model_names_match_the_models_module() -> None:
    from stallfree.stage_runtime.config.train_config import BUNDLED_MODELS
    from stallfree.stage_runtime.models.zoo import MODELS

    assert BUNDLED_MODELS == tuple(MODELS)


def test_train_verify_modes_match_the_loaders() -> None:
    from stallfree.pipeline.shards import VERIFY_MODES as LOADER
    from stallfree.stage_runtime.config.train_config import VERIFY_MODES

    assert VERIFY_MODES == LOADER


@pytest.fixture(scope="module")
def shards(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli-shards") / "out"
    ingest(image_folder, out, workers=1)
    return out


def test_info_and_verify_import_no_torch_dali_or_numba(shards: Path) -> None:
    done = _python(f"""
        import sys
        from stallfree.cli import main
        assert main(["info", sys.argv[1]]) == 0
        assert main(["info", sys.argv[1], "--json"]) == 0
        assert main(["verify", sys.argv[1], "--decode"]) == 0
        loaded = [m for m in {HEAVY!r} if m in sys.modules]
        assert not loaded, loaded
    """, str(shards))
    assert done.returncode == 0, done.stderr


def test_info_json_into_a_pipe_closed_early_ends_without_a_traceback(shards: Path) -> None:
    # Was: `stallfree info DIR --json | head` ended in "BrokenPipeError: [Errno 32] Broken pipe" and exit 120.
    proc = subprocess.Popen([sys.executable, "-m", "stallfree.cli", "info", str(shards), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader leaves before the command writes (it takes a moment to start)
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141
    assert "Traceback" not in err and "BrokenPipe" not in err and err == ""
