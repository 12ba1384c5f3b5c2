"""Extra pieces: saved in the first form that holds them exactly (JSON, else a checked torch archive of tensors
and plain values), read back without running code from the bundle; anything that would need pickle is refused
at the save, and a piece file that is not one of the two forms at the restore."""

import io
import pickle
import random

import numpy as np
import pytest
import torch

from rlckpt.checkpointer.pieces import decode_piece, encode_piece, encode_pieces, piece_path
from rlckpt.errors import ExtraPieceError, UnsafeContentError


def _round_trip(value):
    piece = encode_piece("p", value)
    return piece.kind, decode_piece(piece.kind, piece.data, "extra/p")


def test_plain_data_is_saved_as_json_and_comes_back_equal():
    value = {"epoch": 3, "position": 128, "name": "loader", "rate": 0.5, "done": False, "order": [1, 2], "x": None}
    assert _round_trip(value) == ("json", value)


def test_nan_and_infinite_floats_come_back_from_json():
    kind, back = _round_trip({"loss": float("nan"), "best": float("inf")})
    assert kind == "json" and back["best"] == float("inf") and back["loss"] != back["loss"]


def test_a_tuple_is_kept_a_tuple_by_a_torch_archive():
    state = random.getstate()
    kind, back = _round_trip(state)
    assert kind == "pt" and back == state and isinstance(back, tuple)
    random.setstate(back)  # exactly what Python's random takes back


def test_int_keys_are_kept_by_a_torch_archive():
    assert _round_trip({0: "a", 1: "b"}) == ("pt", {0: "a", 1: "b"})


def test_tensors_in_plain_containers_come_back_bitwise():
    value = {"rng": torch.get_rng_state(), "buffer": [torch.randn(3, 4), torch.arange(5)], "seen": 7}
    kind, back = _round_trip(value)
    assert kind == "pt"
    assert torch.equal(back["rng"], value["rng"]) and torch.equal(back["buffer"][0], value["buffer"][0])
    assert back["seen"] == 7


def test_a_numpy_array_is_refused_at_the_save_naming_where_it_is():
    with pytest.raises(ExtraPieceError, match=r"piece loader\['order'\]\[1\]: a numpy.ndarray"):
        encode_piece("loader", {"order": [1, np.arange(3)]})


def test_a_custom_object_is_refused_at_the_save():
    class Position:
        pass

    with pytest.raises(ExtraPieceError, match="Position"):
        encode_piece("loader", {"position": Position()})


@pytest.mark.parametrize("name", ["", "a/b", "../x", "x" * 65, "rng.pt", 3])
def test_a_piece_name_that_is_not_a_plain_name_is_refused(name):
    with pytest.raises(ExtraPieceError, match="piece name"):
        encode_piece(name, 1)


def test_pieces_must_be_given_as_a_mapping():
    with pytest.raises(ExtraPieceError, match="mapping"):
        encode_pieces([("a", 1)], "extra")


class Boom:
    """Unpickles to a call of `exec` (a builtin nothing replaces: Ray swaps `print` for its own once imported)."""

    def __reduce__(self):
        return (exec, ("print('code ran from a bundle')",))


def test_a_torch_archive_naming_a_global_outside_the_tensor_allowlist_is_refused_and_nothing_runs(capsys):
    buffer = io.BytesIO()
    torch.save({"x": Boom()}, buffer)
    with pytest.raises(UnsafeContentError, match="asks for __builtin__.exec"):
        decode_piece("pt", buffer.getvalue(), "step 4: extra/loader.pt")
    assert "code ran" not in capsys.readouterr().out


def test_a_plain_pickle_is_never_read_as_a_piece():
    with pytest.raises(UnsafeContentError, match="not a torch.save archive"):
        decode_piece("pt", pickle.dumps({"a": 1}), "step 4: extra/loader.pt")


def test_a_piece_of_another_kind_is_refused():
    with pytest.raises(UnsafeContentError, match="only json and pt"):
        decode_piece("pkl", pickle.dumps(1), "step 4: extra/loader.pkl")


def test_json_that_does_not_parse_is_refused():
    with pytest.raises(UnsafeContentError, match="not JSON"):
        decode_piece("json", b"\xff{", "step 4: extra/loader.json")


def test_pieces_live_under_extra_and_a_ranks_own_under_its_rank():
    assert piece_path("loader", "json") == "extra/loader.json"
    assert piece_path("rng", "pt", rank=3) == "extra/rank3/rng.pt"


def test_a_json_piece_nested_800_deep_is_refused_at_the_restore_in_one_line():
    with pytest.raises(UnsafeContentError, match="extra/loader.json: .*nested deeper than 64 levels") as refused:
        decode_piece("json", b"[" * 800 + b"]" * 800, "step 4: extra/loader.json")
    assert "\n" not in str(refused.value)


def test_a_piece_nested_deeper_than_a_restore_reads_is_refused_at_the_save():
    deep: list = []
    for _ in range(64):
        deep = [deep]
    with pytest.raises(ExtraPieceError, match="piece 'p' is nested deeper than 64 levels"):
        encode_piece("p", deep)
    assert _round_trip(deep[0]) == ("json", deep[0])  # 64 levels: saved and read back


@pytest.mark.parametrize("container", [list, tuple], ids=["json-piece", "pt-piece"])
def test_a_piece_nested_past_the_recursion_limit_is_refused_with_its_reason(container):
    deep = container()
    for _ in range(5000):
        deep = container([deep])
    with pytest.raises(ExtraPieceError, match="piece 'p' is nested deeper than 64 levels"):
        encode_piece("p", deep)
