"""Which model load dies on a GPU build: localspec's `Model.load` (every layer on the CPU, and every layer on
the device) and llama.cpp reading the weights with and without localspec's huge-page callback. Each load runs
in a child; one line per load with its exit status (docs/bench/gpu.md#cuda-h100).

    python scripts/gpu/gpu_load_check.py TOKENIZER.gguf /tmp/tiny.gguf   # the random tiny model is written once
"""

import subprocess
import sys
from pathlib import Path

_READ = ("import llama_cpp\n{advisor}p = llama_cpp.llama_model_default_params()\np.n_gpu_layers = 0\n"
         "p.load_mode = llama_cpp.LLAMA_LOAD_MODE_NONE\n{callback}"
         "assert llama_cpp.llama_model_load_from_file(P.encode(), p)\n")
_MODEL = ("from localspec.backend import LoadOptions, Model\n"
          "Model.load(P, LoadOptions(n_ctx=256, n_gpu_layers={ngl})).close()\n")
LOADS = {
    "localspec Model.load, ngl 0": _MODEL.format(ngl=0),
    "localspec Model.load, ngl -1": _MODEL.format(ngl=-1),
    "llama.cpp read, no callback": _READ.format(advisor="", callback=""),
    "llama.cpp read + huge-page callback": _READ.format(
        advisor="from localspec.backend.memory import huge_page_advisor\na = huge_page_advisor()\n",
        callback="p.progress_callback = a\n"),
}


def main() -> int:
    tokenizer, model = sys.argv[1], Path(sys.argv[2])
    if not model.exists():
        from localspec.models import gguf_tools

        gguf_tools.write_random_model(model, "tiny", "q4_k", Path(tokenizer), log=lambda *a: None)
    for name, code in LOADS.items():
        r = subprocess.run([sys.executable, "-c", f"P = {str(model)!r}\n{code}"], capture_output=True, text=True,
                           timeout=120)
        last = (r.stderr.strip().splitlines() or [""])[-1][:200] if r.returncode else ""
        print(f"{name}: exit {r.returncode} {last}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
