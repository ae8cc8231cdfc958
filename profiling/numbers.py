"""Numbers from text a person typed (environment variables and flags): the one parser every reader uses.

Python's int() and float() take more than a person means: any Unicode decimal digit ('١٢' is 12), digit
separators ('1_000'), and a number long enough to raise an error of its own (more than 4,300 digits: the
interpreter's int-conversion limit). Here a number is ASCII digits only, with an optional sign, of a length
no setting needs to exceed, so a typo is refused with one line instead of being read as something else or
escaping as a traceback. `str.isdigit()` is no check: it is true for '²', which int() refuses.
"""

from __future__ import annotations

import math
import re

__all__ = ["MAX_DIGITS", "number", "shown", "whole_number"]

#: Longer than any bound a setting has (the largest is 2**63); a longer number is refused before conversion.
MAX_DIGITS = 19
_WHOLE = re.compile(r"[+-]?[0-9]+", re.ASCII)
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:nan|inf|infinity)",
                      re.ASCII | re.IGNORECASE)
_SPACE = " \t\n\r\f\v"  # ASCII white space around a value is forgiven, as a shell user types it


def whole_number(text: str) -> int | None:
    """`text` as a whole number (ASCII digits, an optional sign, white space around), or None when it is not
    one or has more than MAX_DIGITS digits."""
    body = text.strip(_SPACE)
    if not _WHOLE.fullmatch(body) or len(body.lstrip("+-")) > MAX_DIGITS:
        return None
    return int(body)


def number(text: str) -> float | None:
    """`text` as a decimal number (ASCII only, no digit separators; nan and inf are returned for the caller's
    range check to name), or None."""
    body = text.strip(_SPACE)
    if len(body) > 2 * MAX_DIGITS or not _DECIMAL.fullmatch(body):
        return None
    value = float(body)
    return value if math.isfinite(value) or body.lstrip("+-").isalpha() else None


def shown(text: str, limit: int = 24) -> str:
    """`text` quoted for an error line, cut to `limit` characters (saying how long it was when cut)."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text):,} characters)"
