"""CI runs what the README tells a user to run, verbatim: its set-up line first, then its test commands.

Issue 44, item 1: the README's set-up line ends in ``stallfree demo``, which exited 1 while CI, running only the test
commands, passed. ``.ci/run`` now runs the set-up line first; this holds it to the README's words.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The test commands' own virtual environment is .venv-ci in CI (a developer's .venv stays as it is): what follows the
# README's `python3 -m venv .venv && . .venv/bin/activate && ` runs verbatim.
VENV = "python3 -m venv .venv && . .venv/bin/activate && "


def _block(section: str) -> list[str]:
    """The lines of the first ```bash block under README.md's ``section`` heading, comments cut."""
    found = re.search(rf"^#+ {re.escape(section)}\n.*?^```bash\n(.*?)^```", (ROOT / "README.md").read_text(),
                      re.S | re.M)
    assert found is not None, f"README.md has no bash block under '{section}'"
    return [re.sub(r"\s+#.*$", "", line).strip() for line in found[1].splitlines() if line.strip()]


def _ci_lines() -> list[str]:
    return (ROOT / ".ci" / "run").read_text().splitlines()


def _first_line_holding(command: str) -> int:
    return next(i for i, line in enumerate(_ci_lines()) if command in line and not line.lstrip().startswith("#"))


def test_ci_runs_the_readme_set_up_line_verbatim_before_the_tests() -> None:
    (setup,) = _block("Set up")
    assert setup.endswith("stallfree demo"), setup
    assert setup in _ci_lines(), ".ci/run does not run README.md's set-up line as its own line, verbatim"
    first_test = _block("Run the tests")[0].removeprefix(VENV)
    assert _first_line_holding(setup) < _first_line_holding(first_test)


@pytest.mark.parametrize("command", [c.removeprefix(VENV) for c in _block("Run the tests")])
def test_ci_runs_each_readme_test_command_verbatim(command: str) -> None:
    assert any(command in line for line in _ci_lines()), f".ci/run does not run README.md's {command!r}"


def test_every_test_run_of_ci_ends_with_its_25_slowest_tests() -> None:
    """Issue 45, item 7: CI took 22 minutes and nothing showed which tests grew; each run now lists its slowest 25."""
    runs = [c for c in _block("Run the tests") if "pytest" in c]
    runs += [line for line in (ROOT / ".ci" / "torchvision").read_text().splitlines() if line.startswith("pytest")]
    assert len(runs) == 3 and all("--durations=25" in run for run in runs), runs


def test_the_torchvision_command_collects_every_file_with_a_torchvision_test(request: pytest.FixtureRequest) -> None:
    """.ci/torchvision collects only the files that hold ``pytest.mark.torchvision`` (its venv lacks the integrations
    that others import): a test marked some other way (a conftest hook, a marker added at run time) would not run."""
    script = (ROOT / ".ci" / "torchvision").read_text()
    assert "grep -rl --include='test_*.py' 'pytest.mark.torchvision' tests" in script
    selected = {path for path in (ROOT / "tests").rglob("test_*.py") if "pytest.mark.torchvision" in path.read_text()}
    marked = {Path(item.path) for item in request.session.items if item.get_closest_marker("torchvision")}
    assert marked <= selected, sorted(str(path) for path in marked - selected)
    if len(request.session.items) > 1000:  # the whole suite was collected here: the torchvision tests are among them
        assert marked, "no test is marked torchvision"
