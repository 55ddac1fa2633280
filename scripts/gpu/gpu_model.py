#!/usr/bin/env python3
"""Write the GPU check's random-weight targets and the tokenizer they carry (scripts/gpu/gpu_check.sh, gpu_bundle.sh).

The GGUF writing lives in localspec/models/gguf_tools.py (write_tokenizer, write_random_model, SHAPES); this is
its command line.

usage: gpu_model.py tokenizer SRC.gguf OUT.gguf            (tokenizer keys only, no tensors: ~2 MB)
       gpu_model.py make --shape 8b [--type q4_k] --tokenizer T.gguf OUT.gguf
"""

from __future__ import annotations

import argparse
import sys

from localspec.models.gguf_tools import SHAPES, TYPES, write_random_model, write_tokenizer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tokenizer", help="write SRC's tokenizer keys alone to OUT")
    t.add_argument("src")
    t.add_argument("out")
    m = sub.add_parser("make", help="write a random-weight llama GGUF")
    m.add_argument("out")
    m.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    m.add_argument("--type", choices=sorted(TYPES), default="q4_k")
    m.add_argument("--tokenizer", required=True, help="a GGUF to copy tokenizer.* from")
    m.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.cmd == "tokenizer":
        p = write_tokenizer(a.src, a.out)
        print(f"wrote {p} ({p.stat().st_size / 2**20:.1f} MiB)")
    else:
        write_random_model(a.out, a.shape, a.type, a.tokenizer, a.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
