"""The linters as tests, so `.ci/run` (the README's `pytest`) runs them: ruff (style and import order), import-linter
(the layers and "only backend imports llama_cpp", contracts in pyproject.toml) and mypy (config in pyproject.toml).

Each runs as a subprocess from the repository root, as a developer would type it; a failure shows the tool's own
report. A tool that is not installed skips its test (the `test` extra installs all three, so CI runs them).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _needs(module: str, package: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{package} is not installed (pip install -e '.[test]' installs it)")


def _report(p: subprocess.CompletedProcess[str]) -> str:
    return f"`{' '.join(p.args)}` exited {p.returncode}:\n{p.stdout}{p.stderr}"


def test_ruff():
    _needs("ruff", "ruff")
    p = _run([sys.executable, "-m", "ruff", "check", "localspec", "tests", "scripts"])
    assert p.returncode == 0, _report(p)


def test_import_layers():
    _needs("importlinter", "import-linter")
    # lint-imports, from this interpreter (its console script may not be on PATH in a bare venv)
    p = _run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as c; "
              "sys.argv[0] = 'lint-imports'; c()"])
    assert p.returncode == 0, _report(p)


def test_mypy():
    _needs("mypy", "mypy")
    p = _run([sys.executable, "-m", "mypy"])  # files and options from [tool.mypy]
    assert p.returncode == 0, _report(p)


def test_the_loop_does_not_load_llama_cpp():
    """speculative/ is Python and numpy: importing the loop, the drafters and verify must not load llama.cpp (the
    backend's names load it lazily, on first use)."""
    p = _run([sys.executable, "-c", "import localspec.speculative.loop, localspec.speculative.drafters, "
              "localspec.speculative.verify, "
              "sys; assert 'llama_cpp' not in sys.modules, 'llama_cpp was imported'"], timeout=120)
    assert p.returncode == 0, _report(p)


def test_backend_exports_exactly_its_lazy_names():
    """backend.__all__ is spelled out for the linters; it must name what `__getattr__` serves, no more."""
    from localspec import backend

    assert sorted(backend.__all__) == sorted([*backend._HOME, "llama_cpp"])
