"""What a failed collective of the Checkpointer's groups says: a peer that died (gloo saw its connection close)
is a RankDiedError naming the rank, one that did not come in time a RankTimeoutError naming the timeout, each
with gloo's own words but not its source path or advice. The messages are gloo's, as torch 2.13 raises them
(captured from two real gloo ranks: one SIGKILLed, one late); the real case runs in test_multi_rank.py."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from rlckpt.checkpointer.ranks import RankGroup
from rlckpt.errors import RankDiedError, RankGroupError, RankTimeoutError

CLOSED = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:4779. This is typically caused by a remote worker crashing. Check the logs of the remote worker "
    "before reporting an error. GLHF! \U0001f3d6\ufe0f"
)
RESET = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:11692: "
    "Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the application."
)
TIMED_OUT = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 60000ms "
    "for recv operation to complete"
)


def _failing(monkeypatch, message: str, rank: int = 0, world_size: int = 2) -> RankGroupError:
    def gather(*args, **kwargs):
        raise RuntimeError(message)

    monkeypatch.setattr(dist, "all_gather", gather)
    ranks = RankGroup(rank, world_size, save_group=object(), control_group=object(), timeout_s=60)
    with pytest.raises(RankGroupError) as caught:
        ranks.all_gather({"x": 1}, ranks.save_group, "gathering the receipts of step 8")
    return caught.value


@pytest.mark.parametrize("message", [CLOSED, RESET], ids=["closed", "reset"])
def test_a_peer_whose_connection_closed_is_reported_as_a_rank_that_died(monkeypatch, message):
    error = _failing(monkeypatch, message)
    assert isinstance(error, RankDiedError)
    text = str(error)
    assert text.startswith("rank 0 of 2: gathering the receipts of step 8: rank 1 died: its connection closed")
    assert "within" not in text  # not "did not reach the same call within 60s": it died
    assert "[127.0.0.1]:" in text and "pair.cc" not in text and "GLHF" not in text


def test_of_more_than_two_ranks_the_dead_one_is_not_guessed(monkeypatch):
    assert "a rank died" in str(_failing(monkeypatch, CLOSED, rank=1, world_size=4))


def test_a_peer_that_did_not_come_in_time_is_reported_with_the_timeout(monkeypatch):
    error = _failing(monkeypatch, TIMED_OUT, rank=1)
    assert isinstance(error, RankTimeoutError)
    assert "rank 0 did not reach the same call within 60s" in str(error)
    assert "(gloo: Timed out waiting 60000ms for recv operation to complete)" in str(error)


def test_another_failure_of_the_collective_says_what_gloo_said(monkeypatch):
    error = _failing(monkeypatch, "something else broke")
    assert type(error) is RankGroupError
    assert str(error).endswith("the collective failed (RuntimeError: something else broke)")
