"""Peak memory of a process together with every process it starts (Linux ``/proc``).

A skyrl run is many processes (the driver, Ray's own, the training ranks, the engine); TRL's is
one. Their peaks compare only as the peak of the *sum* over the process tree at one moment, and
a sum of resident sets counts the pages processes share (torch's libraries, Ray's object
store) once per process. So each sample sums the proportional set size (PSS: a shared page
counts 1/n in each of its n processes) from ``/proc/<pid>/smaps_rollup``, and the peak is the
largest such sum over the samples. Memory held for less than ``interval`` seconds can fall
between two samples.

Reading ``smaps_rollup`` walks the process's page tables: ~100 ms for a 2.5 GB process, ~80 ms
a tick over a skyrl run's 12 processes. Read every second, that slowed the train phase it was
measuring by about 12% on 2 cores (bench-trl's skyrl run, train phase of steps 3-5: 3.23, 3.32,
3.59 s with it, 2.90, 3.13 s without; with this sampler 3.01, 3.04 s against 2.96, 2.97). A
tick reads each process's resident size and minor page faults (``statm`` and ``stat``, kernel
counters, <1 ms for the tree), and reads every process's PSS again only when a process came or
went or some process's PSS may have moved by more than its slack (``resident_slack``) since the
last full read (``ProcessRead.unseen_bytes``): by its resident change, plus a page per minor
fault up to the anonymous bytes it shares. That second term is copy on write: a forked process
that writes a page it still shares with its parent gets a copy, a fault that adds a page to the
tree's PSS and moves no resident size. A process that shares no anonymous pages (an exec'd
one, as Ray's workers are) faults freely (allocations, frees) without a full
read. Between full reads a process counts its last PSS plus its resident growth since. The
estimate is off by at most a slack per process: a resident change within the slack is a private
page (counted whole, as PSS counts it) or a page shared with another process (counted whole
where PSS counts a share), and a copy on write within it is not counted. The whole tree is
read again, not just the process that moved, because a process that maps another's pages (or
copies them on write) moves that one's PSS without moving its resident size.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
SLACK_FLOOR = 4 << 20


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


def rollup_bytes(pid: int) -> dict[str, int]:
    """The byte counts of ``/proc/<pid>/smaps_rollup`` (``Pss``, ``Anonymous``, ``Pss_Anon``,
    ...); empty once ``pid`` is gone or cannot be read."""
    try:
        text = Path(PROC, str(pid), "smaps_rollup").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():  # the first, the address range, has no kB
        key, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            out[key] = int(value.split()[0]) * 1024
    return out


def pss_bytes(pid: int) -> int:
    """Proportional set size of ``pid``; 0 once it is gone or cannot be read."""
    return rollup_bytes(pid).get("Pss", 0)


def shared_anon_bytes(rollup: dict[str, int]) -> int:
    """At most how many bytes of anonymous pages the process of ``rollup`` shares with
    another (the pages a copy on write can copy). A page shared by n processes counts
    1 - 1/n >= 1/2 of a page more in ``Anonymous`` than in ``Pss_Anon``, so twice the
    difference; all of ``Anonymous`` where ``Pss_Anon`` is missing (older kernels)."""
    anon = rollup.get("Anonymous", 0)
    if "Pss_Anon" not in rollup:
        return anon
    return min(anon, 2 * (anon - rollup["Pss_Anon"]))


def resident_bytes(pid: int) -> int | None:
    """Resident set size of ``pid`` (``/proc/<pid>/statm``: counters, no page-table walk);
    None once it is gone."""
    try:
        return int(Path(PROC, str(pid), "statm").read_text().split()[1]) * PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return None


def minor_faults(pid: int) -> int | None:
    """Minor page faults of ``pid``'s threads so far (``/proc/<pid>/stat``, a counter); None
    once it is gone."""
    try:
        stat = Path(PROC, str(pid), "stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid pgrp session tty_nr tpgid flags minflt ..."
    return int(stat[stat.rindex(")") + 2 :].split()[7])


def resident_slack(resident: int) -> int:
    """How far a process's resident size may move before the tree is read in full again:
    1% of it, at least ``SLACK_FLOOR``."""
    return max(SLACK_FLOOR, resident // 100)


@dataclass(frozen=True)
class ProcessRead:
    """What a full read saw of one process."""

    pss: int
    resident: int
    """Resident bytes (``statm``)."""
    minor_faults: int
    shared_anon: int
    """At most this many bytes of its anonymous pages are shared (``shared_anon_bytes``)."""

    def unseen_bytes(self, resident: int, minor_faults: int) -> int:
        """At most how far the process's PSS can have moved since this read, now that it has
        ``resident`` bytes and ``minor_faults``: its resident change, plus a page per fault
        up to its shared anonymous bytes (each copy on write is a fault and adds at most a
        page to the tree's PSS)."""
        copied = min((minor_faults - self.minor_faults) * PAGE_BYTES, self.shared_anon)
        return abs(resident - self.resident) + max(0, copied)


class TreePss:
    """The PSS of a process tree, read in full only when some process's PSS may have moved by
    more than its slack (module docstring). ``total_bytes()`` per tick; ``full_reads`` counts
    the full reads."""

    def __init__(self, root: int):
        self.root = root
        self.full_reads = 0
        self._read: dict[int, ProcessRead] = {}
        """pid -> what the last full read saw of it."""

    def total_bytes(self) -> int:
        now = {}  # pid -> (resident bytes, minor faults)
        for pid in children_of(self.root):
            size, faults = resident_bytes(pid), minor_faults(pid)
            if size is not None and faults is not None:
                now[pid] = (size, faults)
        # a process that came or went moves the PSS of those it shared pages with
        if now.keys() != self._read.keys() or any(
            self._read[pid].unseen_bytes(*counters) > resident_slack(self._read[pid].resident)
            for pid, counters in now.items()
        ):
            self.full_reads += 1
            self._read = {pid: self._read_one(pid, *counters) for pid, counters in now.items()}
        return sum(
            self._read[pid].pss + size - self._read[pid].resident for pid, (size, _) in now.items()
        )

    @staticmethod
    def _read_one(pid: int, resident: int, minor_faults: int) -> ProcessRead:
        rollup = rollup_bytes(pid)
        return ProcessRead(rollup.get("Pss", 0), resident, minor_faults, shared_anon_bytes(rollup))


class PeakTreeMemory:
    """Samples ``TreePss(pid).total_bytes()`` every ``interval`` seconds in a thread until the
    ``with`` block ends; ``ticks`` and ``full_reads`` say how often it sampled and read in full.

    ``with PeakTreeMemory(proc.pid) as mem: proc.wait()`` then ``mem.peak_bytes``.
    """

    def __init__(self, pid: int, interval: float = 1.0):
        self.pid = pid
        self.interval = interval
        self.peak_bytes = 0
        self.ticks = 0
        self._tree = TreePss(pid)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="peak-tree-memory", daemon=True)

    def _sample(self) -> None:
        while True:
            self.peak_bytes = max(self.peak_bytes, self._tree.total_bytes())
            self.ticks += 1
            if self._done.wait(self.interval):
                return

    @property
    def full_reads(self) -> int:
        return self._tree.full_reads

    def __enter__(self) -> PeakTreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


def available() -> bool:
    """Whether this system has what the sampler reads (Linux 4.14+)."""
    return Path(PROC, str(os.getpid()), "smaps_rollup").exists()
