"""Server benchmark: /infill latency with a cold vs warm prompt cache on a 200-line file, completion tokens/s
with and without speculation, and the same for structured output (a JSON schema: the grammar masks every
verified row). Two real servers (spec on, --no-spec) on free ports; requests are interleaved so machine noise
hits both alike; we report medians and ratios.

    python scripts/bench_server.py [--model PATH] [--fim] [--rounds 5] [--ctx 2048]

Without FIM tokens in the model's GGUF, pass --fim to serve a fixture copy that names FIM token ids.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import httpx

from localspec.server.testing import ServerProcess

FIM_IDS = {"tokenizer.ggml.fim_pre_token_id": 4, "tokenizer.ggml.fim_suf_token_id": 6,
           "tokenizer.ggml.fim_mid_token_id": 7, "tokenizer.ggml.fim_rep_token_id": 3,
           "tokenizer.ggml.fim_sep_token_id": 5}
PROMPTS = [  # editing-like prompts: prompt lookup pays when the output repeats the input
    "Rewrite this list with each item capitalised:\nred, green, blue, yellow, purple, orange, black, white\n",
    "def area(r):\n    return 3.14159 * r * r\n\ndef perimeter(r):\n",
    "Count from 1 to 30 separated by commas: 1, 2, 3,",
]


def source_file(tag: int) -> list[str]:
    return [f"    value_{i} = compute_{tag}(items[{i}], scale={i % 5})" for i in range(200)]


def infill(c: httpx.Client, lines: list[str], cursor: int) -> tuple[float, dict]:
    body = {"input_prefix": "\n".join(lines[:cursor]) + "\n", "input_suffix": "\n".join(lines[cursor + 1:]) + "\n",
            "prompt": "    value_", "n_predict": 16, "temperature": 0, "input_extra": []}
    t = time.perf_counter()
    r = c.post("/infill", json=body)
    r.raise_for_status()
    return (time.perf_counter() - t) * 1e3, r.json()


def bench_infill(url: str, rounds: int) -> dict:
    cold, warm, cached, evaluated = [], [], [], []
    with httpx.Client(base_url=url, timeout=300) as c:
        for i in range(rounds):
            lines = source_file(i)  # a file the cache has never seen
            ms, _ = infill(c, lines, 120)
            cold.append(ms)
            lines[118] = lines[118] + "  # edited"  # one-line edit two lines above the cursor
            ms, body = infill(c, lines, 120)
            warm.append(ms)
            cached.append(body["tokens_cached"])
            evaluated.append(body["timings"]["prompt_n"])
    return {"cold_ms": statistics.median(cold), "warm_ms": statistics.median(warm),
            "warm_tokens_cached": statistics.median(cached), "warm_prompt_n": statistics.median(evaluated)}


SCHEMA = {"type": "object", "required": ["items"], "additionalProperties": False,
          "properties": {"items": {"type": "array", "items": {"type": "string"}}}}
JSON_PROMPTS = [
    'List these colours as JSON {"items": [...]}: red, green, blue, yellow, purple, orange, black, white\n',
    'Return {"items": [...]} with the words of: the quick brown fox jumps over the lazy dog\n',
]


def completion(c: httpx.Client, prompt: str, n: int, **extra) -> dict:
    r = c.post("/completion", json={"prompt": prompt, "n_predict": n, "temperature": 0, **extra})
    r.raise_for_status()
    return r.json()


def bench_tps(spec_url: str, plain_url: str, rounds: int, n: int, prompts: list[str] = PROMPTS, **extra) -> dict:
    tps: dict[str, list[float]] = {"spec": [], "plain": []}
    acc = [0, 0]
    with httpx.Client(base_url=spec_url, timeout=300) as s, httpx.Client(base_url=plain_url, timeout=300) as p:
        for _ in range(rounds):
            for prompt in prompts:
                for name, c in (("spec", s), ("plain", p)):  # interleaved
                    b = completion(c, prompt, n, **extra)
                    tps[name].append(b["timings"]["predicted_per_second"])
                    if name == "spec":
                        acc[0] += b["timings"].get("draft_n", 0)
                        acc[1] += b["timings"].get("draft_n_accepted", 0)
    med = {k: statistics.median(v) for k, v in tps.items()}
    return {"spec_tok_s": med["spec"], "plain_tok_s": med["plain"], "speedup": med["spec"] / med["plain"],
            "draft_n": acc[0], "draft_n_accepted": acc[1], "acceptance_rate": acc[1] / acc[0] if acc[0] else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="target GGUF (default: the embedded SmolLM2-135M)")
    ap.add_argument("--fim", action="store_true", help="serve a copy of the model with FIM ids in its metadata")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--ctx", type=int, default=2048)
    a = ap.parse_args()
    model = a.model
    if a.fim:
        from localspec.models.gguf_tools import write_with_metadata
        from localspec.models.paths import cache_dir
        from localspec.models.resolve import resolve_model

        src = model or str(resolve_model(None, log=lambda *x: None).path)
        out = cache_dir() / "fixtures" / "SmolLM2-135M-Instruct.fim.Q4_1.gguf"
        if not out.exists():
            write_with_metadata(src, out, FIM_IDS)
        model = str(out)
    base = (["--model", model] if model else []) + ["--ctx", str(a.ctx)]
    with ServerProcess(base) as spec, ServerProcess(base + ["--no-spec"]) as plain:
        result = {"infill": bench_infill(spec.url, a.rounds),
                  "completion": bench_tps(spec.url, plain.url, a.rounds, a.tokens),
                  "json_schema": bench_tps(spec.url, plain.url, a.rounds, a.tokens, JSON_PROMPTS,
                                           json_schema=SCHEMA)}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
