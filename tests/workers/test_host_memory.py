"""The workers' malloc tuning keeps freed memory: a step's allocations, freed and made again,
fault far fewer fresh pages in than with glibc's defaults (``skyrl.workers.host_memory``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from skyrl.workers.host_memory import MALLOC_ENV, _tunables

# Tensors of 1-30 MiB (under the 32 MiB threshold) made and freed like a step's activations;
# prints the minor page faults of round 1 (which grows the heap), then of rounds 2-6.
PROBE = """
import resource, torch
sizes_mib = [1, 3, 5, 9, 17, 30, 12, 6]
def step():
    tensors = [torch.ones(mib << 18) for mib in sizes_mib]  # fp32: 4 bytes each
    del tensors
start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print(before - start, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(extra_env: dict[str, str]) -> tuple[int, int]:
    """Faults of the probe's first round and of its next five."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"
    }
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=env | extra_env,
        capture_output=True,
        text=True,
        check=True,
    )
    first, rest = out.stdout.split()[-2:]
    return int(first), int(rest)


def test_tuned_malloc_faults_far_fewer_pages_in():
    default, tuned = _faults({})[1], _faults(MALLOC_ENV)[1]
    # 5 rounds x 83 MiB = 415 MiB made again; measured here: ~41k faults (4 KiB pages, about
    # half of it) with the defaults, ~7.7k with the tuning (one 30 MiB block each round).
    assert default > 20_000
    assert tuned < default / 3


def test_tunables_keep_the_users_own():
    assert _tunables(None) == "glibc.malloc.hugetlb=1"
    assert _tunables("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0") == (
        "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    )


def test_heap_growth_takes_huge_pages_where_the_kernel_gives_them():
    """Round 1 grows the heap by ~83 MiB: ~21k faults of 4 KiB pages, or ~42 of 2 MiB ones
    when malloc may ask for transparent huge pages (kernel THP mode ``madvise`` or
    ``always``; with ``never`` the tunable can change nothing)."""
    small_pages = {k: v for k, v in MALLOC_ENV.items() if k != "GLIBC_TUNABLES"}
    without, with_huge = _faults(small_pages)[0], _faults(MALLOC_ENV)[0]
    assert without > 15_000
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if thp.exists() and "[never]" not in thp.read_text():
        assert with_huge < without / 4
    else:
        assert with_huge > without / 2
