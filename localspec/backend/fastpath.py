"""Which of llama.cpp's optional CPU fast paths a model may load with here, proved by a trial in a child.

llama.cpp puts CPU weights in "extra buffer types" when it can (`llama_model_params.use_extra_bufts`, its
`--repack`): AMX tiles on Intel Xeons, CPU_REPACK (weights interleaved for AVX2/NEON GEMMs), KleidiAI on ARM.
They are chosen at load and first run at the first batch. Where one is broken for this CPU or for a tensor's
shape, the process dies (llama.cpp's AMX kernels on Sapphire Rapids and later: SIGILL or SIGSEGV on the first
prompt), which no Python code can catch, or it quietly computes other logits (the same AMX code on a 3-D F16
weight, as RWKV-6's time_mix_w2), which would make speculation's "lossless" mean nothing. So before a model's
first load on a machine and build, a child process runs a short decode in a mode at the engine's thread counts
while this process runs it on the reference path (no extra buffer type: plain llama.cpp, which a process can
trust), beside its own load of the model (fastpath_trial.py). A mode is used only when its next-token
distributions stay within TOLERANCE of the reference's and the same decode gives the same logits again; a death
by signal, an abort, a time-out or a mismatch sends the parent to the next mode:

  all     llama.cpp's default: every extra buffer type
  repack  CPU_REPACK only (AMX and the rest left out), through `tensor_buft_overrides` for the tensors it takes
  none    no extra buffer type (llama.cpp's --no-repack)

The verdict is cached beside the calibrations, per model layout (architecture, every tensor's name, type and
shape: two files of one model share it), CPU, cores and llama.cpp build, so a warm start reads one small file
(fastpath_cache.py, verdicts.py).
What the trial costs: docs/bench/fastpath.md#what-the-trial-costs.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import llama_cpp

from ..errors import LocalspecError
from ..models.gguf_header import read_header
from .fastpath_cache import cache_key
from .ggml import extra_buffer_types, supports_gpu_offload, system_info
from .machine import cpu_count
from .verdicts import read_verdict, write_verdict

ALL, REPACK, NONE = "all", "repack", "none"
MODES = (ALL, REPACK, NONE)
TOLERANCE = 0.25  # the largest total variation from the reference's next-token distributions (fastpath_trial)
REPEAT_TOLERANCE = 1e-3  # the largest logit difference between two runs, in standard deviations of its row
TIMEOUT_ENV = "LOCALSPEC_PROBE_TIMEOUT"  # seconds a trial may take (default: by file size)
_EMBEDDINGS = re.compile(r"(^|\.)(token_embd|per_layer_token_embd|tok_embeddings|embed)")  # rows read, not multiplied


@dataclass(frozen=True)
class FastPath:
    """How a model's CPU weights are placed, and why."""

    mode: str = ALL
    source: str = "default"  # "default" (nothing to test), "probe" (tested this start), "cache", "option"
    failures: tuple[tuple[str, str], ...] = ()  # (mode, how its trial failed: died, hung or mismatched), in order
    extras: tuple[str, ...] = ()  # this build's extra buffer types (llama.cpp's order)
    seconds: float = 0.0  # spent on trials this start
    repacked: tuple[str, ...] = field(default=(), repr=False)  # tensors overridden to CPU_REPACK (mode repack)
    distance: float | None = None  # the kept mode's largest distance from the reference (fastpath_trial.distance)

    def notice(self) -> str | None:
        """One line for the user when a faster mode was switched off for this model, else None."""
        if not self.failures:
            return None
        failed = ", ".join(f"{_label(m, self.extras)}: {how}" for m, how in self.failures)
        kept = {REPACK: "with CPU_REPACK alone", NONE: "without extra buffer types"}.get(self.mode, "")
        return (f"llama.cpp's CPU fast paths failed their trial on this model ({failed}); loading {kept} "
                "(--repack forces them all on)")

    def describe(self) -> str:
        """For `models show` and `bench`: the mode, the buffer types it uses and how it was chosen."""
        used = {ALL: ", ".join(self.extras) or "none in this build", REPACK: "CPU_REPACK", NONE: "none"}[self.mode]
        how = {"probe": "tested now", "cache": "tested earlier", "option": "as asked",
               "default": "nothing to test"}[self.source]
        if self.distance is not None and self.mode != NONE:
            how += f", {self.distance:.2g} from the reference's distribution"
        return f"{self.mode} ({used}; {how})" + (f"; {self.notice()}" if self.failures else "")

    def to_dict(self) -> dict:
        return {"mode": self.mode, "source": self.source, "failures": [list(d) for d in self.failures],
                "extras": list(self.extras), "seconds": round(self.seconds, 3), "repacked": len(self.repacked),
                "distance": self.distance, "tolerance": TOLERANCE}


def _label(mode: str, extras: Sequence[str]) -> str:
    return {ALL: f"with {' and '.join(extras) or 'every extra buffer type'}", REPACK: "with CPU_REPACK alone"}[mode]


# -- which tensors CPU_REPACK takes -----------------------------------------------------------------------------

def _features() -> set[str]:
    """CPU features this build compiled in, from llama.cpp's system info ("AVX2 = 1 | NEON = 1 | ...")."""
    return {k.strip() for k, v in re.findall(r"(\w+) = (\d)", system_info()) if v == "1"}


def repacks(type_name: str, ne1: int, f: set[str]) -> bool:
    """ggml-cpu/repack.cpp's ggml_repack_get_optimal_repack_type for x86 and ARM: does CPU_REPACK have a
    layout for this weight type and row count? (A tensor overridden to CPU_REPACK without one aborts the load,
    which the trial of mode `repack` would catch.)"""
    mmla, dot = "NEON" in f and "MATMUL_INT8" in f, "NEON" in f and "DOTPROD" in f
    rules = {"Q4_0": ("AVX2" in f and ne1 % 8 == 0) or ((mmla or dot) and ne1 % 4 == 0),
             "Q4_K": ("AVX2" in f or mmla or dot) and ne1 % 8 == 0,
             "Q2_K": "AVX512" in f and ne1 % 8 == 0,
             "Q5_K": (mmla or dot) and ne1 % 8 == 0, "Q6_K": (mmla or dot) and ne1 % 8 == 0,
             "IQ4_NL": ("AVX2" in f and ne1 % 8 == 0) or (dot and ne1 % 4 == 0),
             "MXFP4": ("AVX2" in f and ne1 % 8 == 0) or (dot and ne1 % 4 == 0),
             "Q8_0": (mmla or dot) and ne1 % 4 == 0}
    return bool(rules.get(type_name, False))


def repack_tensors(path: str | Path) -> list[str]:
    """The 2-D matrix weights CPU_REPACK would take on this CPU (embeddings are read by row, not multiplied)."""
    import gguf

    f = _features()
    out = []
    for name, dims, t in read_header(path, tokens=False).tensors:
        try:
            type_name = gguf.GGMLQuantizationType(t).name
        except ValueError:
            continue
        if len(dims) == 2 and name.endswith(".weight") and not _EMBEDDINGS.search(name) \
                and repacks(type_name, dims[1], f):
            out.append(name)
    return out


class _Override(ctypes.Structure):
    """struct llama_model_tensor_buft_override {const char * pattern; ggml_backend_buffer_type_t buft;}"""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def tensor_patterns(names: Sequence[str]) -> list[str]:
    """One regex per tensor role ("blk.N.ffn_up.weight" for the layers listed): llama.cpp compiles every
    pattern for every tensor it loads, so a few patterns rather than one per tensor."""
    roles: dict[str, list[str]] = {}
    for n in names:
        m = re.fullmatch(r"blk\.(\d+)\.(.+)", n)
        role, layer = (m.group(2), m.group(1)) if m else (n, "")
        roles.setdefault(role, []).append(layer)
    out = []
    for role, layers in roles.items():
        r = re.escape(role)
        out.append(f"^blk\\.({'|'.join(layers)})\\.{r}$" if layers != [""] else f"^{r}$")
    return out


def apply(mparams: llama_cpp.llama_model_params, plan: FastPath) -> object:
    """Set the load parameters for `plan`; returns what the C side points into (keep it alive with the model)."""
    mparams.use_extra_bufts = plan.mode == ALL
    # the field is a c_void_p in llama_cpp's _fields_ though its annotation says an array: None is NULL
    mparams.tensor_buft_overrides = None  # type: ignore[assignment]
    if plan.mode != REPACK or not plan.repacked:
        return None
    buft = extra_buffer_types().get("CPU_REPACK")
    pats = [p.encode() for p in tensor_patterns(plan.repacked)]
    arr = (_Override * (len(pats) + 1))(*[_Override(p, buft) for p in pats], _Override(None, None))
    mparams.tensor_buft_overrides = ctypes.cast(arr, ctypes.c_void_p)  # type: ignore[assignment]  # as above
    return arr, pats


# -- the verdict: trials in a child, cached ----------------------------------------------------------------------

def thread_counts(n_threads: int | None) -> list[int]:
    """The counts a trial decodes at: one thread, two (OpenMP workers), and all the engine may use."""
    n = n_threads or cpu_count()
    return sorted({1, min(2, n), n})


def _timeout(path: Path) -> float:
    """Seconds a trial may take: one load of the model and a short decode at each thread count, and once more."""
    env = os.environ.get(TIMEOUT_ENV)
    return float(env) if env else 30.0 + 30.0 * path.stat().st_size / 1e9


def _died(rc: int) -> str:
    try:
        return signal.Signals(-rc).name if rc < 0 else f"exit {rc}"
    except ValueError:
        return f"signal {-rc}"


MISMATCH_EXIT = 4  # the trial's exit status when the mode's repeated decode gave other logits


def _reference(path: Path, verbose: bool) -> list:
    """The reference path's short decode, run here (fastpath_trial.reference: it needs the model, which
    imports this module, so it is imported when first called)."""
    from .fastpath_trial import reference

    return reference(str(path), verbose)


class Trial:
    """A trial in a child process, running while the caller does other work (its own load of the model)."""

    def __init__(self, path: Path, mode: str, counts: Sequence[int], timeout: float) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # this process's localspec
        self.mode, self.timeout, self.t0 = mode, timeout, time.perf_counter()
        self.distance: float | None = None  # its largest distance from the reference, when it ran to the end
        fd, out = tempfile.mkstemp(prefix="localspec-trial-", suffix=".npz")  # where the child writes its logits
        os.close(fd)
        self.out = Path(out)
        self.proc = subprocess.Popen([sys.executable, "-m", "localspec.backend.fastpath_trial", str(path), mode,
                                      ",".join(map(str, counts)), out],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=env)

    def verdict(self, reference: Sequence) -> str | None:
        """None if its logits matched `reference` (the reference path's short decode), else how it failed
        ("SIGILL", "timed out after 30 s", "next-token distributions 0.93 from the reference's ...", "exit 1:
        <its last line>")."""
        from .fastpath_trial import compare  # as _reference

        try:
            _, err = self.proc.communicate(timeout=max(0.0, self.t0 + self.timeout - time.perf_counter()))
        except subprocess.TimeoutExpired:
            self.stop()
            return f"timed out after {self.timeout:.0f} s"
        rc = self.proc.returncode
        last = (err.decode("utf-8", "replace").strip().splitlines() or [""])[-1][:100]
        try:
            if rc == 0:
                self.distance, how = compare(reference, str(self.out))
                return how
        except (OSError, ValueError, EOFError) as e:  # exit 0 without its logits: not a trial that passed
            return f"exit 0 without its logits ({e})"
        finally:
            self.out.unlink(missing_ok=True)
        return last if rc == MISMATCH_EXIT else _died(rc) + (f": {last}" if rc > 0 and last else "")

    def stop(self) -> None:
        """Kill the child if it still runs, and remove its logits' file."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
        self.out.unlink(missing_ok=True)


@dataclass
class Choice:
    """What `begin` decided, or the first mode to load while its trial runs (`finish` says whether it held)."""

    guess: FastPath
    path: Path | None = None
    key: dict | None = None
    counts: Sequence[int] = ()
    trial: Trial | None = None
    verbose: bool = False  # llama.cpp's log, for the reference load in this process

    def cancel(self) -> None:
        """Stop a trial still running (the caller's own load failed)."""
        if self.trial is not None:
            self.trial.stop()

    def finish(self) -> FastPath:
        """The verdict: `guess` if it needed no trial or passed it, else the next mode that does (tried now,
        one after another), cached. The reference decode runs here while the first trial's child runs."""
        if self.trial is None or self.path is None or self.key is None:
            return self.guess
        try:
            reference = _reference(self.path, self.verbose)
        except LocalspecError:  # the file loads in no mode: the real load says why, and nothing is cached
            self.cancel()
            return self.guess
        except BaseException:
            self.cancel()
            raise
        failures: list[tuple[str, str]] = []
        chosen, trial, distance = NONE, self.trial, None
        for m in _candidates(self.path, self.guess.extras):
            t = trial if m == trial.mode else Trial(self.path, m, self.counts, _timeout(self.path))
            how = t.verdict(reference)
            if how is None:
                chosen, distance = m, t.distance
                break
            failures.append((m, how))
        plan = FastPath(chosen, "probe", tuple(failures), self.guess.extras, time.perf_counter() - trial.t0,
                        _repacked(self.path, chosen), distance)
        write_verdict("fastpath", self.key, {"mode": plan.mode, "failures": [list(f) for f in plan.failures],
                                 "distance": plan.distance, "tolerance": TOLERANCE, "seconds": round(plan.seconds, 3)})
        return plan


def begin(path: Path, *, mode: str | None = None, n_threads: int | None = None, n_gpu_layers: int = 0,
          verbose: bool = False) -> Choice:
    """The placement to load `path` with: `mode` when the user chose one, else the cached verdict, else mode
    `all` with its trial started (call `finish`: all, then repack, then none, the first that passes)."""
    extras = tuple(extra_buffer_types())
    if mode is not None:
        return Choice(FastPath(mode, "option", extras=extras, repacked=_repacked(path, mode)))
    if not extras or (n_gpu_layers < 0 and supports_gpu_offload()):
        return Choice(FastPath(ALL, "default", extras=extras))  # nothing optional on the CPU to test
    counts = thread_counts(n_threads)
    key = cache_key(path, counts)
    cached = read_verdict("fastpath", key)
    if cached is not None and cached.get("mode") in MODES:
        m = cached["mode"]
        return Choice(FastPath(m, "cache", tuple(tuple(f) for f in cached.get("failures", ())), extras,
                               repacked=_repacked(path, m), distance=cached.get("distance")))
    return Choice(FastPath(ALL, "probe", extras=extras), path, key, counts, Trial(path, ALL, counts, _timeout(path)),
                  verbose)


def choose(path: Path, **kw) -> FastPath:
    """`begin` and `finish` in one call, for a caller with nothing to do meanwhile (`models show`)."""
    return begin(path, **kw).finish()


def _candidates(path: Path, extras: Sequence[str]) -> list[str]:
    """Modes to try, fastest first; `none` is the reference and the floor, never tried (it is plain llama.cpp)."""
    return [ALL] + ([REPACK] if "CPU_REPACK" in extras and repack_tensors(path) else [])


def _repacked(path: Path, mode: str) -> tuple[str, ...]:
    return tuple(repack_tensors(path)) if mode == REPACK else ()
