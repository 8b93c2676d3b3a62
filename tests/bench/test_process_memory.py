"""The bench's process-tree memory sampler counts a grandchild's memory, once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from process_memory import PeakTreeMemory, available, children_of

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
