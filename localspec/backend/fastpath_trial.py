"""A fast path's test load, in the child process fastpath.Trial starts:
`python -m localspec.backend.fastpath_trial PATH MODE COUNTS`.

It loads the model in one mode (all, repack, none) and decodes a batch and a one-row step at each thread count;
a broken kernel kills it by a signal, which its parent reads as the verdict. A module of its own, so that the
decision (fastpath.py) does not import the model that imports it.
"""

from __future__ import annotations

import sys

from ..errors import LocalspecError
from .fastpath import PROBE_ROWS, UNLOADABLE_EXIT
from .loading import LoadOptions
from .model import Model


def trial(path: str, mode: str, counts: str) -> int:
    """The test load: `counts` is "1,2"; 0 when every decode ran, UNLOADABLE_EXIT when the file would not load."""
    try:
        model = Model.load(path, LoadOptions(n_ctx=128, n_batch=64, fast_path=mode, mmap=True))
    except LocalspecError as e:
        print(e, file=sys.stderr)
        return UNLOADABLE_EXIT
    tokens = [(7 + 31 * i) % model.n_vocab for i in range(max(PROBE_ROWS))]
    for n in (int(c) for c in counts.split(",")):
        model.set_threads(n, n)
        for rows in PROBE_ROWS:
            model.decode(tokens[:rows], 1)
            model.rewind(0)
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(trial(*sys.argv[1:]))
