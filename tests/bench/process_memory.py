"""Peak memory of a process together with every process it starts (Linux ``/proc``).

A skyrl run is many processes (the driver, Ray's own, the training ranks, the engine); TRL's is
one. Their peaks compare only as the peak of the *sum* over the process tree at one moment, and
a sum of resident sets counts the pages processes share (torch's libraries, Ray's object
store) once per process. So each sample sums the proportional set size (PSS: a shared page
counts 1/n in each of its n processes) from ``/proc/<pid>/smaps_rollup``, and the peak is the
largest such sum over the samples. Memory held for less than ``interval`` seconds can fall
between two samples.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

PROC = Path("/proc")


def children_of(root: int) -> list[int]:
    """``root`` and all its live descendants, from each process's parent id in ``/proc``."""
    parent: dict[int, int] = {}
    for entry in os.scandir(PROC):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # gone between the listing and the read
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        parent[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    tree, frontier = [root], {root}
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier}
        tree.extend(sorted(frontier))
    return tree


def pss_bytes(pid: int) -> int:
    """Proportional set size of ``pid``; 0 once it is gone or cannot be read."""
    try:
        text = Path(PROC, str(pid), "smaps_rollup").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


def tree_pss_bytes(root: int) -> int:
    return sum(pss_bytes(pid) for pid in children_of(root))


class PeakTreeMemory:
    """Samples ``tree_pss_bytes(pid)`` every ``interval`` seconds in a thread until the
    ``with`` block ends.

    ``with PeakTreeMemory(proc.pid) as mem: proc.wait()`` then ``mem.peak_bytes``.
    """

    def __init__(self, pid: int, interval: float = 1.0):
        self.pid = pid
        self.interval = interval
        self.peak_bytes = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="peak-tree-memory", daemon=True)

    def _sample(self) -> None:
        while True:
            self.peak_bytes = max(self.peak_bytes, tree_pss_bytes(self.pid))
            if self._done.wait(self.interval):
                return

    def __enter__(self) -> PeakTreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


def available() -> bool:
    """Whether this system has what the sampler reads (Linux 4.14+)."""
    return Path(PROC, str(os.getpid()), "smaps_rollup").exists()
