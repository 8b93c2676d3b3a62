"""The workers' malloc tuning keeps freed memory: a step's allocations, freed and made again,
fault far fewer fresh pages in than with glibc's defaults (``skyrl.workers.host_memory``)."""

from __future__ import annotations

import os
import subprocess
import sys

from skyrl.workers.host_memory import MALLOC_ENV

# A step's activations (1-30 MiB, under glibc's largest mmap threshold of 32 MiB) and
# SmolLM2's 113 MiB tied-embedding gradient (above it), made and freed ROUNDS times after a
# first round that grows the heap; prints the minor page faults of those rounds.
ROUNDS = 12
PROBE = f"""
import resource, torch
sizes_mib = [1, 3, 5, 9, 17, 30, 12, 6, 113]
def step():
    tensors = [torch.ones(mib << 18) for mib in sizes_mib]  # fp32: 4 bytes each
    del tensors
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range({ROUNDS}):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _last_word(script: str, extra_env: dict[str, str]) -> str:
    """The last word ``script`` prints, run with glibc's malloc settings ``extra_env`` only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=env | extra_env,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()[-1] if out.stdout.strip() else ""


def _faults(extra_env: dict[str, str]) -> int:
    return int(_last_word(PROBE, extra_env))


def test_tuned_malloc_faults_far_fewer_pages_in():
    # With glibc's defaults the 113 MiB block is mapped on its own, so every round faults its
    # 113 << 8 = 28,928 pages in anew: 12 x 28,928 = 347,136 at least (measured: 370-391k in 4 runs).
    default = _faults({})
    assert default >= ROUNDS * (113 << 8)
    # Tuned, every block comes from the heap and is reused; the heap still grows now and then
    # (small allocations between the big ones move a block to fresh pages: 29.7k-73.2k faults
    # over the 12 rounds in 12 runs on the AMD EPYC, most runs repeating one of four patterns).
    # The fewest of three runs against a quarter of the default's count.
    tuned = min(_faults(MALLOC_ENV) for _ in range(3))
    assert tuned < default / 4


# Where a 113 MiB tensor (SmolLM2's tied-embedding gradient) lives once the heap's free top
# is too small for it: inside the ``[heap]`` mapping (reused when freed) or in a mapping of its
# own (unmapped at free, faulted in anew). 30 MiB blocks (a step's live activations) are held
# until the top (mallinfo2's keepcost) is under 113 MiB.
WHERE = """
import ctypes, torch

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
held = [torch.empty(30 << 18)]
while libc.mallinfo2().keepcost >= 113 << 20 and len(held) < 64:
    held.append(torch.empty(30 << 18))
block = torch.empty(113 << 18)  # fp32: 113 MiB
ptr = block.data_ptr()
for line in open("/proc/self/maps"):
    span, *rest = line.split()
    low, high = (int(x, 16) for x in span.split("-"))
    if low <= ptr < high:
        print("heap" if line.rstrip().endswith("[heap]") else "own mapping")
"""


def _where(extra_env: dict[str, str]) -> str:
    return _last_word(WHERE, extra_env) or "nowhere"


def test_blocks_above_any_mmap_threshold_come_from_the_heap():
    """Blocks above glibc's largest mmap threshold (32 MiB) are mapped and unmapped on their
    own unless mmap is off (``MALLOC_MMAP_MAX_=0``); from the heap they are reused."""
    without = {k: v for k, v in MALLOC_ENV.items() if k != "MALLOC_MMAP_MAX_"}
    assert _where(without).endswith("mapping")
    assert _where(MALLOC_ENV) == "heap"
