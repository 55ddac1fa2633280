"""The types the loop, the drafters and the controllers share: a leaf, so none of them imports another for them.

`Step` is what the loop yields per verify round; `Draft` what a drafter proposes; `Drafter`, `Controller` and
`Target` are the protocols the loop is written against (backend.Model is the real Target; tests drive fakes);
the source names say which drafter, and which strength of lookup match, proposed a draft.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Mapping, Protocol, Sequence

import numpy as np

from ..models import LOOKUP
from ..sampling.logprobs import TokenLogprob
from ..sampling.params import SamplingParams

if TYPE_CHECKING:
    from ..sampling.warp import Warped

NO_DRAFTER = "none"  # "no speculation", as a drafter choice and in reports
LOOKUP_SHORT, LOOKUP_MID, LOOKUP_LONG = f"{LOOKUP}:short", f"{LOOKUP}:mid", f"{LOOKUP}:long"  # by match length ...
LOOKUP_VERBATIM = f"{LOOKUP}:verbatim"  # ... and the longest: the answer is copying the context word for word
LOOKUP_CACHE = f"{LOOKUP}:cache"  # a match in earlier requests (the engine's SuffixCache)
LOOKUP_LOOP = f"{LOOKUP}:loop"  # a long match whose occurrence overlaps the context's own ending: the text repeats
LOOKUP_REINDENT = f"{LOOKUP}:reindented"  # a match across lines at another depth: copied with the indentation moved
LOOKUP_GAPPED = f"{LOOKUP}:gapped"  # a match across one changed token (a template's slot): the copy resumes after it


@dataclass(frozen=True)
class Step:
    """One verify round."""

    tokens: tuple[int, ...]  # emitted this round: accepted drafts + the target's own token (EOG excluded)
    drafted: int  # draft tokens proposed (0 = plain decoding round)
    accepted: int  # drafts the target accepted
    t_draft: float  # seconds spent drafting
    t_verify: float  # seconds in the target pass + verify
    source: str = ""  # drafter that proposed ("lookup", "model"; "" = none)
    finish: str | None = None  # "stop" (end-of-generation token), "length" (max_tokens), "context" (n_ctx)
    n_prompt: int = 0  # first round only: prompt tokens evaluated ...
    n_cached: int = 0  # ... and reused from the cache
    t_prompt: float = 0.0  # ... and prefill seconds
    fed: int = 0  # context tokens the drafter decoded before drafting (`Draft.fed`), inside t_draft
    t_first: float = 0.0  # seconds of t_draft until the first draft token was picked (0: not timed; `Draft.first_at`)
    logprobs: tuple[TokenLogprob, ...] = ()  # per emitted token, when `params.logprobs` asks (logprobs.py)


@dataclass(frozen=True)
class Draft:
    tokens: tuple[int, ...]
    # q, one row per token, when the tokens were drawn from q with draws of the drafter's own (verified by
    # rejection sampling); None when the draft is a function of the context and the request's RNG state
    # (prompt lookup, a greedy draft, a model draft drawn with the target's next uniforms): verified by the
    # same-seed rule, which emits plain decoding's own tokens (verify.py)
    probs: Warped | None = None
    source: str = ""  # which drafter produced it ("lookup", "model"), for per-source stats
    # context tokens the drafter decoded before its first draft token: normally the last round's accepted tail;
    # after rounds it did not draft, everything since (a model drafter's catch-up, priced apart: controller.py)
    fed: int = 0
    # time.perf_counter() when the first draft token was picked (0: not timed): a model drafter's round splits into
    # what comes before it (catching up on the accepted tail, restoring its cache) and a step a further token
    # (tuning/round_cost.py); timed apart, neither is inferred from the other
    first_at: float = 0.0

    def __len__(self) -> int:
        return len(self.tokens)


EMPTY = Draft(())

KFor = Callable[[str], int]  # source -> draft length allowed this round (the controller's decision)


class Drafter(Protocol):
    name: str
    sources: tuple[str, ...]  # the `Draft.source` values it produces
    cost: Mapping[str, float | None]  # c per source (drafter time per token ÷ target step); None = measure
    prior: Mapping[str, tuple[float, ...]]  # per source, the acceptance it expects (first, later); {} = no idea

    def propose(self, context: Sequence[int], k_for: KFor, params: SamplingParams,
                rng: np.random.Generator) -> Draft: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ControllerState:
    """A snapshot for stats, `run --json` and the acceptance log."""

    adaptive: bool
    k_chosen: dict[int, int]  # choose_k() result -> rounds
    c: dict[str, float]  # per source
    v: tuple[float, ...]  # v(0..k_max)
    alpha: dict[str, tuple[float, ...]]  # per source, α_1..α_k_max
    k: dict[str, int]  # per source: the γ it would use now (0 = off)
    rate: dict[str, float]  # per source: predicted speed vs plain at that γ
    spec_disabled_reason: str | None
    off: dict[str, str] = field(default_factory=dict)  # per source that is off now: why
    label: str = "auto"  # how the draft length is chosen: "auto" or the pinned γ ("4")
    k_now: int = 0  # the longest draft any source would make now (0 = speculation off)

    @property
    def k_mode(self) -> int:
        """The draft length chosen in most rounds so far (0 when no round drafted): what "k" means in a report."""
        drafted = {k: n for k, n in self.k_chosen.items() if k > 0}
        return max(drafted, key=lambda k: (drafted[k], k)) if drafted else 0

    def since(self, before: "ControllerState | None") -> "ControllerState":
        """This state with `k_chosen` counting only the rounds after `before` (a controller lives across
        requests; a report of one request wants that request's rounds)."""
        prev = before.k_chosen if before else {}
        return replace(self, k_chosen={k: n - prev.get(k, 0) for k, n in sorted(self.k_chosen.items())
                                       if n > prev.get(k, 0)})

    def to_dict(self) -> dict:
        return {"adaptive": self.adaptive, "k_chosen": {str(k): n for k, n in sorted(self.k_chosen.items())},
                "c": self.c, "v": list(self.v), "alpha": {s: list(a) for s, a in self.alpha.items()},
                "k": self.k, "rate": self.rate, "spec_disabled_reason": self.spec_disabled_reason, "off": self.off,
                "label": self.label, "k_now": self.k_now}


class Controller(Protocol):
    """The one owner of "how much to draft, from which source". Each round the loop calls `choose_k()`
    (the longest draft any source may make now; 0 = decode plainly), the drafter asks `k_for(source)` for
    the source it is about to use, and the loop reports the round to `observe(step)`. Reports read
    `state()`; nothing else stores a draft length."""

    def choose_k(self) -> int: ...

    def k_for(self, source: str) -> int: ...

    def observe(self, step: "Step") -> None: ...

    def state(self) -> "ControllerState": ...

    def policy(self) -> tuple[str, int]:
        """(how γ is chosen: "auto" or the pinned γ, the longest draft any source would make now): `state()`'s
        label and k_now without the rest, which a server reads for every answer."""
        ...


class Target(Protocol):
    """What the loop needs of the target model (backend.Model; tests/fakes.FakeModel). Between rounds its
    cache holds `tokens` = context[:-1]; `decode` appends tokens and returns logits for the last `logits_rows`."""

    tokens: list[int]

    @property
    def n_ctx(self) -> int: ...

    @property
    def n_past(self) -> int: ...

    @property
    def cuts_in_place(self) -> bool: ...

    def is_eog(self, token: int) -> bool: ...

    def rewind(self, n_past: int) -> None: ...

    def restore(self, n_past: int) -> int: ...

    def checkpoint(self, tag: str, *, ahead: int = 0, keep_last: bool = False) -> None: ...

    def decode(self, tokens: Sequence[int], logits_rows: int = 1) -> np.ndarray: ...
