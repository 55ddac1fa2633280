"""What `models show` learns of a model by loading it: its memory kind and the rollback method a load chooses.
Kept beside model.py, not in it: it builds a Model, and Model itself never needs it."""

from __future__ import annotations

from pathlib import Path

import llama_cpp
from llama_cpp import _internals

from .ggml import _init_backend
from .loading import LoadOptions, check_gguf_file
from .model import Model
from .rollback import RollbackInfo, memory_kind


def memory_facts(path: str | Path) -> RollbackInfo:
    """The model's memory kind and, for a recurrent or hybrid one, the rollback method a load chooses here
    (a load with a small context and the timings of rollback.choose); an attention model is not loaded."""
    p = check_gguf_file(path)
    _init_backend(False)
    mparams = llama_cpp.llama_model_default_params()
    mparams.vocab_only = True  # llama.cpp knows the architecture, and so the memory kind, from the header
    vocab = _internals.LlamaModel(path_model=str(p), params=mparams, verbose=False)
    try:
        kind = memory_kind(vocab.model)
    finally:
        vocab.close()
    if kind == "attention":
        return RollbackInfo(kind, "cut")
    m = Model.load(p, LoadOptions(n_ctx=512))
    try:
        return m.rollback_info
    finally:
        m.close()
