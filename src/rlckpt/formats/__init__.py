"""Record declarations: each record's format, fields and kinds stated once, one check per record, and
docs/formats.md rendered from them. Imports neither torch, Ray nor TransferQueue (the store uses it)."""

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
    "plain_int",
    "plain_optional_int",
    "found_format",
    "read_format",
    "readable",
    "type_name",
]
