"""Grammars over a model's vocabulary: llama.cpp's GBNF engine and JSON-schema converter, for constrained decoding.

Why a module: constrain.py (the constraint logic, pure numpy) needs only "which tokens may come next" and "the
state after this token"; this is that interface over llama.cpp's grammar sampler, kept here because it is
llama_cpp code. Parse errors become `GrammarError` (exit 2 on the command line, a 400 from the server).
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

import llama_cpp
import numpy as np

from ..errors import LocalspecError

if TYPE_CHECKING:
    from .model import Model


class GrammarError(LocalspecError):
    """A GBNF grammar or JSON schema that llama.cpp cannot use."""

    exit_code = 2


def json_schema_grammar(schema: dict) -> str:
    """A JSON schema -> GBNF, with llama-cpp-python's port of llama.cpp's json-schema-to-grammar."""
    import json

    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        return json_schema_to_gbnf(json.dumps(schema))
    except Exception as e:  # the converter raises whatever it trips on (KeyError, ValueError, TypeError, ...)
        raise GrammarError(f"cannot use this JSON schema: {type(e).__name__}: {e}") from None


class Grammar:
    """One state of a GBNF grammar over `model`'s vocabulary: which tokens may come next (`mask`, `allows`),
    and the state after a token (`accept`, on a `clone` to keep this one). Wraps llama.cpp's grammar sampler.

    `accept` must only see allowed tokens: llama.cpp aborts the process on a token its grammar rejects, so
    callers check `allows` first (constrain.py does)."""

    def __init__(self, model: "Model", gbnf: str, root: str = "root", *, _smpl: Any = None) -> None:
        self._vocab = model._model.vocab
        self.n_vocab = model.n_vocab
        if _smpl is None:
            _smpl = llama_cpp.llama_sampler_init_grammar(self._vocab, gbnf.encode("utf-8"), root.encode("utf-8"))
            if not _smpl:
                raise GrammarError("llama.cpp could not parse the grammar (GBNF syntax, or no rule "
                                   f"'{root}'); check it with llama.cpp's grammar docs")
        self._smpl = _smpl
        self._model = model  # keeps the vocabulary alive as long as this state
        self._one, self._full = _TokenArray(1), _TokenArray(self.n_vocab)  # scratch, shared with clones

    def clone(self) -> "Grammar":
        g = Grammar.__new__(Grammar)
        g._vocab, g.n_vocab, g._model, g._one, g._full = self._vocab, self.n_vocab, self._model, self._one, self._full
        g._smpl = llama_cpp.llama_sampler_clone(self._smpl)
        return g

    def mask(self) -> np.ndarray:
        """bool [n_vocab]: True where the grammar allows the token next (end-of-generation only when complete)."""
        a = self._full
        a.data.logit[:] = 0.0
        llama_cpp.llama_sampler_apply(self._smpl, ctypes.byref(a.c))
        return np.isfinite(a.data.logit)

    def allows(self, token: int) -> bool:
        a = self._one
        a.data.id[0], a.data.logit[0] = token, 0.0
        a.c.size = 1
        llama_cpp.llama_sampler_apply(self._smpl, ctypes.byref(a.c))
        return bool(np.isfinite(a.data.logit[0]))

    def accept(self, token: int) -> None:
        llama_cpp.llama_sampler_accept(self._smpl, token)

    def close(self) -> None:
        if getattr(self, "_smpl", None):
            llama_cpp.llama_sampler_free(self._smpl)
            self._smpl = None

    __del__ = close


class _TokenArray:
    """A llama_token_data_array over numpy storage: ids 0..n-1, logits 0 (the grammar only sets -inf)."""

    def __init__(self, n: int) -> None:
        self.data = np.recarray((n,), dtype=np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)],
                                                    align=True))
        self.data.id[:] = np.arange(n, dtype=np.intc)
        self.data.logit[:] = 0.0
        self.data.p[:] = 0.0
        self.c = llama_cpp.llama_token_data_array(data=self.data.ctypes.data_as(llama_cpp.llama_token_data_p),
                                                  size=n, selected=-1, sorted=False)
