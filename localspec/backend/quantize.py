"""llama.cpp's own quantizer (llama_model_quantize): a low-bit copy of a GGUF, for a drafter made from its target.

The copy keeps the target's tensors and tokenizer, so it drafts with the target's vocabulary and agrees with it
far more often than a smaller model would; at 4 bits it reads about a quarter of an F16 file's bytes per step.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelLoadError

FTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7}  # llama_ftype values (LLAMA_FTYPE_MOSTLY_*)


def quantize(source: str | Path, out: str | Path, quant: str = "Q4_0", *, threads: int = 0) -> Path:
    """Write `source` quantized to `quant` at `out` (through a .part file, so a killed run leaves no half file)."""
    import llama_cpp

    if quant not in FTYPES:
        raise ModelLoadError(f"cannot make a {quant} copy; choose one of {', '.join(FTYPES)}")
    src, dst = Path(source), Path(out)
    part = dst.with_name(dst.name + ".part")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[quant]
    params.nthread = threads
    params.allow_requantize = True  # a Q4_1 or Q8_0 source may be requantized too
    dst.parent.mkdir(parents=True, exist_ok=True)
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(part).encode(), params)
    if rc != 0 or not part.is_file():
        part.unlink(missing_ok=True)
        raise ModelLoadError(f"llama.cpp could not quantize {src.name} to {quant} (status {rc})")
    part.replace(dst)
    return dst
