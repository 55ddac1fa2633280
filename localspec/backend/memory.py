"""Where a model's weights live: llama.cpp's map of the file, or read into memory that huge pages back.

Why it matters: decoding one token streams every weight of a small model through the CPU once, and with 4 KiB
pages that is one TLB entry per 4 KiB (23 000 pages for SmolLM2-135M's 92 MiB, more than the CPU's TLB holds),
so every token pays a page walk per page. Transparent huge pages (2 MiB) cut that 512-fold. A file mapping gets
no huge pages (the page cache is 4 KiB); memory llama.cpp allocates and reads the file into can, when the
kernel's transparent huge pages are `madvise` or `always` (most distributions: `madvise`).

It gains a few per cent a token on both shipped models; reading instead of mapping costs load time (the file is
read, and on a VM each fresh 2 MiB page may fault in slowly): docs/bench/threads.md#huge-pages.

So where the weights run on the CPU, the kernel offers huge pages and the file is small next to the memory
available (a quarter, so a page-cache copy and the model fit twice over), localspec asks llama.cpp to read
(LLAMA_LOAD_MODE_NONE) and marks the buffers llama.cpp allocated MADV_HUGEPAGE before they are filled: llama.cpp
calls the load-progress callback before reading its first tensor, after allocating the buffers. Elsewhere, or
with `--mmap`, llama.cpp's own choice stands. Linux only; nothing here changes what the model computes.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path
from typing import Callable

MADV_HUGEPAGE = 14  # <asm-generic/mman-common.h>
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
MEMINFO = Path("/proc/meminfo")
MAPS = Path("/proc/self/maps")
MIN_REGION = 4 << 20  # llama.cpp's weight buffers; smaller new mappings are not worth a call
SHARE_OF_AVAILABLE = 0.25


def huge_pages_offered() -> bool:
    """Whether the kernel backs madvised anonymous memory with transparent huge pages."""
    try:
        mode = THP_ENABLED.read_text()
    except OSError:
        return False
    return "[always]" in mode or "[madvise]" in mode


def _kib_field(path: Path, name: str) -> int | None:
    """Bytes of a `Name:   N kB` line of a /proc file (meminfo, smaps_rollup), None without it."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def available_bytes() -> int | None:
    return _kib_field(MEMINFO, "MemAvailable")


def read_into_huge_pages(file_bytes: int, on_cpu: bool, mmap: bool | None, *, offered: bool | None = None,
                         available: int | None = -1) -> bool:
    """The one decision: read the weights into huge-page memory (True) or leave llama.cpp's load mode (False).
    `mmap`: the user's choice (True: map, False: read even when large), None: decide. `offered` and `available`
    default to this machine's (tests pass them)."""
    if mmap is not None:
        return not mmap
    if not on_cpu or not sys.platform.startswith("linux"):
        return False
    offered = huge_pages_offered() if offered is None else offered
    available = available_bytes() if available == -1 else available
    return offered and available is not None and file_bytes <= SHARE_OF_AVAILABLE * available


def _anonymous_regions() -> dict[int, int]:
    """start -> end of this process's private anonymous read-write mappings."""
    out: dict[int, int] = {}
    try:
        lines = MAPS.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        f = line.split()
        if len(f) == 5 and f[1].startswith("rw") and f[1].endswith("p"):  # no path: anonymous
            start, end = (int(x, 16) for x in f[0].split("-"))
            out[start] = end
    return out


def huge_page_advisor() -> Callable[[float, ctypes.c_void_p], bool] | None:
    """A load-progress callback (llama_model_params.progress_callback) that, on its first call, marks every
    anonymous mapping made since this function was called MADV_HUGEPAGE; None off Linux. Keep the returned
    object alive for the whole load (llama.cpp holds a raw pointer to it)."""
    if not sys.platform.startswith("linux"):
        return None
    import llama_cpp

    before = _anonymous_regions()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes, libc.madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    done = [False]

    @llama_cpp.llama_progress_callback
    def advise(progress: float, user_data: ctypes.c_void_p) -> bool:
        if not done[0]:
            done[0] = True
            for start, end in _anonymous_regions().items():
                if before.get(start) != end and end - start >= MIN_REGION:
                    libc.madvise(start, end - start, MADV_HUGEPAGE)  # a refusal leaves 4 KiB pages: no harm
        return True

    return advise


def huge_page_bytes() -> int:
    """Anonymous memory of this process that huge pages back now (tests read it)."""
    return _kib_field(Path("/proc/self/smaps_rollup"), "AnonHugePages") or 0
