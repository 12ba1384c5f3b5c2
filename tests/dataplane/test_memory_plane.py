"""InMemoryDataPlane: the DataPlaneClient contract and both restore-guard layers, in-process."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rlckpt.dataplane import InMemoryDataPlane
from rlckpt.errors import DataPlaneError, MissingSamplesError, RestoreRefusedError

P = "rollouts"


def run(coro):
    return asyncio.run(coro)


def rows(n: int, offset: int = 0) -> dict[str, torch.Tensor]:
    base = torch.arange(n, dtype=torch.int64) + offset
    return {
        "prompt": base[:, None] * 10 + torch.arange(3),
        "logprobs": base[:, None].float() / 7 + torch.zeros(4),
        "reward": base.float(),
    }


def keys(n: int, group: str = "g0") -> list[str]:
    return [f"{group}:{i}" for i in range(n)]


def test_get_returns_dense_rows_in_requested_order():
    plane = InMemoryDataPlane()
    run(plane.put_samples(P, keys(4), rows(4)))
    got = run(plane.get_samples(P, ["g0:3", "g0:0"]))
    expected = rows(4)
    for name in expected:
        assert torch.equal(got[name], expected[name][[3, 0]])


def test_put_accepts_a_list_of_per_row_tensors():
    plane = InMemoryDataPlane()
    run(plane.put_samples(P, keys(2), {"completion": [torch.tensor([1, 2]), torch.tensor([3, 4])]}))
    assert torch.equal(run(plane.get_samples(P, keys(2)))["completion"], torch.tensor([[1, 2], [3, 4]]))


def test_put_refuses_ragged_rows_naming_the_field():
    plane = InMemoryDataPlane()
    with pytest.raises(DataPlaneError, match="completion"):
        run(plane.put_samples(P, keys(2), {"completion": [torch.tensor([1]), torch.tensor([3, 4])]}))


def test_put_refuses_a_row_count_that_differs_from_the_keys():
    plane = InMemoryDataPlane()
    with pytest.raises(DataPlaneError, match="reward"):
        run(plane.put_samples(P, keys(3), {"reward": torch.zeros(2)}))


def test_put_on_existing_keys_adds_a_column():
    plane = InMemoryDataPlane()
    run(plane.put_samples(P, keys(2), rows(2)))
    run(plane.put_samples(P, keys(2), {"advantages": torch.tensor([0.5, -0.5])}))
    got = run(plane.get_samples(P, keys(2), ["advantages", "reward"]))
    assert torch.equal(got["advantages"], torch.tensor([0.5, -0.5]))
    assert torch.equal(got["reward"], rows(2)["reward"])


def test_missing_keys_raise_naming_each_missing_key():
    plane = InMemoryDataPlane()
    run(plane.put_samples(P, keys(2), rows(2)))
    with pytest.raises(MissingSamplesError) as info:
        run(plane.get_samples(P, ["g0:0", "g9:1", "g9:2"]))
    assert "g9:1" in str(info.value) and "g9:2" in str(info.value)


def test_get_of_a_field_not_written_on_every_row_is_an_error():
    plane = InMemoryDataPlane()
    run(plane.put_samples(P, keys(2), rows(2)))
    run(plane.put_samples(P, ["g0:0"], {"advantages": torch.tensor([1.0])}))
    with pytest.raises(DataPlaneError, match="advantages"):
        run(plane.get_samples(P, keys(2), ["advantages"]))


def test_clear_removes_only_the_given_rows_and_list_is_sorted():
    plane = InMemoryDataPlane()
    run(plane.put_samples(P, keys(3, "g1") + keys(3, "g0"), rows(6)))
    run(plane.clear_samples(P, keys(3, "g1")))
    assert run(plane.list_sample_ids(P)) == ["g0:0", "g0:1", "g0:2"]
    assert run(plane.list_sample_ids("other")) == []


def test_snapshot_round_trip_restores_rows_and_returns_metadata(tmp_path):
    source = InMemoryDataPlane()
    run(source.put_samples(P, keys(4), rows(4)))
    run(source.save_checkpoint(tmp_path / "snap", {"step": 3, "digest": "abc"}))
    target = InMemoryDataPlane()
    assert run(target.load_checkpoint(tmp_path / "snap")) == {"step": 3, "digest": "abc"}
    got = run(target.get_samples(P, keys(4)))
    for name, value in rows(4).items():
        assert torch.equal(got[name], value)


def test_snapshot_metadata_must_be_json(tmp_path):
    with pytest.raises(DataPlaneError, match="JSON"):
        run(InMemoryDataPlane().save_checkpoint(tmp_path / "snap", {"bad": object()}))


def test_snapshot_metadata_nested_past_the_recursion_limit_is_refused_with_its_reason(tmp_path):
    deep: dict = {}
    for _ in range(5000):
        deep = {"a": deep}
    with pytest.raises(DataPlaneError, match="nested deeper than 63 levels"):
        run(InMemoryDataPlane().save_checkpoint(tmp_path / "snap", deep))
    assert not (tmp_path / "snap").exists()


def test_load_is_refused_after_a_data_operation_through_the_same_client(tmp_path):
    source = InMemoryDataPlane()
    run(source.put_samples(P, keys(1), rows(1)))
    run(source.save_checkpoint(tmp_path / "snap", {}))
    target = InMemoryDataPlane()
    run(target.get_samples(P, []))  # an empty read is not a data operation
    run(target.put_samples("scratch", ["k"], {"x": torch.zeros(1)}))
    run(target.clear_samples("scratch", ["k"]))
    with pytest.raises(RestoreRefusedError, match="data operations"):
        run(target.load_checkpoint(tmp_path / "snap"))


def test_load_is_refused_when_another_client_wrote_to_the_shared_plane(tmp_path):
    source = InMemoryDataPlane()
    run(source.put_samples(P, keys(1), rows(1)))
    run(source.save_checkpoint(tmp_path / "snap", {}))
    restorer = InMemoryDataPlane()
    writer = InMemoryDataPlane(restorer.store)
    run(writer.put_samples(P, keys(1), rows(1)))
    assert not restorer.touched
    with pytest.raises(RestoreRefusedError, match="already holds"):
        run(restorer.load_checkpoint(tmp_path / "snap"))


def test_emptied_partitions_still_block_a_restore(tmp_path):
    source = InMemoryDataPlane()
    run(source.save_checkpoint(tmp_path / "snap", {}))
    restorer = InMemoryDataPlane()
    writer = InMemoryDataPlane(restorer.store)
    run(writer.put_samples(P, keys(1), rows(1)))
    run(writer.clear_samples(P, keys(1)))
    with pytest.raises(RestoreRefusedError):
        run(restorer.load_checkpoint(tmp_path / "snap"))


def test_a_failed_load_leaves_the_client_unusable_for_loads(tmp_path):
    good = InMemoryDataPlane()
    run(good.save_checkpoint(tmp_path / "snap", {}))
    (tmp_path / "broken").mkdir()
    client = InMemoryDataPlane()
    with pytest.raises(RestoreRefusedError, match="failed"):
        run(client.load_checkpoint(tmp_path / "broken"))
    with pytest.raises(RestoreRefusedError, match="earlier load"):
        run(client.load_checkpoint(tmp_path / "snap"))


def test_a_second_load_through_the_same_client_is_refused(tmp_path):
    run(InMemoryDataPlane().save_checkpoint(tmp_path / "snap", {}))
    client = InMemoryDataPlane()
    run(client.load_checkpoint(tmp_path / "snap"))
    with pytest.raises(RestoreRefusedError, match="already restored"):
        run(client.load_checkpoint(tmp_path / "snap"))
