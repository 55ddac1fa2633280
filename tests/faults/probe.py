"""A fast path's trial (localspec/backend/fastpath_trial.py) that dies, hangs or computes other logits, as a
broken CPU kernel would, after its load in the mode under trial and before its first decode there, so that the
fast-path decision is tested on real deaths and real differences.

With LOCALSPEC_PROBE_FAULT="all:SIGILL,repack:hang" in a process's environment and this folder on its path
(`env(SPEC)`, or the folder on sys.path: a trial child gets its parent's sys.path as its PYTHONPATH),
sitecustomize.py wraps Model.load in every process; only a trial child that loads in a named mode dies there.
Two stand-ins for a kernel that is wrong without crashing: "all:skew" makes that mode's model return each row
of logits moved one token along (a kernel that writes the neighbouring column: the same wrong answer every
time), "all:jitter" adds noise of JITTER standard deviations, drawn afresh at every decode (a kernel that reads
memory it did not set: a near answer, another each time).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

FAULT_ENV = "LOCALSPEC_PROBE_FAULT"
JITTER = 0.01  # standard deviations of a row: close to the reference's distribution, far from one answer
TRIAL = "localspec.backend.fastpath_trial"
HERE = Path(__file__).resolve().parent


def env(spec: str) -> dict[str, str]:
    """The environment a `localspec` command needs for its trials to die as `spec` says."""
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    return {FAULT_ENV: spec, "PYTHONPATH": path}


def _in_trial() -> bool:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and spec.name == TRIAL


def _wrong(model: Any, how: str) -> None:
    """Make `model.decode` return wrong logits: `skew` or `jitter` (the module docstring)."""
    import numpy as np

    decode, rng = model.decode, np.random.default_rng()

    def wrong(tokens: Any, logits_rows: int = 1) -> Any:
        rows = np.array(decode(tokens, logits_rows))
        if how == "skew":
            return np.roll(rows, 1, axis=1)
        return rows + JITTER * rows.std(axis=1, keepdims=True) * rng.standard_normal(rows.shape)

    model.decode = wrong


def _fault(mode: str, spec: str, model: Any) -> None:
    for item in spec.split(","):
        m, _, what = item.partition(":")
        if m.strip() == mode:
            if what == "hang":
                time.sleep(3600)
            if what in ("skew", "jitter"):
                _wrong(model, what)
                return
            os.kill(os.getpid(), getattr(signal, what))


def install(spec: str) -> None:
    """Wrap Model.load: in a trial child, a load in a mode `spec` names is followed by its death, its hang or
    its wrong logits."""
    from localspec.backend.model import Model

    original = Model.load.__func__  # type: ignore[attr-defined]

    def load(cls: type, path: Any, *args: Any, **kw: Any) -> Any:
        model = original(cls, path, *args, **kw)
        options = args[0] if args else kw.get("options")
        if _in_trial() and options is not None:
            _fault(options.fast_path, spec, model)
        return model

    Model.load = classmethod(load)  # type: ignore[method-assign, assignment]


def install_from_env() -> None:
    spec = os.environ.get(FAULT_ENV)
    if spec:
        install(spec)
