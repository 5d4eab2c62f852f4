"""The ids a user or a message can give, and the one pattern they must match.

Ids become parts of Redis key names, queue names and working-directory paths, so anything
outside the pattern (a `/`, a `|`, `..`, a space) is refused before it is written anywhere.
"""

from __future__ import annotations

import re

ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}"
"""Letters, digits and `_.:-`, starting with a letter or digit, at most 128 characters."""
ID_RULE = "letters, digits and _ . : -, starting with a letter or digit, at most 128 characters"
_ID = re.compile(ID_PATTERN)


class BadId(ValueError):
    """An id that does not match `ID_PATTERN`; the message names the id and the pattern."""


def is_valid_id(value: object) -> bool:
    return isinstance(value, str) and _ID.fullmatch(value) is not None


def check_id(value: object, what: str = "id") -> str:
    """`value` if it is a valid id; BadId naming `what` and the pattern otherwise."""
    if is_valid_id(value):
        return value  # type: ignore[return-value]
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    raise BadId(f"{what} {shown} is not a valid id: use {ID_RULE}")
