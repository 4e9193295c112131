"""Keep the broker's freed megabyte buffers for the next request, in glibc's malloc.

A broker allocates a buffer of about a megabyte per request and per answer (a produce's records,
a follower's fetch read from the log) and frees it soon after. glibc hands such a buffer back to
the kernel when it is freed (above `M_MMAP_THRESHOLD`, or when the heap's free top passes
`M_TRIM_THRESHOLD`), so the next one is new memory: a page fault and a zeroed page for every 4
KiB of it. Its thresholds adapt to the sizes freed, but not enough: under acks=all produce a
lone broker faulted 133-153 pages per acknowledged MB and a 3-broker cluster 214-254 (up to 0.9
ms of CPU a MB), against 2-10 with fixed thresholds, which keep up to `KEPT_BYTES` of freed heap
for reuse. Set in a broker's own process only: an application embedding a broker keeps its own.
"""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# glibc's largest mmap threshold on 64-bit systems: buffers up to this come from the heap.
HEAP_BUFFERS_UP_TO = 32 * 1024 * 1024
KEPT_BYTES = 64 * 1024 * 1024


def keep_freed_buffers() -> bool:
    """Set glibc's thresholds; whether they were set (False with another C library)."""
    process = ctypes.CDLL(None)  # the C library the interpreter runs on, already loaded
    if not hasattr(process, "gnu_get_libc_version"):
        return False
    return bool(process.mallopt(M_MMAP_THRESHOLD, HEAP_BUFFERS_UP_TO)) and bool(
        process.mallopt(M_TRIM_THRESHOLD, KEPT_BYTES)
    )
