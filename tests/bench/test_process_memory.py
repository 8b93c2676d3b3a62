"""The bench's process-tree memory sampler counts a grandchild's memory, once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from process_memory import PeakTreeMemory, TreePss, available, children_of, resident_slack

pytestmark = pytest.mark.skipif(not available(), reason="needs Linux /proc/<pid>/smaps_rollup")

MIB = 1 << 20


def test_peak_counts_a_grandchild_that_holds_memory():
    # the child starts a grandchild that fills 300 MiB (every page written, so resident) and
    # holds it for 1.5 s; the child itself allocates nothing
    grandchild = "import time; b = b'x' * (300 << 20); time.sleep(1.5)"
    child = textwrap.dedent(f"""
        import subprocess, sys
        subprocess.run([sys.executable, "-c", {grandchild!r}], check=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", child])
    with PeakTreeMemory(proc.pid, interval=0.1) as mem:
        assert proc.wait(timeout=60) == 0
    # 300 MiB of buffer plus two bare interpreters (~10 MiB PSS each): a sampler that missed
    # the grandchild would read ~10 MiB, one that counted shared pages per process no more
    # than another interpreter's libraries
    assert 300 * MIB <= mem.peak_bytes < 360 * MIB


def test_children_of_walks_the_whole_tree():
    grandchild = "import time; time.sleep(30)"
    child = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {grandchild!r}])"
    proc = subprocess.Popen([sys.executable, "-c", child])
    try:
        for _ in range(200):  # until the grandchild is up (at most 10 s)
            tree = children_of(proc.pid)
            if len(tree) == 2:
                break
            time.sleep(0.05)
        assert len(tree) == 2 and tree[0] == proc.pid
        grandchild_pid = tree[1]
        assert children_of(grandchild_pid) == [grandchild_pid]
    finally:
        for pid in children_of(proc.pid)[::-1]:
            os.kill(pid, signal.SIGTERM)
        proc.wait(timeout=10)


def _holder(stages: list[tuple[int, float]]) -> str:
    """A child that holds ``MiB`` of written (resident) bytes for ``seconds``, stage by stage."""
    return textwrap.dedent(f"""
        import time
        held = []
        for mib, seconds in {stages!r}:
            held.append(b"x" * (mib << 20))
            time.sleep(seconds)
    """)


def test_a_steady_tree_is_read_in_full_once_and_growth_is_read_again():
    # one child holding 50 MiB for 1.5 s, then 250 MiB more for 1.5 s; ticks every 0.1 s, so
    # ~30 ticks. Reading smaps_rollup walks a process's page tables (~100 ms a tick for a
    # skyrl run's 12 processes); reading its resident size is a counter (<1 ms). A steady
    # process is read in full once; each stage's growth (50 and 250 MiB, far above the
    # 4 MiB slack) makes one more full read. The first read, the two stages, and a tick that
    # lands in the interpreter's start-up or in the middle of filling a buffer (each read
    # again once it has grown by the slack): 2-8 full reads, where a read a tick makes ~30.
    proc = subprocess.Popen([sys.executable, "-c", _holder([(50, 1.5), (250, 1.5)])])
    with PeakTreeMemory(proc.pid, interval=0.1) as mem:
        assert proc.wait(timeout=60) == 0
    assert mem.ticks >= 20
    assert 2 <= mem.full_reads <= 8
    # 300 MiB held at the end plus a bare interpreter (~10 MiB)
    assert 300 * MIB <= mem.peak_bytes < 330 * MIB


def test_growth_below_the_slack_counts_without_a_full_read():
    # after its first full read, a process grows by 2 MiB (under the 4 MiB slack): the
    # estimate is the first PSS plus the 2 MiB of resident growth, with no second read
    proc = subprocess.Popen([sys.executable, "-c", _holder([(40, 1.0), (2, 1.5)])])
    try:
        tree = TreePss(proc.pid)
        time.sleep(0.6)  # the 40 MiB stage is up
        first = tree.total_bytes()
        reads = tree.full_reads
        time.sleep(1.0)  # the 2 MiB stage is up
        second = tree.total_bytes()
        assert tree.full_reads == reads
        # 2 MiB of bytes plus at most a few pages of the interpreter's own
        assert 2 * MIB <= second - first < 3 * MIB
    finally:
        proc.wait(timeout=60)


def test_slack_is_4_mib_or_1_percent():
    assert resident_slack(100 * MIB) == 4 * MIB  # 1% is 1 MiB: the floor
    assert resident_slack(1000 * MIB) == 10 * MIB  # 1% of 1000 MiB
