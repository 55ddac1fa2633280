"""Where localspec keeps its files: config overlay, model cache, calibration cache.

`LOCALSPEC_HOME` moves all three; `LOCALSPEC_CACHE` the model files (and the calibration with them);
`LOCALSPEC_CALIBRATION` the calibration alone (the test suite keeps its own: costs timed inside a test process,
where other threads' OpenMP pools slow every decode, are not this machine's costs).
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def home() -> Path:
    """Config directory: the user's models.toml overlay lives here."""
    env = os.environ.get("LOCALSPEC_HOME")
    return Path(env) if env else Path(platformdirs.user_config_dir("localspec"))


def cache_dir() -> Path:
    """Model cache for files localspec fetches itself (not the Hugging Face cache)."""
    env = os.environ.get("LOCALSPEC_CACHE")
    if env:
        return Path(env)
    if os.environ.get("LOCALSPEC_HOME"):
        return home() / "cache"
    return Path(platformdirs.user_cache_dir("localspec"))


def calibration_dir() -> Path:
    """Measured costs per model + machine + build (calibration.py)."""
    env = os.environ.get("LOCALSPEC_CALIBRATION")
    return Path(env) if env else cache_dir() / "calibration"
