"""``python -m skyrl``: the ``skyrl-train`` command."""

from skyrl.cli import main

main()
