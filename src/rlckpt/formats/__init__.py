"""Record declarations: each record's format, fields and kinds stated once, one check per record, and
docs/formats.md rendered from them. Imports neither torch, Ray nor TransferQueue (the store uses it)."""

from rlckpt.formats.json_text import MAX_JSON_DEPTH, json_depth, load_json, nested_deeper_than, quoted
from rlckpt.formats.plain import plain_int, plain_optional_int
from rlckpt.formats.spec import (
    SHA256_HEX,
    Anything,
    Bool,
    Const,
    Field,
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
    type_name,
)
from rlckpt.formats.versions import found_format, read_format, readable

__all__ = [
    "MAX_JSON_DEPTH",
    "SHA256_HEX",
    "Anything",
    "Bool",
    "Const",
    "Field",
    "Int",
    "Kind",
    "ListOf",
    "MapKey",
    "MapOf",
    "Nullable",
    "Number",
    "Obj",
    "Record",
    "Refusal",
    "Str",
    "Tuple",
    "field_path",
    "json_depth",
    "nested_deeper_than",
    "load_json",
    "plain_int",
    "plain_optional_int",
    "quoted",
    "found_format",
    "read_format",
    "readable",
    "type_name",
]
