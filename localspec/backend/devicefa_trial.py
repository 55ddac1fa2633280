"""Flash attention's test on a GPU device, in the child process devicefa.run_test starts:
`python -m localspec.backend.devicefa_trial PATH N_GPU_LAYERS FAST_PATH`.

It loads the model with its layers on the device and flash attention on, and decodes what a speculative round
decodes: a prefix, one row, a rewind to the prefix, then a few rows in one batch. A broken kernel kills it by a
signal, which its parent reads as the verdict.
"""

from __future__ import annotations

import sys

from ..errors import LocalspecError
from .devicefa import PREFIX, ROWS, UNLOADABLE_EXIT
from .loading import LoadOptions
from .model import Model


def trial(path: str, n_gpu_layers: str, fast_path: str) -> int:
    """0 when every decode ran, UNLOADABLE_EXIT when the file would not load."""
    try:
        model = Model.load(path, LoadOptions(n_ctx=128, n_batch=64, n_gpu_layers=int(n_gpu_layers),
                                             flash_attn=True, fast_path=fast_path))
    except LocalspecError as e:
        print(e, file=sys.stderr)
        return UNLOADABLE_EXIT
    tokens = [(7 + 31 * i) % model.n_vocab for i in range(PREFIX + ROWS + 1)]
    model.decode(tokens[:PREFIX], 1)
    model.decode(tokens[PREFIX:PREFIX + 1], 1)
    model.rewind(PREFIX)
    model.decode(tokens[PREFIX:PREFIX + ROWS], ROWS)
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(trial(*sys.argv[1:]))
