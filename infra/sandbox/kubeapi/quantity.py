"""Kubernetes resource quantities ("4", "500m", "16Gi", "1e3") as floats.

The emulator's own parser: importing the kubernetes package for this would double its start-up time.
"""

from __future__ import annotations

import re

from .errors import bad_request

_SUFFIXES = {
    "": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2.0 ** 10, "Mi": 2.0 ** 20, "Gi": 2.0 ** 30, "Ti": 2.0 ** 40, "Pi": 2.0 ** 50, "Ei": 2.0 ** 60,
}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)([a-zA-Z]*)$")


def parse_quantity(value: object) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    m = _QUANTITY.match(str(value).strip())
    if not m or m.group(2) not in _SUFFIXES:
        raise bad_request(f"invalid quantity {value!r}")
    return float(m.group(1)) * _SUFFIXES[m.group(2)]
