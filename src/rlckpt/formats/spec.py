"""Declarative record specs and the one check every reader runs before it trusts a record.

A record is declared once, next to the code that writes it: its fields, each field's kind, required or
optional, and whether the record is closed (no other keys) or open. ``Record.check`` walks a value
against that declaration and refuses the first thing that does not fit with the record's own error,
naming the record and the field path — ``replay index: groups[3].target_step: expected int or null, got
torch.Tensor`` — before anything else (a digest, a comparison) touches the value. docs/formats.md is
rendered from the same declarations (``formats.markdown``).

Kinds accept plain Python values only, exactly as JSON or ``torch.load(weights_only=True)`` gives them
back: no bool where an int is asked for, no NumPy or tensor scalar anywhere. A record a reader accepts
can be written again as it is. No torch, Ray or TransferQueue here: the store uses it too.
"""

from __future__ import annotations

import abc
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rlckpt.formats.json_text import QUOTED_CHARS, quoted


class MapKey(str):
    """A key of a map (a name the writer chose): always shown in brackets, never as a declared field."""


class Refusal(Exception):
    """Where a value breaks its declaration: the steps from the record down to it (field names, list
    indexes, map keys) and what is wrong. Containers add their step as it passes up, so a value that
    fits costs no path at all; ``Record.check`` turns it into the record's own error."""

    def __init__(self, problem: str, *steps: Any) -> None:
        super().__init__(problem)
        self.problem = problem
        self.steps: list[Any] = list(steps)  # field names, list indexes, MapKeys

    @property
    def path(self) -> str:
        """``groups[3].target_step``, ``pending['g00000016'].draw_seq``; '' at the record itself."""
        path = ""
        for step in self.steps:
            path = field_path(path, step)
        return path

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}" if self.steps else self.problem


def type_name(value: Any) -> str:
    """How a refusal names a value's type: JSON's words for JSON's types, else the type with its package
    (``torch.Tensor``, ``numpy.int64``) — never the value itself, which may be a large tensor."""
    if value is None:
        return "null"
    kind = type(value)
    if kind is dict:
        return "object"
    if kind.__module__ == "builtins":
        return kind.__name__
    return f"{kind.__module__.split('.')[0]}.{kind.__qualname__}"


def field_path(parent: str, key: Any) -> str:
    """``groups[3]`` + ``target_step`` → ``groups[3].target_step``; a map key, or a key that is not a
    short name, in brackets, quoted short (``quoted``): a key is whatever the record's writer chose."""
    if isinstance(key, int) and not isinstance(key, bool):
        return f"{parent}[{key}]"
    if type(key) is str and key.isidentifier() and len(key) <= QUOTED_CHARS:
        return f"{parent}.{key}" if parent else key
    return f"{parent}[{quoted(str(key) if isinstance(key, str) else key)}]"


def _shown(value: Any) -> str:
    """A plain scalar as it is (short), anything else by its type."""
    if value is None or type(value) in (bool, int, float) or (type(value) is str and len(value) <= QUOTED_CHARS):
        return quoted(value)
    return type_name(value)


class Kind(abc.ABC):
    """What one value of a record may be."""

    @abc.abstractmethod
    def describe(self) -> str:
        """In refusals and in docs/formats.md: ``int ≥ 0``, ``list of str``, ``int or null``."""

    @abc.abstractmethod
    def check(self, value: Any) -> None:
        """Raise Refusal unless `value` is of this kind."""

    def objects(self) -> Iterator[tuple[str, Obj]]:
        """The objects with declared fields a value of this kind holds, each with the path suffix that
        leads to it (``[]`` for a list's items, ``[*]`` for a map's values): docs/formats.md gives each
        its own table."""
        return iter(())

    def wrong(self, value: Any) -> Refusal:
        return Refusal(f"expected {self.describe()}, got {type_name(value)}")


@dataclass(frozen=True)
class Int(Kind):
    """A Python int (not bool), optionally bounded."""

    minimum: int | None = None
    maximum: int | None = None

    def describe(self) -> str:
        if self.minimum is not None and self.maximum is not None:
            return f"int in {self.minimum}..{self.maximum}"
        if self.minimum is not None:
            return f"int ≥ {self.minimum}"
        if self.maximum is not None:
            return f"int ≤ {self.maximum}"
        return "int"

    def check(self, value: Any) -> None:
        if type(value) is not int:
            raise self.wrong(value)
        if (self.minimum is not None and value < self.minimum) or (self.maximum is not None and value > self.maximum):
            raise Refusal(f"expected {self.describe()}, got {value}")


@dataclass(frozen=True)
class Number(Kind):
    """A finite int or float (not bool)."""

    def describe(self) -> str:
        return "number"

    def check(self, value: Any) -> None:
        if type(value) not in (int, float):
            raise self.wrong(value)
        if not math.isfinite(value):
            raise Refusal(f"expected a finite number, got {value}")


@dataclass(frozen=True)
class Bool(Kind):
    def describe(self) -> str:
        return "bool"

    def check(self, value: Any) -> None:
        if type(value) is not bool:
            raise self.wrong(value)


@dataclass(frozen=True)
class Str(Kind):
    """A str; optionally one of `choices`, or matching `pattern` (whole string), described as `meaning`."""

    choices: tuple[str, ...] = ()
    pattern: str | None = None
    meaning: str | None = None

    def describe(self) -> str:
        if self.meaning:
            return self.meaning
        if self.choices:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        if self.pattern:
            return f"str matching {self.pattern}"
        return "str"

    def check(self, value: Any) -> None:
        if type(value) is not str:
            raise self.wrong(value)
        if (self.choices and value not in self.choices) or (
            self.pattern is not None and re.fullmatch(self.pattern, value) is None
        ):
            raise Refusal(f"expected {self.describe()}, got {_shown(value)}")


SHA256_HEX = Str(pattern="[0-9a-f]{64}", meaning="sha256 hex digest (64 lowercase hex digits)")


@dataclass(frozen=True)
class Const(Kind):
    """Exactly this int (a record's format number)."""

    value: int

    def describe(self) -> str:
        return str(self.value)

    def check(self, value: Any) -> None:
        if type(value) is not int or value != self.value:
            raise Refusal(f"expected {self.value}, got {_shown(value)}")


@dataclass(frozen=True)
class Nullable(Kind):
    inner: Kind

    def describe(self) -> str:
        return f"{self.inner.describe()} or null"

    def check(self, value: Any) -> None:
        if value is None:
            return
        try:
            self.inner.check(value)
        except Refusal as refusal:
            if refusal.steps:  # refused deeper inside: that names the field
                raise
            expected = f"expected {self.inner.describe()}"
            raise Refusal(refusal.problem.replace(expected, f"expected {self.describe()}", 1)) from None

    def objects(self) -> Iterator[tuple[str, Obj]]:
        return self.inner.objects()


@dataclass(frozen=True)
class ListOf(Kind):
    """A list (a tuple too: what a writer holds in memory) of one kind."""

    item: Kind

    def describe(self) -> str:
        return f"list of {self.item.describe()}"

    def check(self, value: Any) -> None:
        if type(value) not in (list, tuple):
            raise self.wrong(value)
        for i, item in enumerate(value):
            try:
                self.item.check(item)
            except Refusal as refusal:
                self._name_the_item(refusal, item)
                refusal.steps.insert(0, i)
                raise

    def _name_the_item(self, refusal: Refusal, item: Any) -> None:
        """A refusal inside an object that has a name of its own (``identity``) says which one it is."""
        identity = self.item.identity if isinstance(self.item, Obj) else None
        name = item.get(identity) if identity is not None and type(item) is dict else None
        if refusal.steps and type(name) is str:
            refusal.problem += f" (in the {self.item.describe().removesuffix(' object')} {quoted(name)})"

    def objects(self) -> Iterator[tuple[str, Obj]]:
        for suffix, obj in self.item.objects():
            yield "[]" + suffix, obj


@dataclass(frozen=True)
class Tuple(Kind):
    """A list of fixed length whose items have their own kinds: ``[dtype, shape, offset, length]``."""

    items: tuple[Kind, ...]
    names: tuple[str, ...]  # what each item is (docs)

    def describe(self) -> str:
        return "[" + ", ".join(f"{n}: {k.describe()}" for n, k in zip(self.names, self.items, strict=True)) + "]"

    def check(self, value: Any) -> None:
        if type(value) not in (list, tuple):
            raise self.wrong(value)
        if len(value) != len(self.items):
            raise Refusal(f"expected {len(self.items)} items {list(self.names)}, got {len(value)}")
        for i, (kind, item) in enumerate(zip(self.items, value, strict=True)):
            try:
                kind.check(item)
            except Refusal as refusal:
                refusal.steps.insert(0, i)
                raise


@dataclass(frozen=True)
class MapOf(Kind):
    """An object whose keys are names the writer chose (str) and whose values have one kind."""

    value: Kind
    key: Str = Str()

    def describe(self) -> str:
        key = "" if self.key == Str() else f" ({self.key.describe()})"
        return f"object of str{key} → {self.value.describe()}"

    def check(self, value: Any) -> None:
        if type(value) is not dict:
            raise self.wrong(value)
        for key, item in value.items():
            try:
                self.key.check(key)
            except Refusal as refusal:
                raise Refusal(f"key: {refusal.problem}", MapKey(key) if type(key) is str else key) from None
            try:
                self.value.check(item)
            except Refusal as refusal:
                refusal.steps.insert(0, MapKey(key))
                raise

    def objects(self) -> Iterator[tuple[str, Obj]]:
        for suffix, obj in self.value.objects():
            yield "[*]" + suffix, obj


@dataclass(frozen=True)
class Anything(Kind):
    """Any value: the writer's own (an open record's user keys)."""

    def describe(self) -> str:
        return "any"

    def check(self, value: Any) -> None:
        return None


@dataclass(frozen=True)
class Field:
    """One key of an object: its kind, what it means (docs), and whether it must be there."""

    name: str
    kind: Kind
    doc: str
    required: bool = True


@dataclass(frozen=True)
class Obj(Kind):
    """An object with declared fields; `closed`: no other key is allowed."""

    name: str  # what one of these is ("group"), for docs
    fields: tuple[Field, ...]
    closed: bool = True
    identity: str | None = None  # the field that names one in a list ("group_id"): refusals inside name it
    _known: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_known", frozenset(spec.name for spec in self.fields))

    def describe(self) -> str:
        return f"{self.name} object"

    def check(self, value: Any) -> None:
        if type(value) is not dict:
            raise self.wrong(value)
        for spec in self.fields:
            if spec.name in value:
                try:
                    spec.kind.check(value[spec.name])
                except Refusal as refusal:
                    refusal.steps.insert(0, spec.name)
                    raise
            elif spec.required:
                raise Refusal(f"missing (required: {spec.kind.describe()})", spec.name)
        if self.closed and not self._known.issuperset(value):
            unknown = next(key for key in value if key not in self._known)
            raise Refusal(f"unknown field (the {self.name} is a closed record)", unknown)

    def field(self, name: str) -> Field:
        """The declaration of field `name` (KeyError if this object has none)."""
        for spec in self.fields:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def objects(self) -> Iterator[tuple[str, Obj]]:
        yield "", self


@dataclass(frozen=True)
class Record:
    """One record in one format: what docs/formats.md says of it and what ``check`` holds a value to.

    The format number is stored under `version_key` (added to the fields, as the first one); a record
    with ``version_key=None`` is versioned by the record that holds it (`format` then says which of its
    container's formats introduced this shape) or by a third party (`format` None).
    """

    name: str  # in refusals: "replay index"
    format: int | None
    fields: tuple[Field, ...]
    error: type[Exception]
    closed: bool = True
    version_key: str | None = "format"
    constant: str = ""  # the Python name of the format number, e.g. REPLAY_INDEX_FORMAT
    stored_in: str = ""  # where it is kept (docs)
    writer: str = ""  # the code that writes it (docs)
    doc: str = ""  # what it is for (docs)
    written_by: str = ""  # which rlckpt versions and commits wrote this format (docs)
    changes: str = ""  # what this format changed from the one before (docs)
    body: Obj = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fields = self.fields
        if self.version_key is not None:
            assert self.format is not None, f"{self.name}: a stored version needs a format number"
            version = Field(
                self.version_key,
                Const(self.format),
                f"the format number (`{self.constant}`)" if self.constant else "the format number",
            )
            fields = (version, *fields)
        object.__setattr__(self, "body", Obj(self.name, fields, self.closed))

    def check(self, value: Any, where: str = "") -> None:
        """Refuse `value` unless it is this record in this format, with ``error`` naming `where` (step and
        file), the record and the field path."""
        try:
            self.body.check(value)
        except Refusal as refusal:
            raise self.refusal(refusal.path, refusal.problem, where) from None

    def refusal(self, path: str, problem: str, where: str = "") -> Exception:
        """This record's error for `problem` at `path`."""
        prefix = f"{where}: " if where else ""
        at = f"{path}: " if path else ""
        return self.error(f"{prefix}{self.name}: {at}{problem}")
