"""Checks on the arguments of the public client API: a value of the wrong type is a TypeError that names the
argument and the type it takes, a value out of range a ValueError with the range, before anything is sent or
stored. Pure: no IO. Called once per call, never per entry (the per-entry check of appends is
`admission.admit`, which uses `check_bytes` only for an entry that is not already bytes)."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

BYTES_LIKE = "bytes, bytearray or memoryview"


def type_name(value: Any) -> str:
    return type(value).__name__


def check_int(name: str, value: Any, minimum: int | None = None, maximum: int | None = None) -> int:
    """An integer (an int, or anything with __index__ such as numpy's; never a bool), in
    [minimum, maximum] inclusive when given."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type_name(value)}") from None
    if minimum is not None and number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {number}")
    return number


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type_name(value)}")
    return value


def check_str(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type_name(value)}")
    return value


def check_bytes(name: str, value: Any) -> bytes:
    """Bytes-like (bytes, bytearray, memoryview), as bytes. A str is refused: its encoding is the caller's
    choice."""
    if type(value) is bytes:
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    hint = " (encode it, e.g. value.encode())" if isinstance(value, str) else ""
    raise TypeError(f"{name} must be {BYTES_LIKE}, got {type_name(value)}{hint}")


def check_entry_list(name: str, value: Any) -> None:
    """A collection of entries (a list, a tuple, any iterable), not one entry: a bytes object would otherwise be
    taken for a sequence of ints. The entries themselves are checked one by one where they are appended."""
    if isinstance(value, (bytes, bytearray, memoryview, str)) or not hasattr(value, "__iter__"):
        hint = " (append takes one entry)" if isinstance(value, (bytes, bytearray, memoryview)) else ""
        raise TypeError(f"{name} must be a list of entries ({BYTES_LIKE} each), got {type_name(value)}{hint}")


def check_str_map(name: str, value: Any) -> dict[str, str]:
    """A mapping of str to str (None: empty), as a new dict."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict of str to str, got {type_name(value)}")
    for key, item in value.items():
        if not isinstance(key, str):
            raise TypeError(f"{name} keys must be str, got {type_name(key)} ({key!r:.40})")
        if not isinstance(item, str):
            hint = " (it is stored as text: decode it, or encode it as base64)" \
                if isinstance(item, (bytes, bytearray, memoryview)) else ""
            raise TypeError(f"{name}[{key!r:.40}] must be a str, got {type_name(item)}{hint}")
    return dict(value)


def check_instance(name: str, value: Any, expected: type, what: str) -> Any:
    """`value` is an instance of `expected`; `what` names it in the message ("a ClientOptions")."""
    if not isinstance(value, expected):
        raise TypeError(f"{name} must be {what}, got {type_name(value)}")
    return value


def check_float(name: str, value: Any, minimum: float | None = None) -> float:
    """A real number (int or float; never a bool), >= minimum when given."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type_name(value)}")
    if minimum is not None and not value >= minimum:  # NaN is refused too
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return float(value)
