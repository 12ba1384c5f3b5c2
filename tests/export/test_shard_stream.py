"""The safetensors files rlckpt writes itself (ShardStream: the header first, then each tensor's bytes straight
from its memory) read back with safetensors' own loader, bit for bit, for every dtype and odd shape."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from rlckpt.errors import ExportError
from rlckpt.export.consolidate import TensorInfo
from rlckpt.export.safetensors_out import DTYPE_NAMES, ShardStream

SHAPES = [(), (0,), (1,), (3, 5), (2, 0, 4), (7, 1, 3)]


def sample(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    count = 1
    for dim in shape:
        count *= dim
    raw = torch.randint(0, 256, (count * dtype.itemsize,), generator=gen, dtype=torch.uint8)
    return raw.view(dtype).reshape(shape) if count else torch.empty(shape, dtype=dtype)


def write(path, tensors: dict[str, torch.Tensor], metadata=None):
    slots = [TensorInfo(name, t.dtype, tuple(t.shape)) for name, t in tensors.items()]
    stream = ShardStream(str(path), slots, metadata or {"format": "pt"})
    for name, tensor in tensors.items():
        stream.write(name, tensor)
    return stream.finish()


@pytest.mark.parametrize("dtype", sorted(DTYPE_NAMES, key=str), ids=str)
def test_every_dtype_and_shape_reads_back_bit_for_bit_with_safetensors(tmp_path, dtype):
    tensors = {f"t{i}": sample(dtype, shape, i) for i, shape in enumerate(SHAPES)}
    if dtype == torch.bool:
        tensors = {name: t.view(torch.uint8).remainder(2).bool() for name, t in tensors.items()}
    write(tmp_path / "a.safetensors", tensors)
    loaded = load_file(tmp_path / "a.safetensors")
    assert sorted(loaded) == sorted(tensors)
    for name, tensor in tensors.items():
        got = loaded[name]
        assert got.dtype == tensor.dtype and got.shape == tensor.shape
        assert torch.equal(got.reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8))


def test_a_non_contiguous_tensor_is_written_as_its_values(tmp_path):
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    write(tmp_path / "t.safetensors", {"t": base.t()})
    assert torch.equal(load_file(tmp_path / "t.safetensors")["t"], base.t())


def test_the_metadata_and_the_digest_are_the_files(tmp_path):
    import blake3

    written = write(tmp_path / "m.safetensors", {"x": torch.ones(3)}, {"format": "pt", "rlckpt_step": "7"})
    with safe_open(tmp_path / "m.safetensors", framework="pt") as f:
        assert f.metadata() == {"format": "pt", "rlckpt_step": "7"}
    data = (tmp_path / "m.safetensors").read_bytes()
    assert written.bytes == len(data) and written.blake3 == blake3.blake3(data).hexdigest()


def test_a_tensor_that_is_not_the_next_slot_is_refused(tmp_path):
    slots = [TensorInfo("a", torch.float32, (2,)), TensorInfo("b", torch.float32, (2,))]
    stream = ShardStream(str(tmp_path / "o.safetensors"), slots, {})
    with pytest.raises(ExportError, match="is not the next tensor"):
        stream.write("b", torch.zeros(2))
    with pytest.raises(ExportError, match="is not the next tensor"):
        stream.write("a", torch.zeros(3))
    stream.write("a", torch.zeros(2))
    with pytest.raises(ExportError, match="never written"):
        stream.finish()
    stream.abandon()
