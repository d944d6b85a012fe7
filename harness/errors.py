"""The errors the harness reports to its users, as opposed to bugs it measures."""

from __future__ import annotations


class UsageError(ValueError):
    """Bad input from the user: reported as one line, exit status 2."""
