"""A child process that hands grammars to llama.cpp the way a request does, under a memory limit, for
tests/test_hostile_grammar.py and scripts/soak/hostile.py: what would kill or hold a server kills or holds only
this child, and the parent reads how each grammar ended.

Run as `python tests/hostile_child.py MODEL MEMORY_BYTES < grammars.json`: one JSON line out per grammar,
{"verdict": "refused" | "ok", "error": ..., "s": seconds}, where "ok" means llama.cpp parsed it, masked the
vocabulary and followed up to STEPS allowed tokens.
"""

from __future__ import annotations

import json
import resource
import sys
import time

STEPS = 4  # tokens followed after the first mask, as a request with n_predict 4 would


def main(model_path: str, memory: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    from localspec.backend import Grammar, GrammarError, LoadOptions, Model

    model = Model.load(model_path, LoadOptions(n_ctx=256))
    for gbnf in json.load(sys.stdin):
        start = time.monotonic()
        try:
            g = Grammar(model, gbnf)
            for _ in range(STEPS):
                allowed = g.mask().nonzero()[0]
                if not len(allowed):
                    break
                g.accept(int(allowed[0]))
            g.close()
            out = {"verdict": "ok"}
        except GrammarError as e:
            out = {"verdict": "refused", "error": str(e)}
        out["s"] = round(time.monotonic() - start, 3)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
