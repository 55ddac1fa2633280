"""Where localspec keeps its files: config overlay and model cache.

`LOCALSPEC_HOME` moves both (tests point it at a temporary directory).
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
