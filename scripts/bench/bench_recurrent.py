"""Speculation on recurrent and hybrid models: plain against speculative tok/s, the rollback's costs, and what the
adaptive controller chose, on the random-weight Mamba, LFM2 and Granite-hybrid files the tests write.

Two sizes of each: the tests' own files (n_embd 32, ~5 MB: the Python loop's share shows) and a wider copy
(n_embd 256, FFN 1024, d_inner 512: llama.cpp's kernels' share shows). Per model it runs, as fresh
`localspec run --json` processes, interleaved over `--repeats`:
- plain (`--no-spec`);
- the model as its own drafter, every draft accepted (k = 4 pinned, and the adaptive default);
- its Q8_0 copy as the drafter (cheaper, nearly always right; k = 4 pinned, and the adaptive default);
- prompt lookup on open prose, where its drafts are mostly rejected (k = 4 pinned, and the adaptive default);
- prompt lookup on a text that repeats, where its drafts are mostly accepted (adaptive).
It prints one Markdown table (median tok/s, speedup over plain, acceptance, what the rewinds cost, the k chosen)
and the save/restore times `models show` reports for each rollback method.

    python scripts/bench/bench_recurrent.py --repeats 3 --markdown /tmp/recurrent.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import tiny_gguf  # noqa: E402  (the tests' writer of these files)

from localspec.backend.quantize import quantize  # noqa: E402
from localspec.models.paths import cache_dir  # noqa: E402
from localspec.models.resolve import resolve_model  # noqa: E402

WIDE = {"N_EMBD": 256, "N_FF": 1024, "N_HEAD": 8, "N_HEAD_KV": 4, "HEAD_DIM": 32, "D_INNER": 512, "DT_RANK": 8}
PROSE = ("Write a long essay about the history of bridges, the materials engineers used in each century, and "
         "what each failure taught them.")
REPEATS_TEXT = ("The quick brown fox jumps over the lazy dog while the farmer counts his sheep. " * 8).strip()


def write_models(size: str) -> dict[str, Path]:
    """The three architectures at `size` ("tiny": the tests' files; "wide": WIDE), written once into the cache."""
    source = resolve_model(None, log=lambda *a: None).path
    saved = {k: getattr(tiny_gguf, k) for k in WIDE}
    out = {}
    try:
        if size == "wide":
            for k, v in WIDE.items():
                setattr(tiny_gguf, k, v)
        for arch in tiny_gguf.ARCHS:
            name = tiny_gguf.file_name(arch) if size == "tiny" else f"wide-{arch}-v{tiny_gguf.VERSION}.gguf"
            path = cache_dir() / "fixtures" / name
            if not path.exists():
                tiny_gguf.write_tiny(arch, source, path)
            out[arch] = path
    finally:
        for k, v in saved.items():
            setattr(tiny_gguf, k, v)
    return out


CONFIGS = {  # name -> (extra arguments, prompt)
    "plain": (["--no-spec"], PROSE),
    "itself k=4": (["--draft", "{model}", "-k", "4", "--no-adaptive"], PROSE),
    "itself auto": (["--draft", "{model}"], PROSE),
    "Q8_0 copy k=4": (["--draft", "{copy}", "-k", "4", "--no-adaptive"], PROSE),
    "Q8_0 copy auto": (["--draft", "{copy}"], PROSE),
    "lookup prose k=4": (["--lookup", "-k", "4", "--no-adaptive"], PROSE),
    "lookup prose auto": (["--lookup"], PROSE),
    "lookup repeats auto": (["--lookup"], REPEATS_TEXT),
}


def run_once(model: Path, config: str, n: int) -> dict:
    extra, prompt = CONFIGS[config]
    copy = model.with_name(model.stem + ".Q8_0.gguf")
    if "{copy}" in extra and not copy.exists():
        quantize(model, copy, "Q8_0")
    args = [a.replace("{model}", str(model)).replace("{copy}", str(copy)) for a in extra]
    cmd = [sys.executable, "-m", "localspec", "run", "--model", str(model), "--temp", "0", "-n", str(n),
           "--ctx", "2048", "--json", *args, prompt]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def rollback_costs(model: Path) -> dict:
    cmd = [sys.executable, "-m", "localspec", "models", "show", str(model), "--json"]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)["memory"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("-n", type=int, default=128, help="tokens per answer")
    ap.add_argument("--sizes", default="tiny,wide")
    ap.add_argument("--markdown", type=Path)
    a = ap.parse_args()
    lines = ["| model | config | tok/s (median) | × plain | accepted | target rewinds: saved / restored / "
             "replayed | k chosen |", "|---|---|---|---|---|---|---|"]
    costs_lines = ["| model | kind | method chosen | llama.cpp snapshots | save + restore (ms), per method |",
                   "|---|---|---|---|---|"]
    for size in a.sizes.split(","):
        for arch, path in write_models(size).items():
            label = f"{size} {arch}"
            mem = rollback_costs(path)
            times = ", ".join(f"{m} {s:.3f} + {r:.3f}" for m, (s, r) in mem["timings_ms"].items())
            costs_lines.append(f"| {label} | {mem['kind']} | {mem['rollback']} | {mem['rs_depth']} | {times} |")
            runs: dict[str, list[dict]] = {c: [] for c in CONFIGS}
            for _ in range(a.repeats):  # interleaved: a drift in the machine's speed hits every config alike
                for config in CONFIGS:
                    runs[config].append(run_once(path, config, a.n))
            plain = statistics.median(r["tokens_per_second"] for r in runs["plain"])
            for config, rs in runs.items():
                tps = statistics.median(r["tokens_per_second"] for r in rs)
                last = rs[-1]
                t = last["memory"]["target"]
                acc = f"{last['draft_n_accepted']}/{last['draft_n']}" if last["draft_n"] else "-"
                ks = ", ".join(f"{k}:{v}" for k, v in sorted(last["k_chosen"].items(), key=lambda x: int(x[0])))
                lines.append(f"| {label} | {config} | {tps:.0f} | {tps / plain:.2f} | {acc} | "
                             f"{t['saves']} / {t['restores']} / {t['replayed']} | {ks or '-'} |")
                print(lines[-1], flush=True)
    text = "\n".join(costs_lines + [""] + lines) + "\n"
    print(text)
    if a.markdown:
        a.markdown.write_text(text)


if __name__ == "__main__":
    main()
