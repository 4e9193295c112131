"""Errors the commands report as one line on stderr instead of a traceback."""

from __future__ import annotations


class AdminError(Exception):
    """The command cannot do what was asked; exit code 1."""

    exit_code = 1


class UsageError(AdminError):
    """The arguments do not make sense together; exit code 2, as for argparse's own errors."""

    exit_code = 2
