"""The add-ons' command-line entry points log their own lines to stderr (the training entry leaves its
logging to AReaL)."""

from __future__ import annotations

import logging
import sys


def console_logging(*loggers: logging.Logger) -> None:
    """These loggers' lines on stderr. AReaL's `getLogger` replaces the root logger and its manager,
    so handlers on the root do not reliably reach loggers created before; each gets its own."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    for lg in loggers:
        if not lg.handlers:
            lg.addHandler(handler)
        lg.setLevel(logging.INFO)
        lg.propagate = False
