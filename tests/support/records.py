"""Hypothesis strategies over record declarations: values a declaration accepts, and a valid record broken
one field at a time (a field dropped, a value of another kind, a key no closed record has), each with the
field path a refusal must name. The property tests of tests/formats use them on every declared record."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from rlckpt.formats import (
    Anything,
    Bool,
    Const,
    Int,
    Kind,
    ListOf,
    MapKey,
    MapOf,
    Nullable,
    Number,
    Obj,
    Record,
    Refusal,
    Str,
    Tuple,
    field_path,
)

# Values of every JSON kind; a mutation uses those its field's kind refuses.
JSON_VALUES: tuple[Any, ...] = (None, True, -1, 0, 7, 2.5, "", "x", [], ["x"], {}, {"k": 1})


def plain_and_foreign_values() -> tuple[Any, ...]:
    """JSON_VALUES and what a torch.save of a careless writer holds: a tensor, NumPy scalars, a tuple."""
    import numpy as np
    import torch

    return (*JSON_VALUES, torch.tensor(3), torch.tensor([1.5]), np.int64(3), np.float32(1.0), (1, 2))


def valid_values(kind: Kind) -> st.SearchStrategy[Any]:
    """Values `kind` accepts (small ones)."""
    if isinstance(kind, Const):
        return st.just(kind.value)
    if isinstance(kind, Int):
        return st.integers(min_value=kind.minimum, max_value=kind.maximum)
    if isinstance(kind, Number):
        return st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False))
    if isinstance(kind, Bool):
        return st.booleans()
    if isinstance(kind, Str):
        if kind.choices:
            return st.sampled_from(kind.choices)
        if kind.pattern is not None:
            return st.from_regex(kind.pattern, fullmatch=True)
        if type(kind) is not Str:  # a kind of str with a check of its own (a bundle-relative path)
            return st.text(max_size=8).filter(lambda value: not _refuses(kind, value))
        return st.text(max_size=8)
    if isinstance(kind, Nullable):
        return st.one_of(st.none(), valid_values(kind.inner))
    if isinstance(kind, ListOf):
        return st.lists(valid_values(kind.item), max_size=3)
    if isinstance(kind, Tuple):
        return st.tuples(*(valid_values(k) for k in kind.items)).map(list)
    if isinstance(kind, MapOf):
        return st.dictionaries(valid_values(kind.key), valid_values(kind.value), max_size=3)
    if isinstance(kind, Anything):
        return st.one_of(st.none(), st.integers(), st.text(max_size=4))
    if isinstance(kind, Obj):
        required = {f.name: valid_values(f.kind) for f in kind.fields if f.required}
        optional = {f.name: valid_values(f.kind) for f in kind.fields if not f.required}
        return st.fixed_dictionaries(required, optional=optional)
    raise TypeError(f"no strategy for {kind!r}")


@dataclass(frozen=True)
class Mutation:
    """A record broken at one place: the path a refusal must name, and what was done there."""

    path: str
    what: str
    apply: Callable[[Any], None]  # breaks a (deep) copy of the valid record in place

    def of(self, record: Any) -> Any:
        broken = copy.deepcopy(record)
        self.apply(broken)
        return broken


def mutations(
    record: Record, value: dict[str, Any], pool: Sequence[Any], *, skip: Sequence[str] = ()
) -> list[Mutation]:
    """Every way to break `value` (which `record` accepts) at one place, with a replacement from `pool` its
    kind refuses; `skip`: paths left alone (whose refusal is tested on its own)."""
    found = [m for m in _walk(record.body, [], "", value, pool) if m.path not in skip]
    assert found, f"{record.name}: nothing to mutate"
    return found


def _walk(kind: Kind, keys: list[Any], path: str, value: Any, pool: Sequence[Any]) -> Iterator[Mutation]:
    for bad in pool if keys else ():  # a record that is not an object at all is tested on its own
        if _refuses(kind, bad):
            yield Mutation(path, f"{path} = {bad!r:.40}", _setter(keys, bad))
    if isinstance(kind, Obj) and isinstance(value, dict):
        for field in kind.fields:
            sub = field_path(path, field.name)
            if field.name in value:
                yield from _walk(field.kind, [*keys, field.name], sub, value[field.name], pool)
                if field.required:
                    yield Mutation(sub, f"{sub} dropped", _deleter([*keys, field.name]))
        if kind.closed:
            extra = field_path(path, "unexpected")
            yield Mutation(extra, f"{extra} added", _setter([*keys, "unexpected"], 1))
    elif isinstance(kind, Nullable) and value is not None:  # null is no mutation of it
        yield from _walk(kind.inner, keys, path, value, [b for b in pool if b is not None])
    elif isinstance(kind, ListOf) and isinstance(value, list | tuple):
        if value:
            for i in sorted({0, len(value) - 1}):
                yield from _walk(kind.item, [*keys, i], f"{path}[{i}]", value[i], pool)
        else:
            bad = next((b for b in pool if _refuses(kind.item, b)), None)
            if bad is not None:
                yield Mutation(f"{path}[0]", f"{path}[0] = {bad!r:.40}", _setter(keys, [bad]))
    elif isinstance(kind, Tuple) and isinstance(value, list | tuple):
        for i, item_kind in enumerate(kind.items):
            yield from _walk(item_kind, [*keys, i], f"{path}[{i}]", value[i], pool)
    elif isinstance(kind, MapOf) and isinstance(value, dict) and value:
        key = next(iter(value))
        yield from _walk(kind.value, [*keys, key], field_path(path, MapKey(key)), value[key], pool)


def _refuses(kind: Kind, value: Any) -> bool:
    try:
        kind.check(value)
    except Refusal:
        return True
    return False


def _parent(record: Any, keys: list[Any]) -> Any:
    for key in keys[:-1]:
        record = record[key]
    return record


def _setter(keys: list[Any], value: Any) -> Callable[[Any], None]:
    def apply(record: Any) -> None:
        _parent(record, keys)[keys[-1]] = copy.deepcopy(value)

    return apply


def _deleter(keys: list[Any]) -> Callable[[Any], None]:
    def apply(record: Any) -> None:
        del _parent(record, keys)[keys[-1]]

    return apply
