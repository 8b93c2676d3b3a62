"""Metric tracking: ``Tracker`` fans each step's metrics out to the sinks ``SINKS`` names
(console, jsonl, tensorboard, wandb, mlflow, or one a recipe registers); ``summary`` reads
``metrics.jsonl`` back for the end-of-run plot and text."""

from skyrl.tracking.summary import format_summary, plot_history, read_history
from skyrl.tracking.tracker import SINKS, Tracker

__all__ = ["SINKS", "Tracker", "format_summary", "plot_history", "read_history"]
