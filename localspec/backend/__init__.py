"""The one package that imports llama_cpp: everything localspec asks of llama.cpp goes through here.

Why one place: localspec calls llama-cpp-python's low-level (and partly private, `_internals`) API, which moves
between releases, and some llama.cpp calls abort the process on bad input (a token a grammar rejects, a dead RPC
server). So every such call sits behind a small, checked interface here, and the rest of localspec (the loop,
sampling, verify, drafters, controllers, front ends) is Python and numpy that tests drive with fake models.
Its public names load llama.cpp on first use (PEP 562 `__getattr__`), so `backend.machine` (the cores, the CPU,
the load on them, read from /proc) serves the thread controller without loading it, and so does `models show`
reading a GGUF header.

  model.py    Model (one GGUF + its llama context: decode, rewind, tokenize, threads, flash attention),
              in_own_thread
  facts.py    memory_facts: a model's memory kind and the rollback method a load chooses (models show)
  rollback.py rewinding a recurrent or hybrid memory: checkpoints (spare sequence or host copy), replay
  loading.py  LoadOptions, check_gguf_file, and what a load builds (context parameters, weight placement)
  ggml.py     backend start-up and llama.cpp's log, system and build info, ggml devices, RPC servers and
              which devices a model's offloaded layers use
  grammar.py  Grammar (llama.cpp's GBNF sampler as allowed-token masks), json_schema_grammar, GrammarError
  fastpath.py which extra CPU buffer types (AMX, CPU_REPACK) a model loads with, tested in a child process
  memory.py   where the weights live: llama.cpp's map of the file, or read into memory that huge pages back
  machine.py  the cores this process may use, the CPU's name, how busy the cores are, OpenMP's settings

OpenMP's wait policy is read once, when llama.cpp loads its OpenMP runtime; localspec leaves it at libgomp's
default (the fastest idle and busy: docs/bench/threads.md#openmp), and a user's OMP_WAIT_POLICY or GOMP_SPINCOUNT
is part of the calibration cache key.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import llama_cpp

    from .facts import memory_facts
    from .ggml import (
        add_rpc_servers,
        build_info,
        devices,
        llama_build,
        serve_rpc,
        supports_gpu_offload,
        supports_rpc,
        system_info,
    )
    from .grammar import Grammar, GrammarError, json_schema_grammar
    from .loading import LoadOptions, check_gguf_file
    from .model import Model, in_own_thread

_HOME = {"add_rpc_servers": ".ggml", "build_info": ".ggml", "devices": ".ggml", "llama_build": ".ggml",
         "serve_rpc": ".ggml",
         "supports_gpu_offload": ".ggml", "supports_rpc": ".ggml", "system_info": ".ggml", "Grammar": ".grammar",
         "GrammarError": ".grammar", "json_schema_grammar": ".grammar", "LoadOptions": ".loading",
         "Model": ".model", "check_gguf_file": ".loading", "in_own_thread": ".model", "memory_facts": ".facts"}

# spelled out (not built from _HOME) so linters see the lazily loaded names as exported; tests/test_lint.py
# checks the two agree
__all__ = ["Grammar", "GrammarError", "LoadOptions", "Model", "add_rpc_servers", "build_info", "check_gguf_file",
           "devices", "in_own_thread", "json_schema_grammar", "llama_build", "llama_cpp", "memory_facts", "serve_rpc",
           "supports_gpu_offload", "supports_rpc", "system_info"]


def __getattr__(name: str) -> Any:
    """Load llama.cpp when one of its names is first asked for, not when a submodule without it is imported."""
    if name == "llama_cpp":
        return importlib.import_module("llama_cpp")
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name], __name__), name)
