"""Greedy runs: do spec-on and spec-off texts agree, and if not, where and why did they first diverge?

Both paths emit only the target's own argmax, but a batched verify computes logits with a different reduction
order than a single-token decode (docs/design.md, "The verify rule": max |Δlogit| ≈ 1.1 on CPU), so at a
near-tie the argmax can flip. At the first divergent position we re-run the target on the shared prefix and
report its top-2 logits: a small gap means numerics, a large gap would mean a bug.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import partial
from typing import Sequence

import numpy as np

from ..backend import Model
from ..speculative.drafters import common_prefix

NEAR_TIE_LOGITS = 1.0  # top-2 gap below this is within batched-vs-single numeric noise on CPU


@dataclass(frozen=True)
class Agreement:
    target: str
    drafter: str
    k: int | str
    task: str
    prompt_id: str
    agree: bool
    n_compared: int  # tokens compared (the shorter text)
    position: int | None = None  # first divergent generated token (0-based), None when they agree
    plain_token: str | None = None  # text of each side's token there ("<end>" = generation stopped)
    spec_token: str | None = None
    top1: str | None = None  # the target's two best tokens on the shared prefix, and their logit gap
    top2: str | None = None
    gap: float | None = None
    near_tie: bool | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def compare(target: Model, prompt: Sequence[int], plain: Sequence[int], spec: Sequence[int], *, label: str,
            drafter: str, k: int | str, task: str, prompt_id: str) -> Agreement:
    """Compare one greedy spec run with the plain run on the same prompt (target cache is clobbered)."""
    n = min(len(plain), len(spec))
    i = common_prefix(plain, spec)
    agreement = partial(Agreement, target=label, drafter=drafter, k=k, task=task, prompt_id=prompt_id)
    if list(plain) == list(spec):  # same max_tokens: a shorter text means that side stopped (EOG) earlier
        return agreement(agree=True, n_compared=n)
    tok = lambda seq: repr(target.detokenize([seq[i]])) if i < len(seq) else "<end>"  # noqa: E731
    target.rewind(0)
    logits = target.decode(list(prompt) + list(plain[:i]), 1)[0]
    top = np.argsort(-logits)[:2]
    gap = float(logits[top[0]] - logits[top[1]])
    return agreement(agree=False, n_compared=n, position=i, plain_token=tok(plain), spec_token=tok(spec),
                     top1=repr(target.detokenize([int(top[0])])), top2=repr(target.detokenize([int(top[1])])),
                     gap=gap, near_tie=gap < NEAR_TIE_LOGITS)

