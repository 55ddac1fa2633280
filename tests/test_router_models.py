"""The router's model management as llama-server's router mode answers it, on a real `localspec serve` router
(no runner starts: nothing here asks a model for text) over a hub cache built here, offline.

Checks: GET /props reports llama.cpp's `build_info` (`b<build>-<commit>`, as a runner's /props); a preset with
`dedup-cache-models` (from [*]) hides the hub-cache entry of the model it serves, and a preset that turns it off
keeps its entry; POST /models downloads in the background and the model is listed once it is in the cache, a
listed name or a name that is no hub model is a 400; DELETE /models?model=NAME removes a pulled model and
refuses a preset's.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from pathlib import Path
from typing import Iterator

import gguf
import httpx
import numpy as np
import pytest
from servers import ServerProcess

pytestmark = pytest.mark.slow

COMMIT = "c0ffee" + "0" * 34


def cache_model(hf: Path, repo: str) -> Path:
    """A tiny GGUF in the hub cache as huggingface-hub lays it out (blob, snapshot link, ref): acme/REPO:Q8_0."""
    root = hf / f"models--acme--{repo}"
    root.mkdir(parents=True)
    src = root / "src.gguf"
    w = gguf.GGUFWriter(str(src), "llama")
    w.add_name(repo)
    w.add_tensor("blk.0.weight", np.arange(4096, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    (root / "blobs").mkdir()
    src.rename(root / "blobs" / sha)
    snap = root / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (snap / f"{repo}-Q8_0.gguf").symlink_to(Path("../..") / "blobs" / sha)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(COMMIT)
    return snap / f"{repo}-Q8_0.gguf"


@pytest.fixture(scope="module")
def hf(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hf")


@pytest.fixture(scope="module")
def http(tmp_path_factory, hf: Path) -> Iterator[httpx.Client]:
    root = tmp_path_factory.mktemp("router")
    cache_model(hf, "tiny-GGUF")
    other = cache_model(hf, "other-GGUF")
    presets = root / "presets.ini"
    presets.write_text("[*]\ndedup-cache-models = true\n\n[tiny]\nmodel = acme/tiny-GGUF:Q8_0\n\n"
                       f"[other]\nmodel = {other}\ndedup-cache-models = false\n")
    (root / "home").mkdir()
    env = {"HF_HUB_CACHE": str(hf), "HF_HUB_OFFLINE": "1", "LOCALSPEC_HOME": str(root / "home"),
           "LOCALSPEC_CACHE": os.environ["LOCALSPEC_CACHE"]}
    with ServerProcess(["--models-preset", str(presets), "--ctx", "512"], env=env) as srv:
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            yield c
        assert srv.alive, "".join(srv.log[-30:])


def listed(http: httpx.Client) -> set[str]:
    return {m["id"] for m in http.get("/models").json()["data"]}


def test_props_reports_llama_cpps_build(http):
    from localspec.backend import llama_build

    props = http.get("/props").json()
    assert props["role"] == "router"
    assert re.fullmatch(r"b\d+-\w+", props["build_info"]) and props["build_info"] == llama_build()


def test_a_deduplicating_preset_hides_its_cache_entry(http):
    names = listed(http)
    assert {"tiny", "other", "acme/other-GGUF:Q8_0"} <= names
    assert "acme/tiny-GGUF:Q8_0" not in names


def test_post_models_downloads_then_lists_and_delete_removes(http, hf):
    name = "acme/late-GGUF:Q8_0"
    cached = cache_model(hf, "late-GGUF")  # in the cache after the router listed it: found by the download
    assert name not in listed(http)
    assert http.post("/models", json={"model": name}).json() == {"success": True}
    deadline = time.monotonic() + 60
    while name not in listed(http) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert name in listed(http)
    again = http.post("/models", json={"model": name})
    assert again.status_code == 400 and "already exists" in again.json()["error"]["message"]
    assert http.post("/models", json={"model": "not a hub name"}).status_code == 400
    assert http.post("/models", json={}).status_code == 400

    assert http.delete("/models", params={"model": name}).json() == {"success": True}
    assert not cached.exists() and name not in listed(http)
    assert http.delete("/models", params={"model": "tiny"}).status_code == 400
    assert http.delete("/models").status_code == 400
