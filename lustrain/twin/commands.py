"""The twin's CLI commands: rehearse, local up, local invoke."""

from __future__ import annotations

from typing import Any


def register(sub: Any) -> None:
    """Add the twin's commands to the `lustrain` parser."""
