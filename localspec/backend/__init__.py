"""The one package that imports llama_cpp: everything localspec asks of llama.cpp goes through here.

Why one place: localspec calls llama-cpp-python's low-level (and partly private, `_internals`) API, which moves
between releases, and some llama.cpp calls abort the process on bad input (a token a grammar rejects, a dead RPC
server). So every such call sits behind a small, checked interface here, and the rest of localspec (the loop,
sampling, verify, drafters, controllers, front ends) is Python and numpy that tests drive with fake models.
Importing this package loads llama.cpp: code that needs no model imports it lazily (`localspec models show`
reads a GGUF header without it).

  model.py    Model (one GGUF + its llama context: decode, rewind, tokenize, threads, flash attention),
              LoadOptions, check_gguf_file, in_own_thread
  ggml.py     backend start-up and llama.cpp's log, system and build info, ggml devices, RPC servers and
              which devices a model's offloaded layers use
  grammar.py  Grammar (llama.cpp's GBNF sampler as allowed-token masks), json_schema_grammar, GrammarError

OpenMP's wait policy is read once, when llama.cpp loads its OpenMP runtime; localspec leaves it at libgomp's
default (measured best idle and busy, see localspec/machine.py), and a user's OMP_WAIT_POLICY or GOMP_SPINCOUNT
is part of the calibration cache key.
"""

from __future__ import annotations

import llama_cpp  # (also reachable as localspec.backend.llama_cpp)

from .ggml import (add_rpc_servers, build_info, devices, serve_rpc, supports_gpu_offload,
                   supports_rpc, system_info)
from .grammar import Grammar, GrammarError, json_schema_grammar
from .model import LoadOptions, Model, check_gguf_file, in_own_thread

__all__ = ["Grammar", "GrammarError", "LoadOptions", "Model", "add_rpc_servers", "build_info", "check_gguf_file",
           "devices", "in_own_thread", "json_schema_grammar", "llama_cpp", "serve_rpc", "supports_gpu_offload",
           "supports_rpc", "system_info"]
