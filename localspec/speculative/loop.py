"""The speculative decoding loop: draft k, verify k+1 in one target pass, keep what the rule accepts.

`generate` is a generator that yields one frozen `Step` per verify round. With no drafter (or k = 0) a
round is plain decoding: one target token per pass. Everything above this module consumes the generator.

KV invariant between rounds: the target's cache holds context[:-1]; the last context token is decoded at the start
of the next round together with the drafts, so the first verify row scores draft position 0. A short prompt tail
(MERGE_MAX) joins the first round's pass instead of a pass of its own. Whatever is drafted, the random stream is
plain decoding's (verify.verify_same_seed: one draw per emitted token from the target's own rows), unless a drafter
hands in its q with a draft it drew with draws of its own (then rejection sampling). After verification the target
cache is rewound to drop rejected drafts (in `finally`, so an exception or a closed generator leaves it consistent);
on a recurrent or hybrid model that rewind restores the checkpoint taken before the pass and decodes the accepted
tokens again (backend/rollback.py). The drafter owns its cache and re-syncs by common prefix. """

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Generator, Sequence

import numpy as np

from ..errors import ContextOverflow
from ..sampling.constrain import constrain_rows
from ..sampling.logprobs import token_logprobs
from ..sampling.params import SamplingParams
from ..sampling.warp import Warped, greedy, warp
from .drafters import common_prefix
from .types import EMPTY, Controller, Draft, Drafter, Step, Target
from .verify import verify, verify_greedy

MERGE_MAX = 8  # a prompt tail this short is evaluated in the first verify pass, not a pass of its own
Progress = Callable[[int], None]  # prompt tokens in the target's cache so far, during prefill


def prefill(target: Target, prompt: Sequence[int], merge_max: int = 0, *, progress: Progress | None = None,
            batch: int = 0) -> tuple[int, int, list[int]]:
    """Bring the target cache to prompt[:-1], reusing the longest common prefix. Returns (evaluated, cached,
    pending): a tail of at most `merge_max` new tokens is left pending for the first verify pass, which then
    evaluates it with the last token and the drafts in one batch (an editor's keystroke changes a few tokens;
    a pass of their own would cost a whole extra forward). `progress` hears how many prompt tokens the cache
    holds: the reused prefix first, then after each `batch` tokens evaluated (llama-server's prompt progress)."""
    if not prompt:
        raise ValueError("empty prompt: nothing to condition on (models add BOS; pass at least one token)")
    if len(prompt) >= target.n_ctx:
        raise ContextOverflow(f"prompt is {len(prompt)} tokens but the context holds {target.n_ctx}; "
                              "shorten it or raise --ctx")
    keep = target.restore(min(common_prefix(target.tokens, prompt), len(prompt) - 1))  # a recurrent state: <=
    rest = list(prompt[keep:-1])
    if progress is not None:
        progress(keep)
    if len(rest) > merge_max:
        step = batch if progress is not None and batch > 0 else len(rest)  # the backend batches the same way
        for start in range(0, len(rest), step):
            target.decode(rest[start:start + step], 0)
            if progress is not None:
                progress(keep + min(start + step, len(rest)))
        rest = []
    # where a later request can start: another answer to this prompt, or to the one before (a follow-up's)
    target.checkpoint("prompt", keep_last=True)
    return len(prompt) - keep, keep, rest


def generate(target: Target, prompt: Sequence[int], *, drafter: Drafter | None = None,
             controller: Controller | None = None, params: SamplingParams = SamplingParams(),
             max_tokens: int = 256, rng: np.random.Generator | None = None, progress: Progress | None = None,
             batch: int = 0) -> Generator[Step, None, None]:
    """Yield one `Step` per round until end-of-generation, `max_tokens`, or a full context.
    The controller decides how much to draft (none given: nothing is drafted); the loop only caps it by what
    is left. `progress` and `batch`: see `prefill`."""
    rng = rng if rng is not None else params.rng()
    t0 = time.perf_counter()
    # a recurrent state keeps its prompt's end only as a checkpoint taken there: no tail joins the first pass
    n_prompt, n_cached, pending = prefill(target, prompt, MERGE_MAX if target.cuts_in_place else 0,
                                          progress=progress, batch=batch)
    t_prompt = time.perf_counter() - t0
    context = list(prompt)
    emitted = 0
    try:
        while True:
            room = target.n_ctx - target.n_past - len(pending)  # positions left for [last, drafts...]
            budget = max_tokens - emitted
            k_r = min(controller.choose_k() if drafter and controller is not None else 0, budget - 1, room - 1)
            t1 = time.perf_counter()
            draft = EMPTY
            if drafter and controller is not None and k_r > 0:
                draft = _through_eog(target, drafter.propose(context, _capped(controller, k_r), params, rng))
            t2 = time.perf_counter()
            n_acc, nxt, rows = _verify_round(target, context, draft, params, rng, pending)
            t_verify = time.perf_counter() - t2
            if pending:  # the pass evaluated the prompt's tail too: it is prompt time, as llama-server counts it
                t_prompt, t_verify, pending = t_prompt + t_verify, 0.0, []
            new, finish = _truncate(target, list(draft.tokens[:n_acc]) + [nxt], budget)
            logprobs = token_logprobs(rows, new, params.logprobs)
            context.extend(new)
            emitted += len(new)
            if finish is None and target.n_past >= target.n_ctx:  # no position left for the pending token
                finish = "context"
            step = Step(tokens=tuple(new), drafted=len(draft), accepted=n_acc, t_draft=t2 - t1,
                        t_verify=t_verify, source=draft.source, finish=finish, n_prompt=n_prompt,
                        n_cached=n_cached, t_prompt=t_prompt, logprobs=logprobs, fed=draft.fed,
                        t_first=max(0.0, draft.first_at - t1) if draft.first_at else 0.0)
            n_prompt = n_cached = 0
            t_prompt = 0.0
            if controller is not None:
                controller.observe(step)
            yield step
            if finish:
                return
    finally:
        target.rewind(len(context) - 1)


def _capped(controller: Controller, cap: int) -> Callable[[str], int]:
    """The controller's per-source draft length, capped by the tokens and positions left this round."""
    return lambda source: min(controller.k_for(source), cap)


def _through_eog(target: Target, draft: Draft) -> Draft:
    """The draft up to and including its first end-of-generation token. Nothing after it can ever be emitted
    (accepted, it ends the answer; rejected, the round ends there), so those verify rows would be computed for
    nothing, and dropping them changes no output, sampled or greedy. A copy from the prompt runs into the chat
    template where a pasted document or code block ends the user's message (`<|im_end|>`, `<|im_start|>assistant`,
    the answer's start; counted in docs/bench/lookup.md#drafts-through-eog)."""
    for i, t in enumerate(draft.tokens[:-1]):
        if target.is_eog(t):
            q = draft.probs
            return replace(draft, tokens=draft.tokens[:i + 1],
                           probs=None if q is None else Warped(q.ids[:i + 1], q.probs[:i + 1]))
    return draft


def _verify_round(target: Target, context: Sequence[int], draft: Draft, params: SamplingParams,
                  rng: np.random.Generator, head: Sequence[int] = ()) -> tuple[int, int, np.ndarray]:
    """One target pass over [*head, context[-1], d_1..d_k] (head: a prompt tail not yet in the cache); logits
    for exactly the last k+1 rows (row i has seen the context and d_1..d_i), returned raw for logprobs.
    Rejected drafts are dropped from the cache before returning, whatever happens."""
    n_past = target.n_past + len(head)
    n_acc = 0
    if draft.tokens:
        target.checkpoint("round", ahead=len(draft))  # a rejection rewinds at most len(draft) tokens
    try:
        raw = target.decode([*head, context[-1], *draft.tokens], len(draft) + 1)
        logits = constrain_rows(params, raw, context, draft.tokens)  # logit_bias, grammar: p as requested
        if params.greedy:
            n_acc, nxt = verify_greedy(greedy(logits, params, context, draft.tokens), draft.tokens)
        else:
            n_acc, nxt = verify(warp(logits, params, context, draft.tokens), draft.tokens, draft.probs, rng)
        return n_acc, nxt, raw
    finally:
        target.rewind(n_past + 1 + n_acc)


def _truncate(target: Target, new: list[int], budget: int) -> tuple[list[int], str | None]:
    """Cut the round's tokens at the first end-of-generation token and at the token budget."""
    for i, t in enumerate(new):
        if target.is_eog(t):
            return new[:i], "stop"
    if len(new) >= budget:
        return new[:budget], "length"
    return new, None
