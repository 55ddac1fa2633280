"""An EAGLE-3 drafter file drafts: a small model trained to draft for one target from the target's hidden states.

It drafts as the target's own MTP head does (speculative/mtp.py): one row of logits per step from an engine that
reads the target's states (backend/eagle3.py drives llama.cpp), a greedy request taking the argmax and a sampled
one the coupled same-seed pick, so the text is plain decoding's, token for token. It differs in what it is, so it
is its own source, "eagle3": its cost c and acceptance are learnt apart from a head's.
"""

from __future__ import annotations

from typing import Mapping

from .mtp import MtpDrafter

EAGLE3 = "eagle3"  # the source name and the drafter's name


class Eagle3Drafter(MtpDrafter):
    """Drafts with an EAGLE-3 drafter file (backend.eagle3.Eagle3Head); see the module docstring."""

    name: str = EAGLE3
    sources: tuple[str, ...] = (EAGLE3,)
    cost: Mapping[str, float | None] = {EAGLE3: None}  # timed at load, refined online
    # no acceptance of our own to start from: the MTP head's prior (docs/bench/mtp.md#prior), learnt online
    prior: Mapping[str, tuple[float, ...]] = {EAGLE3: (0.7, 0.8)}
