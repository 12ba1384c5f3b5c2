"""A record declaration refuses what does not fit it at the first place it breaks, naming the record and the
field path; it takes plain values only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlckpt.errors import ReplayStateError
from rlckpt.formats import (
    Field,
    Int,
    ListOf,
    MapOf,
    Nullable,
    Number,
    Obj,
    Record,
    Refusal,
    Str,
    Tuple,
    plain_int,
    plain_optional_int,
    read_format,
)

ITEM = Obj("item", (Field("n", Nullable(Int(minimum=0)), "a count"), Field("tag", Str(), "a tag", required=False)))
THING = Record(
    "thing",
    2,
    (
        Field("items", ListOf(ITEM), "items"),
        Field("by_name", MapOf(ITEM), "items by name"),
        Field("entry", Tuple((Str(choices=("a", "b")), Number()), ("letter", "weight")), "a pair"),
    ),
    ReplayStateError,
)
OPEN = Record("open thing", 1, (Field("n", Int(), "a number"),), ReplayStateError, closed=False)


def thing(**changes):
    return {"format": 2, "items": [{"n": 1}, {"n": None, "tag": "t"}], "by_name": {}, "entry": ["a", 1.5], **changes}


def refusal(record: Record, value) -> str:
    with pytest.raises(ReplayStateError) as refused:
        record.check(value, "step 3: thing.pt")
    return str(refused.value)


def test_a_value_that_fits_its_declaration_passes():
    THING.check(thing())


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (thing(items=[{"n": 1}, {"n": torch.tensor(3)}]), "items[1].n: expected int ≥ 0 or null, got torch.Tensor"),
        (thing(items=[{"n": np.int64(3)}]), "items[0].n: expected int ≥ 0 or null, got numpy.int64"),
        (thing(items=[{"n": True}]), "items[0].n: expected int ≥ 0 or null, got bool"),
        (thing(items=[{"n": -1}]), "items[0].n: expected int ≥ 0 or null, got -1"),
        (thing(items=[{}]), "items[0].n: missing (required: int ≥ 0 or null)"),
        (thing(items=[{"n": 1, "payload": 2}]), "items[0].payload: unknown field (the item is a closed record)"),
        (thing(by_name={"g 1": {"n": "x"}}), "by_name['g 1'].n: expected int ≥ 0 or null, got str"),
        (thing(entry=["c", 1]), "entry[0]: expected one of 'a', 'b', got 'c'"),
        (thing(entry=["a"]), "entry: expected 2 items ['letter', 'weight'], got 1"),
        (thing(entry=["a", float("nan")]), "entry[1]: expected a finite number, got nan"),
        (thing(format=1), "format: expected 2, got 1"),
        ([thing()], "expected thing object, got list"),
    ],
)
def test_a_refusal_names_the_file_the_record_and_the_field_path(value, message):
    assert refusal(THING, value) == f"step 3: thing.pt: thing: {message}"


def test_an_open_record_keeps_keys_it_does_not_declare_and_checks_those_it_does():
    OPEN.check({"format": 1, "n": 2, "theirs": object()})
    assert refusal(OPEN, {"format": 1, "n": "2"}) == "step 3: thing.pt: open thing: n: expected int, got str"


def test_a_format_is_read_by_the_declaration_it_names_and_a_newer_one_is_refused_as_such():
    old = Record("thing", 1, (Field("items", ListOf(ITEM), "items"),), ReplayStateError)
    assert read_format([old, THING], {"format": 1, "items": []}) is old
    with pytest.raises(ReplayStateError, match=r"^thing: format 3 was written by a newer rlckpt; this one .* 1-2$"):
        read_format([old, THING], {"format": 3})
    with pytest.raises(ReplayStateError, match=r"^thing: format: missing"):
        read_format([old, THING], {"items": []})


@pytest.mark.parametrize("value", [3, np.int64(3), np.uint8(3), torch.tensor(3), torch.tensor(3, dtype=torch.int32)])
def test_an_integer_scalar_enters_as_the_plain_int_it_holds(value):
    assert type(plain_int(value, "x")) is int and plain_int(value, "x") == 3


@pytest.mark.parametrize(
    "value", [True, np.bool_(True), torch.tensor(True), 3.0, np.float64(3), torch.tensor(3.0), torch.tensor([3]), "3"]
)
def test_anything_else_is_refused_where_it_enters_naming_the_argument(value):
    with pytest.raises(Refusal, match="^target_step: expected int or None, got "):
        plain_optional_int(value, "target_step")
