"""steady_allocator(): the same heap policy in every replicate, whatever the order it measures in.

glibc serves a large allocation with its own mmap, page-faulted on first touch and unmapped on
free, until a free of that size raises the "mmap threshold" (dynamically, up to 32 MiB), after which
the same size comes from the heap, already touched. So the cost of a call that allocates megabytes
depends on what the process allocated before: the naive verify-mask build at batch 8 and 32k
context measured 11.4 ms in a replicate that swept the contexts upwards (every new size mmapped and
faulted) and 4.8 ms in one that swept them downwards (the largest size first, the rest from the
heap), so three replicates of one probe spanned a 2.4x range and its interval [5.43, 346].

`steady_allocator()` fixes the threshold (which also stops glibc from moving it) and the heap's trim
threshold, so that every size up to `mmap_threshold` comes from a heap that is not handed back to
the system between calls: the steady state of a long-running server that has seen its largest
batch, the same in every replicate and for every sweep order. Call it first in a probe, before
the allocations it measures. Not glibc (macOS, musl): nothing is changed, and it says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["steady_allocator"]

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20  # glibc's own ceiling for the dynamic threshold on 64-bit systems
TRIM_THRESHOLD = 512 * 2**20


def steady_allocator(mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD) -> str:
    """Fix glibc's mmap and trim thresholds for this process; what was set, in words."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        gnu = libc.gnu_get_libc_version
    except (OSError, AttributeError, TypeError):
        return "not glibc: the allocator's policy is left as it is"
    gnu.restype = ctypes.c_char_p
    if not (mallopt(_M_MMAP_THRESHOLD, int(mmap_threshold)) and mallopt(_M_TRIM_THRESHOLD, int(trim_threshold))):
        return "glibc refused the thresholds: the allocator's policy is left as it is"
    return (
        f"glibc {gnu().decode()}: allocations up to {mmap_threshold / 2**20:g} MiB from the heap, "
        f"trimmed beyond {trim_threshold / 2**20:g} MiB"
    )
