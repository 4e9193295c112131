"""argparse for every command: a parser whose usage errors are one line (naming an unknown flag,
and the known one it may misspell), and types for the long-running commands (demo, lab, fuzz,
pipeline), so that bad input is refused before minutes of work start, not met as a traceback at
their end."""

from __future__ import annotations

import argparse
import difflib
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn


class CommandParser(argparse.ArgumentParser):
    """Usage errors are one line on stderr, `PROG: MESSAGE (see PROG --help)`, exit 2; an unknown
    flag is named by the command it was given to. Its subcommands' parsers are of this class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")

    def parse_args(  # type: ignore[override]  # the one signature it is called with
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            chosen = _chosen_parser(self, parsed)
            known = [option for action in chosen._actions for option in action.option_strings]
            unknown = extras[0]
            close = difflib.get_close_matches(unknown.split("=", 1)[0], known, n=1, cutoff=0.75)
            hint = f" (did you mean {close[0]}?)" if close and unknown.startswith("-") else ""
            what = "option" if unknown.startswith("-") else "argument"
            chosen.exit(2, f"{chosen.prog}: unknown {what} {unknown}{hint} (see {chosen.prog} --help)\n")
        return parsed


def _chosen_parser(parser: argparse.ArgumentParser, parsed: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost subcommand's parser that `parsed` went through."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen: Any = action.choices.get(getattr(parsed, action.dest, None) or "")
            if chosen is not None:
                return _chosen_parser(chosen, parsed)
    return parser


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
