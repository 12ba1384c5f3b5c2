"""The globals scan reads every global a pickle names from its opcodes, and refuses what it cannot read
for certain; the allowlist unpickler reaches nothing outside its table. Neither runs the pickle."""

from __future__ import annotations

import collections
import pickle
import struct

import pytest

from rlckpt.errors import UnsafeContentError
from rlckpt.safeload import UnreadablePickle, pickle_globals, restricted_loads
from support.forge import code_pickle


def short_str(text: str) -> bytes:
    return b"\x8c" + struct.pack("<B", len(text)) + text.encode()  # SHORT_BINUNICODE


PROTO4, POP, STACK_GLOBAL, STOP = b"\x80\x04", b"0", b"\x93", b"."


def binput(index: int) -> bytes:
    return b"q" + struct.pack("<B", index)


def binget(index: int) -> bytes:
    return b"h" + struct.pack("<B", index)


def names(data: bytes) -> list[str]:
    return [g.dotted for g in pickle_globals(data)]


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_every_global_of_a_pickle_is_read_in_any_protocol(protocol):
    data = pickle.dumps([collections.OrderedDict(), collections.Counter(), collections.OrderedDict], protocol=protocol)
    assert set(names(data)) == {"collections.OrderedDict", "collections.Counter"}


def test_a_module_name_memoized_once_and_fetched_again_is_read():
    data = pickle.dumps([collections.OrderedDict, collections.Counter], protocol=4)
    assert b"h" in data  # the second global fetches "collections" from the memo
    assert names(data) == ["collections.OrderedDict", "collections.Counter"]


def test_a_memo_slot_overwritten_with_another_module_is_read_as_the_new_one():
    data = PROTO4 + short_str("collections") + binput(0) + POP + short_str("posix") + binput(0) + POP
    data += binget(0) + short_str("system") + STACK_GLOBAL + STOP
    assert names(data) == ["posix.system"]


def test_a_stack_global_whose_operands_are_not_the_last_two_literals_is_refused_not_guessed():
    """The stack holds posix, system here: a scan that took the last two strings pushed would read
    collections.system."""
    data = PROTO4 + short_str("posix") + short_str("collections") + POP + short_str("system") + STACK_GLOBAL + STOP
    with pytest.raises(UnreadablePickle, match="not literals"):
        pickle_globals(data)


def test_a_global_named_through_the_extension_registry_is_refused():
    with pytest.raises(UnreadablePickle, match="EXT1"):
        pickle_globals(PROTO4 + b"\x82\xf0" + STOP)


def test_bytes_that_are_no_pickle_are_refused():
    with pytest.raises(UnreadablePickle, match="not a readable pickle"):
        pickle_globals(b"\x80\x04\xff")


def test_the_allowlist_unpickler_refuses_a_global_before_calling_it(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(UnsafeContentError, match=r"f\.pkl: refused to unpickle: it asks for builtins\.exec"):
        restricted_loads(code_pickle(marker), {}, "f.pkl")
    assert not marker.exists()


def test_the_allowlist_unpickler_loads_what_its_table_allows():
    allowed = {("collections", "OrderedDict"): collections.OrderedDict}
    value = {"a": [1, 2.5, None, "x", (True,)], "b": collections.OrderedDict(k=1)}
    assert restricted_loads(pickle.dumps(value, protocol=5), allowed, "f.pkl") == value


def test_the_allowlist_unpickler_refuses_persistent_ids():
    class WithIds(pickle.Pickler):
        def persistent_id(self, obj):
            return "storage" if obj == "x" else None

    import io

    buffer = io.BytesIO()
    WithIds(buffer).dump(["x"])
    with pytest.raises(UnsafeContentError, match="not a readable pickle"):
        restricted_loads(buffer.getvalue(), {}, "f.pkl")
