"""Training workers keep the host memory a step frees, for the next step.

glibc serves an allocation above its mmap threshold (adaptive: 128 KiB, rising up to 32 MiB
as large blocks are freed) with a fresh ``mmap`` that ``free`` unmaps, and gives free memory
at a heap's top back to the kernel. A training step allocates and frees the same activations
and gradients (hundreds of MB) every micro batch, so every step faulted them in again page by
page, each page zeroed by the kernel (and, in a VM, often supplied by the host again).

``MALLOC_ENV`` is glibc's own tuning through the environment, read when a process starts
(``mallopt`` from Python comes too late: the same values set at run time left most of the
faults). ``WorkerGroup`` starts every rank with it (Ray ``runtime_env``). Measured on
SmolLM2, one shared micro batch of ~600 tokens, forward + backward + fused AdamW on 2
threads, this VM: ~200k minor page faults per step with glibc's defaults, ~28k with these
(what is left is the tied embedding's 113 MB gradient, above any mmap threshold glibc
accepts). Forward + backward, median of 9 steps in two alternating rounds: 2.04 and 2.12 s
with glibc's defaults, 2.03 and 1.94 s with these. The process keeps its high-water mark between steps; it
reaches it again every step anyway.

No mmap at all (``MALLOC_MMAP_MAX_=0``) serves those blocks from the heap as well: from
step 3 of the bench-trl work a rank faults almost nothing (0-10 pages per step instead of
~28k), and its train phase, steps 2-5, took 2.12/2.14 s against 2.22/2.25 s without it (two
alternating rounds), for ~150 MB more resident memory (4.1 vs 4.0 GB). Transparent huge
pages for malloc (``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``) were tried and dropped: a 2 MiB
page costs ~3 ms per fault on this VM, so a step that faults the 113 MB gradient's 55 huge
pages anew ran 0.15-0.18 s slower than one that does not.
"""

from __future__ import annotations

MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(16 << 30),
    "MALLOC_TOP_PAD_": str(512 << 20),
    "MALLOC_MMAP_MAX_": "0",
}
"""glibc malloc tunables: mmap only above 32 MiB (glibc's largest threshold on 64-bit) and in
fact never (``MALLOC_MMAP_MAX_=0``: even the largest blocks come from the heap, so they are
reused too), give a heap's free top back only beyond 16 GiB, grow and shrink heaps with
512 MiB of slack."""
