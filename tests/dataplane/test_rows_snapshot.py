"""The rows snapshot format: what goes in comes out bit for bit, nothing but tensors is ever built from
a file, and a restore of it obeys the same guards as TransferQueue's own load."""

from __future__ import annotations

import asyncio
import json
import struct

import pytest
import torch

from rlckpt.dataplane.memory import InMemoryDataPlane, InMemoryStore
from rlckpt.dataplane.rows_snapshot import decode_rows, encode_rows, restore_snapshot, rows_metadata
from rlckpt.errors import DataPlaneError, RestoreRefusedError

KEYS = ["g1:0", "g1:1", "g2:0"]


def sample_rows() -> dict[str, list[torch.Tensor]]:
    return {
        "completion": [torch.arange(5), torch.arange(7), torch.arange(3)],  # ragged rows are fine
        "logprobs": [torch.randn(5), torch.randn(7), torch.randn(3)],
        "half": [torch.randn(2, dtype=torch.bfloat16) for _ in KEYS],
        "flag": [torch.tensor([True]), torch.tensor([False]), torch.tensor([True])],
    }


def test_rows_round_trip_bit_for_bit():
    rows = sample_rows()
    keys, back = decode_rows(encode_rows(KEYS, rows), "t")
    assert keys == KEYS and set(back) == set(rows)
    for name, column in rows.items():
        for a, b in zip(column, back[name], strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b)


def _with_header(data: bytes, edit) -> bytes:
    """The same rows file with its JSON header edited (lengths fixed up)."""
    head_len = struct.unpack_from("<Q", data, 8)[0]
    header = json.loads(data[16 : 16 + head_len])
    edit(header)
    head = json.dumps(header).encode()
    return data[:8] + struct.pack("<Q", len(head)) + head + data[16 + head_len :]


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda data: b"NOTROWS!" + data[8:], "not a rows file"),
        (lambda data: data[:12], "too short for a rows file"),
        (lambda data: data[:-1], "does not fit"),
        (
            lambda data: _with_header(data, lambda h: h["fields"]["completion"][0].__setitem__(0, "object")),
            r"rows header: fields\['completion'\]\[0\]\[0\]: expected one of 'float64'",
        ),
        (lambda data: _with_header(data, lambda h: h["fields"]["completion"][0].__setitem__(2, 10**9)), "does not fit"),
        (lambda data: _with_header(data, lambda h: h["keys"].pop()), "one entry per key"),
    ],
    ids=["magic", "short", "truncated-payload", "unknown-dtype", "offset-outside", "keys-missing"],
)
def test_a_damaged_rows_file_is_refused_naming_it(damage, match):
    with pytest.raises(DataPlaneError, match=f"rows-1.bin.*{match}"):
        decode_rows(damage(encode_rows(KEYS, sample_rows())), "rows-1.bin")


def _snapshot(tmp_path, user_metadata=None):
    (tmp_path / "rows-000000.bin").write_bytes(encode_rows(KEYS, sample_rows()))
    (tmp_path / "metadata.json").write_bytes(rows_metadata("rollouts", ["rows-000000.bin"], user_metadata or {"k": 1}))
    return tmp_path


def test_restore_puts_the_rows_back_and_returns_the_user_metadata(tmp_path):
    plane = InMemoryStore()
    meta = asyncio.run(restore_snapshot(InMemoryDataPlane(plane), _snapshot(tmp_path)))
    assert meta == {"k": 1}
    assert sorted(plane.rows["rollouts"]) == KEYS
    assert torch.equal(plane.rows["rollouts"]["g1:1"]["completion"], torch.arange(7))


def test_restore_onto_a_plane_another_client_wrote_is_refused(tmp_path):
    plane = InMemoryStore()
    asyncio.run(InMemoryDataPlane(plane).put_samples("other", ["x:0"], {"a": torch.zeros(1, 1)}))
    with pytest.raises(RestoreRefusedError, match="already holds data"):
        asyncio.run(restore_snapshot(InMemoryDataPlane(plane), _snapshot(tmp_path)))


class _FailingPuts(InMemoryDataPlane):
    """A plane whose puts fail after the first: a restore that fails half way."""

    async def put_samples(self, partition_id, keys, fields, tags=None):
        if self.store.rows:
            raise OSError("the data plane went away")
        await super().put_samples(partition_id, keys, fields, tags)


def test_a_failed_rows_restore_closes_the_client_to_further_loads(tmp_path):
    snapshot = _snapshot(tmp_path)
    client = _FailingPuts(InMemoryStore())
    with pytest.raises(RestoreRefusedError, match="load failed"):
        asyncio.run(restore_snapshot(client, snapshot))
    with pytest.raises(RestoreRefusedError, match="earlier load .* failed"):
        asyncio.run(restore_snapshot(client, snapshot))


def test_a_damaged_rows_file_is_refused_before_any_row_goes_back(tmp_path):
    snapshot = _snapshot(tmp_path)
    (snapshot / "rows-000001.bin").write_bytes(b"garbage")
    document = json.loads((snapshot / "metadata.json").read_text())
    document["rlckpt_rows"]["files"].append("rows-000001.bin")
    (snapshot / "metadata.json").write_text(json.dumps(document))
    plane = InMemoryStore()
    with pytest.raises(DataPlaneError, match="rows-000001.bin: too short for a rows file"):
        asyncio.run(restore_snapshot(InMemoryDataPlane(plane), snapshot))
    assert plane.is_empty()  # the good file before it was not restored either


@pytest.mark.parametrize("name", ["../rows-000000.bin", "/etc/passwd", "rows-0.bin"])
def test_a_rows_file_name_that_is_not_a_plain_rows_name_is_refused(tmp_path, name):
    snapshot = _snapshot(tmp_path)
    document = json.loads((snapshot / "metadata.json").read_text())
    document["rlckpt_rows"]["files"] = [name]
    (snapshot / "metadata.json").write_text(json.dumps(document))
    with pytest.raises(DataPlaneError, match=r"rows snapshot: files\[0\]: expected `rows-NNNNNN.bin`"):
        asyncio.run(restore_snapshot(InMemoryDataPlane(InMemoryStore()), snapshot))


def test_metadata_keeps_transferqueues_layout(tmp_path):
    document = json.loads(rows_metadata("rollouts", ["a"], {"index_digest": "d"}))
    assert document["user_metadata"] == {"index_digest": "d"} and document["storage_saved"] is True
