"""Which format a stored record is in, among the formats this rlckpt reads, and the refusal of the rest.

Every record rlckpt writes keeps its format number beside its fields. A reader hands the formats it knows
(oldest first, today's last) to ``read_format``: the value is checked against the declaration of the
format it says it is in, and a format newer than any of them is refused as "written by a newer rlckpt",
which is the one thing an older reader can say about it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import rlckpt
from rlckpt.formats.json_text import quoted
from rlckpt.formats.spec import Record, type_name


def readable(formats: Sequence[Record]) -> str:
    """``formats 1-3`` or ``format 1``: the formats this rlckpt reads of one record."""
    numbers = sorted(r.format for r in formats if r.format is not None)
    if len(numbers) == 1:
        return f"format {numbers[0]}"
    return f"formats {numbers[0]}-{numbers[-1]}"


def found_format(formats: Sequence[Record], value: Any) -> tuple[str, Any] | None:
    """(key, number) a stored record names its format under (today's key first, then older ones), or None."""
    if type(value) is not dict:
        return None
    keys = list(dict.fromkeys(r.version_key for r in reversed(formats) if r.version_key is not None))
    for key in keys:
        if key in value:
            return key, value[key]
    return None


def read_format(formats: Sequence[Record], value: Any, where: str = "") -> Record:
    """The declaration (one of `formats`) of the format `value` is in, after checking `value` against it.

    Raises:
        today's record's error: naming `where`, the record and the field: not an object, no format number,
            a format this rlckpt does not read (a newer one: "written by a newer rlckpt"), or any field
            that does not fit that format's declaration.
    """
    today = formats[-1]
    if type(value) is not dict:
        raise today.refusal("", f"expected {today.name} object, got {type_name(value)}", where)
    found = found_format(formats, value)
    if found is None:
        raise today.refusal(str(today.version_key), f"missing (the format number, {readable(formats)})", where)
    key, number = found
    for record in formats:
        if record.version_key == key and type(number) is int and record.format == number:
            record.check(value, where)
            return record
    newest = max(r.format for r in formats if r.format is not None)
    this = f"this one ({rlckpt.__version__}) reads {readable(formats)}"
    if type(number) is int and number > newest:
        raise today.error(f"{_where(where)}{today.name}: {key} {number} was written by a newer rlckpt; {this}")
    shown = quoted(number) if type(number) in (int, str, float, bool) or number is None else type_name(number)
    raise today.error(f"{_where(where)}{today.name}: {key} {shown} is not a format rlckpt wrote; {this}")


def _where(where: str) -> str:
    return f"{where}: " if where else ""
