"""One way to build an engine: the bench's rows come from the loader, and its "auto" row is the
engine `run`, `chat` and `serve` ship by default, not a controller of the bench's own."""

from __future__ import annotations

import pytest

from localspec.bench.runner import AUTO, PLAIN, Config, Family, Plan, TargetSpec, forget_requests
from localspec.engine.engine import Engine
from localspec.engine.loader import EngineConfig, load_engine
from localspec.models import LOOKUP
from localspec.speculative.drafters import PromptLookup
from localspec.tuning.controller import Adaptive
from localspec.tuning.fixed import FixedK

pytestmark = pytest.mark.slow

N_CTX = 512


def shape(engine: Engine) -> dict:
    """What makes an engine the shipped one: the controller, its γ range and priors, the drafter and its cache,
    the thread control's kind."""
    ctl, d, thr = engine.controller, engine.drafter, engine.threads
    return {"controller": type(ctl), "k": (ctl.k_min, ctl.k_max) if isinstance(ctl, Adaptive) else ctl.k,
            "prior": getattr(ctl, "prior", None), "sources": tuple(getattr(ctl, "src", ())),
            "drafter": type(d), "cache": getattr(getattr(d, "cache", None), "max_tokens", None),
            "threads": (type(thr), thr.pinned_n, thr.meter is not None)}


@pytest.fixture(scope="module")
def family(smollm2_path):
    """The bench's engines for SmolLM2 with prompt lookup and SmolLM2 itself as a model drafter, k=2 and auto."""
    spec = TargetSpec("smollm2", smollm2_path, drafters=(("twin", smollm2_path),))
    fam = Family(spec, Plan(targets=(spec,), prompts=(), ks=(2,), auto=True, n_ctx=N_CTX))
    yield fam
    fam.close()


def shipped(smollm2_path, draft: str) -> dict:
    e = load_engine(EngineConfig(model=str(smollm2_path), draft=draft, n_ctx=N_CTX), log=lambda *a: None)
    try:
        return shape(e)
    finally:
        e.close()


@pytest.mark.parametrize("bench_drafter, draft", [(LOOKUP, LOOKUP), ("twin", None)])
def test_the_auto_row_is_the_shipped_default(family, smollm2_path, bench_drafter, draft):
    got = shape(family.engines[Config(bench_drafter, AUTO)])
    want = shipped(smollm2_path, draft or str(smollm2_path))
    assert got == want
    assert got["controller"] is Adaptive and got["threads"][1] is None  # adaptive γ, threads not pinned
    if bench_drafter == LOOKUP:  # lookup reaches k_max_lookup, keeps its measured priors and its SuffixCache
        assert got["k"] == (EngineConfig.k_min, EngineConfig.k_max_lookup) and got["prior"] and got["cache"]


def test_k_rows_pin_gamma_and_plain_has_no_drafter(family):
    for d in (LOOKUP, "twin"):
        row = shape(family.engines[Config(d, 2)])
        assert row["controller"] is FixedK and row["k"] == 2
    assert family.engines[Config(PLAIN, 0)].drafter is None
    targets = {id(e.target) for e in family.engines.values()}
    assert targets == {id(family.target)}  # one load of the target for every row


def test_every_run_starts_with_an_empty_lookup_cache(family):
    """The auto row's SuffixCache fills across requests as in a server; the bench forgets it between runs."""
    lookup = family.engines[Config(LOOKUP, AUTO)].drafter
    assert isinstance(lookup, PromptLookup)
    lookup.sync(list(range(100, 140)))
    lookup.sync(list(range(200, 240)))  # a new request: the first one goes to the cache
    assert len(lookup.cache) > 0
    forget_requests(lookup)
    assert len(lookup.cache) == 0 and len(lookup.index) == 0
