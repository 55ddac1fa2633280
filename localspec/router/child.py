"""A runner's entry point: `python -m localspec.router.child serve ARGS` is `localspec serve ARGS`, with the
test-only fault hook (fault.py) installed when its environment variable is set."""

from __future__ import annotations

from ..cli import main
from ..commands.supervise import run_watched
from .fault import install_from_env


def run() -> None:
    install_from_env()
    run_watched(lambda: main(prog_name="localspec"))


if __name__ == "__main__":
    run()
