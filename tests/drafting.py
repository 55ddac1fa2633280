"""What the drafter tests (MTP heads, chained heads, EAGLE-3 files, recurrent targets) share: a fixed-k run of the
loop, and the rule that a speculative text may part from plain decoding's only at a near tie of the target's own
logits (docs/design.md, Numerics)."""

from __future__ import annotations

import numpy as np

from localspec.backend import Model
from localspec.sampling.params import SamplingParams
from localspec.speculative.loop import generate
from localspec.tuning.fixed import FixedK

NEAR_TIE = 1e-3  # batched and one-row decodes differ by ~1e-4 in these logits; a wrong state by ~0.1


def run_fixed(target: Model, prompt: list[int], drafter=None, k: int = 0, params: SamplingParams = SamplingParams(),
              n: int = 40, fresh: bool = True) -> tuple[list[int], list]:
    """The tokens and steps of n tokens at draft length k (0 or no drafter: plain decoding), from an empty cache
    unless `fresh` is False (a follow-up that reuses the prompt)."""
    if fresh:
        target.rewind(0)
    steps = list(generate(target, prompt, drafter=drafter, controller=FixedK(k), params=params, max_tokens=n))
    return [t for s in steps for t in s.tokens], steps


def same_or_near_tie(reference: Model, prompt: list[int], plain: list[int], spec: list[int]) -> None:
    """The texts agree, or part where the target's own logits hold a near tie."""
    if plain == spec:
        return
    i = next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), min(len(plain), len(spec)))
    assert i < min(len(plain), len(spec)), f"one text stopped early at {i}"
    reference.rewind(0)
    row = reference.decode(prompt + plain[:i], 1)[0].astype(np.float64)
    assert abs(row[plain[i]] - row[spec[i]]) < NEAR_TIE, f"parted at token {i} without a near tie"
