"""Runnable recipes: experiment configs plus small plug-ins (losses, data preparation).

A package so that a config's ``imports: [recipes.<name>.<module>]`` resolves
when the repository root is on ``sys.path`` (``python -m skyrl`` from the root).
"""
