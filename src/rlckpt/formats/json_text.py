"""JSON text from a run, parsed with its nesting bounded, and untrusted values quoted short in errors.

Whoever can write a run chooses the bytes of every record in it. Python's json recurses once per level
of nesting, and so does anything that walks the value afterwards (``dataclasses.asdict``, ``json.dumps``),
so a record nested 800 deep parses and then fails far away with RecursionError. ``load_json`` refuses it
before parsing, by counting brackets outside strings, at C speed: every JSON record rlckpt reads from a
run or a bundle (manifest, COMMIT, intent, run record, data-plane metadata, rows header, the trainer
record) goes through it. ``quoted`` is how an error names such a value: a 10-million-character key is
named by its first characters and its length, never echoed whole.
"""

from __future__ import annotations

import json
import math
from itertools import accumulate
from typing import Any

# Levels of objects and arrays a record read from a run may have. rlckpt's own records need 4 (manifest →
# files → entry); the rest is room for a saver's own metadata. Far below the interpreter's recursion limit,
# so neither json nor anything that walks the value later can run out of stack.
MAX_JSON_DEPTH = 64
# How many characters of an untrusted value an error quotes.
QUOTED_CHARS = 80

_CONTAINERS = (dict, list, tuple)
_STRUCTURE = b'"[]{}'
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in _STRUCTURE)
_LEVEL = [0] * 256
_LEVEL[ord("[")] = _LEVEL[ord("{")] = 1
_LEVEL[ord("]")] = _LEVEL[ord("}")] = -1


def json_depth(text: str | bytes) -> int:
    """Levels of objects and arrays in JSON `text`: ``{}`` is 1, ``{"a": [1]}`` 2, a scalar 0. Exact for
    valid JSON and never below the depth json's parser reaches on the valid prefix of invalid JSON: escaped
    backslashes and quotes are dropped (left to right, as a parser reads them), then every string, and
    what is left is brackets. Bytes-level passes only: a 32 MiB manifest takes a fraction of its parse."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    # Two quotes with nothing between them leave every other character inside or outside a string as it
    # was: most strings hold no bracket, so little is left to split.
    data = data.translate(None, _NOT_STRUCTURE).replace(b'""', b"")
    outside = b"".join(data.split(b'"')[::2])  # in valid JSON, every other piece is a string's inside
    return max(accumulate(map(_LEVEL.__getitem__, outside)), default=0)


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether `value` holds dicts, lists and tuples nested more than `limit` levels (``{}`` is 1, as
    ``json_depth`` counts): the check a writer makes before ``json.dumps`` or any recursive walk, which a
    value 1,000 deep would crash with RecursionError. Iterative, and no deeper than `limit` + 1 (a value
    that holds itself is too deep, not a hang)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, _CONTAINERS):
            continue
        if depth == limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, _CONTAINERS))
    return False


def json_problem(value: Any, path: str) -> str | None:
    """Where `value` holds what canonical JSON (sorted keys, no NaN) cannot, as a path from `path`
    (``metadata['seen'][2]: a builtins.set``), or None. Walks without recursing, in the order json would;
    call it after ``nested_deeper_than``, which bounds how deep it goes."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if item is None or isinstance(item, (str, int)):  # bool is an int
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                return f"{where}: {item} (JSON holds no NaN or infinity)"
            continue
        if isinstance(item, (list, tuple)):
            stack.extend((child, f"{where}[{i}]") for i, child in reversed(list(enumerate(item))))
            continue
        if isinstance(item, dict):
            for key in item:
                if not (key is None or isinstance(key, (str, int, float))):
                    return f"{where}: a key of type {type(key).__name__} (JSON keys are strings)"
            try:
                keys = sorted(item)  # what json's sort_keys does, before it turns keys into strings
            except TypeError:
                found = ", ".join(sorted({type(key).__name__ for key in item}))
                return f"{where}: keys of several types ({found}) that do not sort (JSON keys are strings)"
            stack.extend((item[key], f"{where}[{quoted(key)}]") for key in reversed(keys))
            continue
        kind = type(item)
        return f"{where}: a {kind.__module__}.{kind.__qualname__} (not JSON)"
    return None


def load_json(text: str | bytes, what: str, max_depth: int = MAX_JSON_DEPTH, **options: Any) -> Any:
    """``json.loads(text, **options)``, refused before parsing when nested deeper than `max_depth`.

    Raises:
        ValueError: naming `what`: nested too deeply, or what json refuses (JSONDecodeError, a ValueError).
    """
    if json_depth(text) > max_depth:
        raise ValueError(f"{what} is nested deeper than {max_depth} levels of objects and arrays")
    return json.loads(text, **options)


def quoted(value: object, limit: int = QUOTED_CHARS) -> str:
    """`value` as ``repr`` quotes it, cut to its first `limit` characters (with its length said) when longer:
    how an error names a key, path or value whoever writes a run chose."""
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit]!r}… ({len(value)} characters)"
    shown = repr(value)
    return shown if len(shown) <= limit else f"{shown[:limit]}… ({len(shown)} characters)"
