"""Errors tracedx raises for unusable input.

Every error a user can cause with bad input is a :class:`TraceError` subclass; the CLI
prints its one-line message and exits with status 2 (never a traceback).
"""

from __future__ import annotations


class TraceError(Exception):
    """Unusable input: the message is one line that says what is wrong and where."""

    exit_code = 2


class TraceFormatError(TraceError):
    """The file is not a readable chrome trace (not JSON, truncated, not a trace)."""


class DeviceSpecError(TraceError):
    """A device name, peak or calibration file given by the user cannot be used."""
