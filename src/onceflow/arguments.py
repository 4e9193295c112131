"""argparse types for the long-running commands (demo, lab, fuzz, pipeline): bad input is
refused in one line before minutes of work start, not met as a traceback at their end."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text}")
    return value


def output_file(text: str) -> Path:
    """A file to write at the end: its directory is made now, and must be writable."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory")
    _writable_directory(path.parent)
    return path


def output_directory(text: str) -> Path:
    """A directory to write in: made now if missing, and must be writable."""
    path = Path(text)
    _writable_directory(path)
    return path


def _writable_directory(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise argparse.ArgumentTypeError(f"cannot make directory {path}: {error.strerror or error}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write in {path}")
