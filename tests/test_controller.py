"""The draft-length controller as pure units: the γ choice against the closed form, auto-off with
hysteresis and re-probing, per-source decisions for the hybrid drafter. No models, no clocks."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from localspec.speculative.drafters import HybridDrafter
from localspec.speculative.types import EMPTY, Draft, Step
from localspec.tuning.controller import PROBE_SHARE, Adaptive
from localspec.tuning.estimate import SourceEstimate
from localspec.tuning.fixed import FixedK
from localspec.tuning.rate import best_k, expected_tokens, round_rate, v_at

# SmolLM2 Q4_1 on 2 cores (an earlier quiet-machine measurement: v(3) ≈ 2.4)
CPU_V = [1.0, 1.45, 1.9, 2.4, 2.8, 3.3, 3.7, 4.2, 4.6]
GPU_V = [1.0, 1.02, 1.04, 1.06, 1.08, 1.12, 1.16, 1.2, 1.25]  # 7B target on a GPU: verify ≈ free


def closed_form_speedup(alpha: float, c: float, v: list[float], k: int) -> float:
    """Leviathan et al.: (1 - α^(γ+1)) / (1 - α) ÷ (γc + v(γ))."""
    tokens = (1 - alpha ** (k + 1)) / (1 - alpha) if alpha < 1 else k + 1
    return tokens / (k * c + v[k])


@pytest.mark.parametrize("alpha", [0.05, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99])
@pytest.mark.parametrize("c", [0.0, 0.02, 0.1, 0.3, 1.0])
@pytest.mark.parametrize("v", [CPU_V, GPU_V], ids=["cpu", "gpu"])
def test_best_k_matches_closed_form(alpha, c, v):
    k, rate = best_k([alpha], c, v, 1, 8)
    want = max(range(1, 9), key=lambda g: (closed_form_speedup(alpha, c, v, g), -g))
    assert k == want
    assert rate == pytest.approx(closed_form_speedup(alpha, c, v, want))


def test_expected_tokens_per_position():
    # E(γ) = 1 + Σ_i Π_{j≤i} α_j
    a = [0.9, 0.5, 0.2]
    assert expected_tokens(a, 0) == 1.0
    assert expected_tokens(a, 1) == pytest.approx(1.9)
    assert expected_tokens(a, 3) == pytest.approx(1 + 0.9 + 0.45 + 0.09)
    assert expected_tokens(a, 4) == pytest.approx(1 + 0.9 + 0.45 + 0.09 + 0.018)  # last α repeats


def test_best_k_per_position_generalisation():
    # acceptance collapses after position 2 (lookup running out of matched text): short drafts win even
    # though α_1 is high; brute force over the per-position formula agrees
    a = [0.95, 0.9, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]
    k, rate = best_k(a, 0.01, CPU_V, 1, 8)
    brute = max(range(1, 9), key=lambda g: expected_tokens(a, g) / (g * 0.01 + CPU_V[g]))
    assert k == brute == 2
    assert rate == pytest.approx(round_rate(a, 0.01, CPU_V, 2))


def test_best_k_respects_range_and_prefers_short_on_ties():
    assert best_k([1.0], 0.0, [1.0] * 9, 3, 5)[0] == 5
    assert best_k([0.0], 0.0, [1.0] * 9, 3, 5)[0] == 3
    with pytest.raises(ValueError):
        best_k([0.5], 0.0, CPU_V, 0, 4)


def step(drafted: int, accepted: int, *, source: str = "lookup", t_draft: float = 0.0,
         t_verify: float | None = None) -> Step:
    tv = t_verify if t_verify is not None else CPU_V[drafted] * 0.005
    return Step(tuple(range(accepted + 1)), drafted, accepted, t_draft, tv, source if drafted else "")


def test_controller_picks_the_closed_form_k_from_its_prior():
    """Before any round: the closed form's γ when its rate clears `on_above`, else nothing (a prior that promises
    a few per cent is not worth a first failed draft)."""
    for alpha in (0.5, 0.7, 0.9):
        ctl = Adaptive(sources=("lookup",), v=CPU_V, t1=0.005, c={"lookup": 0.02}, alpha_prior=alpha)
        k, rate = best_k([alpha], 0.02, CPU_V, 1, 8)
        assert ctl.choose_k() == (k if rate >= ctl.on_above else 0)
    assert Adaptive(sources=("lookup",), v=CPU_V, t1=0.005, c={"lookup": 0.02}, alpha_prior=0.9).choose_k() > 0


def test_a_source_that_has_not_drafted_starts_on_only_above_on_above():
    """A prior rate between off_below and on_above (here 1.05: E(1) = 1.2 tokens for v(1) = 1.2/1.05) does
    not start a source; the same rate keeps one on that drafted its way there (hysteresis)."""
    ctl = Adaptive(sources=("lookup",), k_max=1, v=[1.0, 1.2 / 1.05], t1=0.005, c={"lookup": 0.0}, alpha_prior=0.2)
    est = ctl.src["lookup"]
    assert ctl.off_below <= est.rate < ctl.on_above and not est.on and ctl.choose_k() == 0
    est.on = True
    ctl._decide("lookup")
    assert est.on


def test_high_acceptance_chooses_long_drafts():
    ctl = Adaptive(sources=("lookup",), v=CPU_V, t1=0.005, c={"lookup": 0.0})
    for _ in range(30):
        k = ctl.choose_k()
        ctl.observe(step(k, k))  # everything accepted
    assert ctl.choose_k() > 1
    st = ctl.state()
    assert st.spec_disabled_reason is None and st.alpha["lookup"][0] > 0.9


def test_probing_an_off_source_costs_at_most_its_share_of_the_time():
    """A failed probe of γ costs v(γ) - 1 target steps: where v is steep (a 2-core CPU, v(1) ≈ 2.3) probes wait
    longer, so a source that never pays costs at most PROBE_SHARE of the time however short probe_every is."""
    steep = [1.0, 2.3, 2.8, 3.2, 4.1, 4.7, 5.3, 5.3, 5.9]
    for v in (CPU_V, steep):
        ctl = Adaptive(sources=("lookup",), v=v, t1=0.005, c={"lookup": 0.0}, probe_every=2, probe_max=4,
                       learn_costs=False)
        wasted = rounds = 0.0
        for _ in range(2000):
            k = ctl.choose_k()
            ctl.observe(step(k, 0) if k else step(0, 0))  # every draft rejected
            wasted += v_at(v, k) - 1
            rounds += v_at(v, k)
        assert wasted / rounds <= PROBE_SHARE * 1.1


def test_a_source_no_probe_could_turn_on_is_not_probed_until_it_has_drafted():
    """A probe pays only by changing the decision. A source that has not drafted has only its prior; where even a
    fully accepted probe would leave it off (a weak match bucket, α 0.35, on steep CPU verify costs), it is
    never probed. One whose full probe would turn it on still is."""
    steep = [1.0, 2.4, 2.83, 3.3, 4.07, 4.62, 5.1, 4.99, 5.85]  # SmolLM2-135M on 2 cores
    prior = {"lookup:short": (0.35, 0.8), "lookup:mid": (0.75, 0.9)}
    ctl = Adaptive(sources=tuple(prior), v=steep, t1=0.005, c={s: 0.0 for s in prior}, prior=prior,
                   probe_every=2, probe_max=4, learn_costs=False)
    short = mid = 0
    for _ in range(2000):
        ctl.choose_k()
        short += ctl.k_for("lookup:short") > 0
        if k := ctl.k_for("lookup:mid"):
            mid += 1
            ctl.observe(Step((1,), k, 0, 0.0, 0.0, "lookup:mid"))  # every probe of it fails
        else:
            ctl.observe(step(0, 0))
    assert not ctl.state().k["lookup:short"] and short == 0
    assert mid >= 2  # probed, and after failing it keeps being re-probed with backoff


def test_low_acceptance_switches_off_with_a_reason_and_reprobes_with_backoff():
    ctl = Adaptive(sources=("lookup",), v=CPU_V, t1=0.005, c={"lookup": 0.0}, probe_every=4, probe_max=16, warmup=2)
    ks = []
    for _ in range(80):
        k = ctl.choose_k()
        ks.append(k)
        ctl.observe(step(k, 0) if k else step(0, 0))  # every draft rejected
    first_off = ks.index(0)
    assert first_off <= 4  # warm-up, then off
    probes = [i for i, k in enumerate(ks) if i > first_off and k > 0]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert probes and gaps == sorted(gaps) and gaps[-1] >= 16  # the interval doubles up to probe_max (or more:
    # a probe that costs more waits longer, see the next test)
    reason = ctl.spec_disabled_reason
    assert (reason and reason.startswith("lookup: it would be") and "slower here" in reason
            and "drafts accepted" in reason)
    assert ctl.state().k == {"lookup": 0} and ctl.state().off["lookup"] == reason


def test_hysteresis_and_recovery():
    ctl = Adaptive(sources=("lookup",), v=CPU_V, t1=0.005, c={"lookup": 0.0}, probe_every=2, probe_max=2, warmup=1)
    for _ in range(20):
        k = ctl.choose_k()
        ctl.observe(step(k, 0) if k else step(0, 0))
    assert ctl.spec_disabled_reason
    for _ in range(400):  # content changed: now every draft is accepted; probes find it out (each failed
        # probe cost ~3 steps here, so they come at most every ~150 rounds: PROBE_SHARE)
        k = ctl.choose_k()
        ctl.observe(step(k, k) if k else step(0, 0))
    assert ctl.spec_disabled_reason is None and ctl.choose_k() > 1
    # on at a rate just under on_above would not have switched back; just under off_below switches off
    est = ctl.src["lookup"]
    assert est.on and ctl.on_above > ctl.off_below


def test_expensive_drafter_is_switched_off_even_at_full_acceptance():
    # the model as its own drafter: α = 1 but c = 1 and v(γ) > 1, so (γ+1) / (γ + v(γ)) < 1
    ctl = Adaptive(sources=("model",), v=CPU_V, t1=0.005, c={"model": 1.0})
    for _ in range(10):
        k = ctl.choose_k()
        ctl.observe(step(k, k, source="model", t_draft=k * 0.005) if k else step(0, 0))
    assert ctl.state().k["model"] == 0
    reason = ctl.spec_disabled_reason
    assert reason.startswith("model: it would be") and "c 1.00" in reason and "each drafted token 1.00×" in reason
    # even α = 1 would not pay, so it is never probed (a probe would cost the drafter a catch-up prefill)
    assert all(ctl.choose_k() == 0 for _ in range(300))


def test_explores_one_position_further_while_on():
    ctl = Adaptive(sources=("lookup",), k_min=1, k_max=8, v=CPU_V, t1=0.005, c={"lookup": 0.0},
                   alpha_prior=0.6, learn_costs=False, explore_every=4)
    ks = [ctl.choose_k() for _ in range(8)]  # no observations: the estimates stay put
    base = best_k([0.6], 0.0, CPU_V, 1, 8)[0]
    assert ks.count(base + 1) == 2 and ks.count(base) == 6


def test_hybrid_keeps_lookup_on_while_the_model_is_off():
    ctl = Adaptive(sources=("lookup", "model"), v=CPU_V, t1=0.005, c={"lookup": 0.0, "model": 1.0})
    for _ in range(20):
        ctl.choose_k()
        ctl.observe(step(3, 3, source="lookup"))
        ctl.observe(step(2, 2, source="model", t_draft=0.01))
    k = ctl.choose_k()
    assert ctl.k_for("lookup") == k > 1 and ctl.k_for("model") == 0
    assert ctl.spec_disabled_reason is None  # lookup still drafts
    assert "model" in ctl.state().off


class _Fixed:
    def __init__(self, name, out):
        self.name, self.out, self.asked = name, out, []
        self.sources, self.cost, self.prior = (name,), {name: 0.0}, {}

    def propose(self, context, k_for, params, rng):
        k = k_for(self.name)
        if k <= 0:
            return EMPTY
        self.asked.append(k)
        return Draft(tuple(self.out[:k]), None, self.name) if self.out and k else EMPTY

    def close(self):
        pass


def test_hybrid_drafter_lookup_first_then_model_and_per_source_limit():
    lookup, model = _Fixed("lookup", [1, 2, 3]), _Fixed("model", [7, 8, 9])
    h = HybridDrafter(lookup, model)
    two = lambda source: 2  # noqa: E731
    assert h.propose([0], two, None, None) == Draft((1, 2), None, "lookup") and model.asked == []
    lookup.out = []
    assert h.propose([0], two, None, None).source == "model"
    assert h.propose([0], {"lookup": 3, "model": 0}.get, None, None) is EMPTY
    assert model.asked == [2]  # model skipped, not asked with 0
    assert h.sources == ("lookup", "model") and h.cost == {"lookup": 0.0, "model": 0.0}


def test_fixed_k_state():
    f = FixedK(4)
    assert [f.choose_k() for _ in range(3)] == [4, 4, 4] and f.k_for("anything") == 4
    st = f.state()
    assert st.k_chosen == {4: 3} and not st.adaptive and st.label == "4" and st.k_now == 4 and st.k_mode == 4
    with pytest.raises(ValueError):
        FixedK(-1)


def test_online_v_refines_from_verify_times():
    ctl = Adaptive(sources=("lookup",), v=GPU_V, t1=0.005, c={"lookup": 0.0}, cost_weight=0.5)
    for _ in range(30):  # this machine is actually compute-bound: 3 drafts cost 3x one token
        ctl.observe(step(0, 0, t_verify=0.005))
        ctl.observe(step(3, 1, t_verify=0.015))
    assert math.isclose(ctl.v[3], 3.0, rel_tol=0.01)


def test_a_curve_timed_low_is_corrected_at_every_length_by_any_round():
    """A calibration taken while something else ran is low at every γ alike. Rounds of one source at one length
    correct the whole curve, and a source that pays only under the low curve switches off without a round."""
    true_v = [1.0, 2.2, *(1.0 + 0.7 * d for d in range(2, 16))]
    low = [1.0, *(max(1.0, 0.75 * x) for x in true_v[1:])]
    ctl = Adaptive(sources=("lookup:long", "lookup:mid"), k_max=15, v=low, t1=0.01,
                   c={"lookup:long": 0.0, "lookup:mid": 0.0},
                   prior={"lookup:long": (0.97, 0.97), "lookup:mid": (0.7, 0.85)})
    assert ctl.src["lookup:mid"].on  # 1.27x by the low curve (0.96x by the true one)
    for _ in range(12):
        k = ctl.choose_k()
        assert ctl.k_for("lookup:long") == k > 0
        ctl.observe(step(0, 0, t_verify=0.01))
        ctl.observe(step(k, k, source="lookup:long", t_verify=0.01 * true_v[k]))
    assert not ctl.src["lookup:mid"].on and ctl.src["lookup:mid"].rounds == 0
    assert math.isclose(ctl.v[2], true_v[2], rel_tol=0.1) and math.isclose(ctl.v[9], true_v[9], rel_tol=0.1)


def test_one_stalled_round_moves_the_curve_a_little():
    ctl = Adaptive(sources=("lookup",), k_max=8, v=CPU_V, t1=0.005, c={"lookup": 0.0})
    ctl.observe(step(4, 4, t_verify=50 * CPU_V[4] * 0.005))  # the machine stalled for one round
    assert all(x <= 1.11 * y for d, (x, y) in enumerate(zip(ctl.v, CPU_V)) if d != 4)  # the shared factor
    assert ctl.v[4] <= 1.25 * CPU_V[4]  # ... and its own point: clipped at twice, then a tenth of the way


def test_drafts_only_timed_lengths_and_finds_the_tile_dips():
    """Calibration times v at every γ to 8, then where γ + 1 rows fill a kernel tile (costs.timed_gammas); v in
    between is interpolated and not to be trusted. Gemma-3-270M's measured v: 32 rows cost less than 31 or 33."""
    v = [1.0, 2.1, 2.8, 3.2, 4.4, 4.8, 5.2, 3.7, 5.0, 5.3, 5.6, 4.7, 5.0, 5.2, 5.3, 5.1, 6.6, 6.7, 6.9, 6.1,
         6.4, 6.6, 6.9, 7.3, 7.6, 7.8, 8.1, 8.3, 8.5, 8.7, 8.9, 9.2, 10.5]
    timed = (1, 2, 3, 4, 5, 6, 7, 8, 11, 15, 19, 23, 27, 31, 32)
    ctl = Adaptive(sources=("lookup",), k_max=32, v=v, t1=0.01, c={"lookup": 0.0}, prior={"lookup": (0.99, 0.99)},
                   gammas=timed, learn_costs=False, explore_every=2)
    ks = set()
    for _ in range(40):
        k = ctl.choose_k()
        ks.add(k)
        ctl.observe(step(k, k, t_verify=0.01 * v[k]))  # every draft accepted
    assert ks <= set(timed) and 31 in ks  # the longest tile-filling batch, not 32 (one row more, 14 % dearer)
    untimed = Adaptive(sources=("lookup",), k_max=8, v=v[:9], t1=0.01, c={"lookup": 0.0},
                       prior={"lookup": (0.9, 0.9)}, learn_costs=False)
    assert untimed.choose_k() == 7  # no timed list: every γ, and the dip at 7 still wins


def test_a_prior_by_position_lets_a_long_copy_draft_far():
    """A verbatim copy that has run on runs further (drafters.LOOKUP_PRIOR, estimate.PRIOR_FROM): with its later
    positions' prior rising towards 1 the controller drafts far on a curve whose rows get cheap past 8 (Gemma-3-270M
    on 2 cores), where one value for every later position stops short. Positions beyond the prior's values keep
    its last one."""
    from localspec.tuning.estimate import SourceEstimate

    e = SourceEstimate(alpha_prior=0.9, later=(0.8, 0.95))
    assert e.alphas(10) == pytest.approx([0.9] + [0.8] * 7 + [0.95] * 2)
    assert SourceEstimate(alpha_prior=0.6).alphas(3) == pytest.approx([0.6] * 3)  # no `later`: each leans back
    v = [1.0 + min(d, 8) * 0.45 + max(0, d - 8) * 0.2 for d in range(64)]
    flat = Adaptive(sources=("lookup",), k_max=63, v=v, t1=0.01, c={"lookup": 0.0},
                    prior={"lookup": (0.97, 0.95)}, learn_costs=False)
    rising = Adaptive(sources=("lookup",), k_max=63, v=v, t1=0.01, c={"lookup": 0.0},
                      prior={"lookup": (0.97, 0.95, 0.97, 0.99, 0.995)}, learn_costs=False)
    assert rising.choose_k() > 32 > flat.choose_k()


def test_policy_is_the_states_label_and_k_now():
    """`policy()` (what a server reads for every answer) says what `state()` says, on and off."""
    fixed = FixedK(3)
    assert fixed.policy() == (fixed.state().label, fixed.state().k_now) == ("3", 3)
    # a model that could not pay at full acceptance (one that could would stay on trial until it drafts)
    ctl = Adaptive(sources=("lookup", "model"), v=CPU_V, t1=0.005, c={"lookup": 0.0, "model": 1.0}, warmup=2)
    seen = set()
    for i in range(60):
        k = ctl.choose_k()
        ctl.observe(step(k, k if i < 20 else 0) if k else step(0, 0))  # accepted, then every draft rejected
        st = ctl.state()
        assert ctl.policy() == (st.label, st.k_now)
        seen.add(st.k_now > 0)
    assert seen == {True, False}


def test_alphas_are_remembered_until_the_counts_change():
    """`state()` reads every source's α per request, so they are kept between updates; a copy made with
    `replace` (the controller's what-if of a probe) has its own, and its update leaves the original's alone."""
    e = SourceEstimate(alpha_prior=0.8, later=(0.9,))
    before = e.alphas(8)
    what_if = replace(e, n=list(e.n), a=list(e.a))
    what_if.update(4, 4, 0.95)
    assert e.alphas(8) == before and what_if.alphas(8) != before
    e.update(3, 1, 0.95)
    assert e.alphas(8) == SourceEstimate(alpha_prior=0.8, later=(0.9,), n=list(e.n), a=list(e.a)).alphas(8) != before


def test_a_source_switched_off_on_one_request_is_weighed_nearer_its_prior_on_the_next():
    """Acceptance belongs to the text: verbatim copies that failed on one request's answer are not taken to fail on
    the next request's. At its first round the counts weigh half, the source is decided again, and it drafts; a
    request whose own rounds fail it still turns it off."""
    ctl = Adaptive(sources=("lookup:verbatim",), v=CPU_V, t1=0.005, c={"lookup:verbatim": 0.0},
                   prior={"lookup:verbatim": (0.97, 0.95)}, learn_costs=False)
    assert ctl.src["lookup:verbatim"].on
    fails = 0
    while ctl.src["lookup:verbatim"].on:  # this request's copies break at their first token, until it is off
        ctl.choose_k()
        ctl.observe(step(4, 0, source="lookup:verbatim"))
        fails += 1
    assert fails <= 4
    ctl.choose_k()
    ctl.observe(step(0, 0))  # more rounds of the same request: it stays off
    assert not ctl.src["lookup:verbatim"].on
    ctl.observe(replace(step(0, 0), n_prompt=120))  # the next request's first round
    assert ctl.src["lookup:verbatim"].on and ctl.choose_k() > 0
