"""Metric tracking: ``Tracker`` fans each step's metrics out to console, jsonl, tensorboard,
wandb and mlflow; ``summary`` reads ``metrics.jsonl`` back for the end-of-run plot and text."""

from skyrl.tracking.summary import format_summary, plot_history, read_history
from skyrl.tracking.tracker import SINKS, Tracker

__all__ = ["SINKS", "Tracker", "format_summary", "plot_history", "read_history"]
