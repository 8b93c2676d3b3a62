"""The rendezvous port the driver picks for a worker group (``find_free_port``)."""

from __future__ import annotations

import random
import socket

from skyrl.workers.distributed import FIRST_PORT, _ephemeral_range, address_in_use, find_free_port


def test_ports_come_from_below_the_ephemeral_range_and_are_free():
    """Outgoing connections take ports from the kernel's ephemeral range, so a port picked
    there can be gone by the time a worker binds it; below it only explicit binds land."""
    low, _ = _ephemeral_range()
    assert low > FIRST_PORT  # this machine's range leaves room: the draw is exercised
    for _ in range(20):
        port = find_free_port()
        assert FIRST_PORT <= port < low
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", port))  # free right now


def test_the_pick_ignores_the_seeded_random_module():
    """Every worker seeds ``random`` with trainer.seed; two groups (or two runs) seeded alike
    must not draw the same port sequence. 12,768 ports: 5 equal draws in a row by chance has
    probability ~1e-20."""
    picks = set()
    for _ in range(5):
        random.seed(0)
        picks.add(find_free_port())
    assert len(picks) > 1


def test_a_port_taken_by_another_process_is_recognised():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("", 0))
        taken.listen()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("", taken.getsockname()[1]))
            except OSError as exc:
                assert address_in_use(exc), exc
            else:
                raise AssertionError("binding a listening port succeeded")
    message = "The server socket has failed to listen ... code: -98, name: EADDRINUSE, message: address already in use"
    assert address_in_use(RuntimeError(message))
    assert not address_in_use(RuntimeError("connection refused"))
