"""The strong check for DFlash drafter files: on the same tiny target and drafter file (tests/tiny_dflash.py),
prompt and draft length, localspec drafts the tokens llama.cpp's own `draft-dflash` driver drafts, round by round,
and the target accepts as many of them. Where a drafted token differs, localspec's row holds a near tie between
the two (the random drafter's rows are flat: top two 2.5e-4 apart were seen, and the target's features differ by
batch shape at that level). Needs LOCALSPEC_LLAMA_SPECULATIVE (tests/llamacpp_rounds.py); skipped without it."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pytest
from llamacpp_rounds import llama_cpp_rounds, localspec_rounds, needs_binary
from test_dflash import NEAR, dflash_file
from test_eagle3 import qwen35_file

from localspec.backend import LoadOptions, Model
from localspec.backend.dflash import DFlashHead
from localspec.speculative.dflash import DFlashDrafter

pytestmark = needs_binary


class Keeping(DFlashHead):
    """Keeps each block's rows, to tell a near tie from a wrong draft."""

    blocks: list[np.ndarray]

    def block(self, context: Sequence[int], k: int) -> np.ndarray | None:
        rows = super().block(context, k)
        if rows is not None:
            self.blocks = [*getattr(self, "blocks", []), rows.copy()]
        return rows


@pytest.mark.parametrize("k", [1, 3, 7])
def test_drafts_and_acceptance_match_llama_cpp(smollm2_path: Path, k: int):
    target, drafter = qwen35_file(smollm2_path, False), dflash_file(smollm2_path)
    theirs = llama_cpp_rounds(["-m", str(target), "-md", str(drafter)], "draft-dflash", k)
    heads: list[Keeping] = []

    def make(t: Model) -> DFlashDrafter:
        heads.append(Keeping(t, drafter))
        return DFlashDrafter(heads[-1])

    ours = localspec_rounds(Model.load(target, LoadOptions(n_ctx=512)), make, k)
    # near the end llama.cpp decodes a block of k and keeps what is left to generate; localspec decodes the
    # shorter block (both lossless), and a block's rows depend on its length (attention runs both ways)
    n = min(next((i for i, (d, _) in enumerate(theirs) if len(d) < k), len(theirs)), len(ours))
    assert n >= 5 and len(heads[0].blocks) >= n
    ties = 0
    for (mine, a), (their, b), rows in zip(ours[:n], theirs[:n], heads[0].blocks):
        assert a == b and len(mine) == len(their) == k
        for j, (x, y) in enumerate(zip(mine, their)):
            if x != y:
                assert rows[j][x] - rows[j][y] < NEAR, f"drafts {x} and {y} are no near tie"
                ties += 1
    assert ties <= 2
