"""Kubernetes resource quantities (``500m``, ``2Gi``, ``1e3``) as exact numbers, bounded.

Quantities arrive in annotations anyone who can edit a pod may write, so the text length,
the exponent and the result are bounded before any arithmetic: ``1e999999999`` is an error
naming the input, not a number with a billion digits.
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction

MAX_TEXT = 64
"""The longest quantity Kubernetes itself prints is about 30 characters."""

MAX_EXPONENT = 30
"""Decimal exponents beyond this cannot describe any node's CPU or memory."""

MAX_VALUE = 2**63 - 1
"""Kubernetes keeps quantities in int64; so do the cgroup files they end up in."""

_QUANTITY = re.compile(
    r"(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<exp>[eE][+-]?[0-9]+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?")
_SUFFIXES: dict[str, Fraction] = {
    "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40),
    "Pi": Fraction(2**50), "Ei": Fraction(2**60), "n": Fraction(1, 10**9), "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3), "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9),
    "T": Fraction(10**12), "P": Fraction(10**15), "E": Fraction(10**18),
}


def parse_quantity(value: object) -> Fraction:
    """A quantity (string, or a JSON integer) as an exact number; ValueError naming the input if bad."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"quantity {value!r} is neither a string nor an integer")
    if isinstance(value, int):
        return _bounded(Fraction(value), value)
    text = value.strip()
    if len(text) > MAX_TEXT:
        raise ValueError(f"bad quantity {text[:MAX_TEXT]!r}...: longer than {MAX_TEXT} characters")
    return _parse_text(text, value)


@functools.lru_cache(maxsize=1024)
def _parse_text(text: str, value: str) -> Fraction:
    """Cached (``text`` is at most MAX_TEXT characters; ``value``, the input as given, names
    it in errors): every pod list repeats the same few quantities ("100m", "128Mi") for every
    pod, and Fraction arithmetic is most of the cost of reading one. Errors are not cached."""
    match = _QUANTITY.fullmatch(text)
    if not match:
        raise ValueError(f"bad quantity {value!r}: want a number with an optional suffix, like 500m or 2Gi")
    number = Fraction(match["num"])
    if match["exp"]:
        exponent = int(match["exp"][1:])
        if abs(exponent) > MAX_EXPONENT:
            raise ValueError(f"bad quantity {value!r}: exponent {exponent} is beyond ±{MAX_EXPONENT}")
        number *= Fraction(10) ** exponent
    elif match["suffix"]:
        number *= _SUFFIXES[match["suffix"]]
    return _bounded(number, value)


def _bounded(number: Fraction, value: object) -> Fraction:
    if abs(number) > MAX_VALUE:
        raise ValueError(f"quantity {value!r} is larger than {MAX_VALUE}")
    return number
