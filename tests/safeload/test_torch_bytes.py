"""load_torch_bytes: a torch.save archive loads only if its pickle names rlckpt's allowed globals (read
with torch's own archive reader before anything unpickles it), then under torch.load(weights_only=True)."""

from __future__ import annotations

import collections
import io
import pickle
import pickletools

import pytest
import torch

from rlckpt.errors import UnsafeContentError
from rlckpt.safeload import load_storage_bytes, load_torch_bytes, save_torch_bytes
from support.forge import RunsCode, code_torch_save

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16]
DTYPES += [torch.int8, torch.uint8, torch.bool, torch.complex64, torch.uint16, torch.float8_e4m3fn]


def legacy_save(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer, _use_new_zipfile_serialization=False)
    return buffer.getvalue()


def test_tensors_of_every_dtype_and_plain_containers_load_back():
    value = {
        "tensors": [torch.arange(6).reshape(2, 3).to(dtype) for dtype in DTYPES],
        "view": torch.arange(10.0)[2:7],
        "parameter": torch.nn.Parameter(torch.ones(2)),
        "plain": [1, 2.5, None, "s", (True, -3), {"k": collections.OrderedDict(a=1)}],
        "torch values": [torch.Size([2, 3]), torch.float32, torch.device("cpu"), torch.strided],
    }
    loaded = load_torch_bytes(save_torch_bytes(value), "f.pt")
    assert all(torch.equal(a, b) for a, b in zip(loaded["tensors"], value["tensors"], strict=True))
    assert torch.equal(loaded["view"], value["view"]) and torch.equal(loaded["parameter"], value["parameter"])
    assert loaded["plain"] == value["plain"] and loaded["torch values"] == value["torch values"]


def test_an_archive_that_asks_for_a_foreign_global_is_refused_before_it_runs(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(UnsafeContentError, match=r"f\.pt: refused to unpickle: it asks for __builtin__\.exec"):
        load_torch_bytes(code_torch_save(marker), "f.pt")
    assert not marker.exists()


def test_a_file_in_torchs_legacy_format_is_refused_unread():
    with pytest.raises(UnsafeContentError, match="not a torch.save archive .*legacy formats are never loaded"):
        load_torch_bytes(legacy_save({"step": 1}), "f.pt")


def test_a_bare_pickle_is_refused_unread(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(UnsafeContentError, match="not a torch.save archive"):
        load_torch_bytes(pickle.dumps(RunsCode(marker)), "f.pt")
    assert not marker.exists()


def test_a_global_torchs_process_wide_allowlist_admits_is_refused_by_rlckpts_own_table():
    """tensordict (TransferQueue imports it) adds its classes to torch's weights-only allowlist for the
    whole process at import; rlckpt's table is its own."""
    from tensordict import TensorDict

    data = save_torch_bytes(TensorDict({"x": torch.zeros(2)}, batch_size=[2]))
    assert isinstance(torch.load(io.BytesIO(data), weights_only=True), TensorDict)  # torch alone lets it in
    with pytest.raises(UnsafeContentError, match=r"asks for tensordict\."):
        load_torch_bytes(data, "f.pt")


def test_a_plainly_pickled_tensors_storage_loads_as_a_storage():
    tensor = torch.arange(5, dtype=torch.bfloat16)
    blob = next(arg for op, arg, _ in pickletools.genops(pickle.dumps(tensor)) if op.name.endswith("BINBYTES"))
    storage = load_storage_bytes(blob, "s")
    assert torch.equal(torch.tensor([], dtype=torch.bfloat16).set_(storage), tensor)


def test_a_storage_blob_whose_pickles_ask_for_a_foreign_global_is_refused_before_it_runs(tmp_path):
    marker = tmp_path / "ran"
    blob = pickle.dumps(0x1950A86A20F9469CFC6C) + pickle.dumps(RunsCode(marker))  # magic number, then the payload
    with pytest.raises(UnsafeContentError, match="asks for builtins.exec"):
        load_storage_bytes(blob, "s")
    assert not marker.exists()
