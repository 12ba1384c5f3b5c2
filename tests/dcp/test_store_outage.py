"""BundleStorageReader/Writer when the store goes away mid-load or mid-save: DCP reports the rank's failure
as StoreUnavailableError (inside its CheckpointException), the error every store call raises for an
outage, not a raw botocore or OS error. Local disk and S3 with the same body (tests/store/test_store_outage.py
says how the store goes away)."""

from __future__ import annotations

import contextlib

import pytest
import torch.distributed.checkpoint as dcp

from rlckpt.dcp import BundleStorageReader, BundleStorageWriter
from rlckpt.errors import StoreUnavailableError
from support.dcp_ranks import plain_policy, policy_state, quiet_dcp_warnings
from support.outage import vanishing_store

quiet_dcp_warnings()
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

WIDTH, DEPTH = 192, 2


def state(seed: int) -> dict:
    model, optim = plain_policy(WIDTH, DEPTH, seed=seed)
    return policy_state(model, optim)


def raised_inside(excinfo, error: type[BaseException]) -> BaseException:
    failures = getattr(excinfo.value, "failures", {})
    found = [err for err, _tb in failures.values() if isinstance(err, error)]
    assert found, f"no {error.__name__} among {failures}"
    return found[0]


@pytest.fixture
def vanishing(store_location):
    with vanishing_store(*store_location) as gone:
        yield gone


def test_a_load_whose_store_goes_away_fails_as_store_unavailable(vanishing):
    dcp.save(state(0), storage_writer=BundleStorageWriter(vanishing.store, step=1))
    reader = BundleStorageReader(vanishing.store, step=1)  # opened, `.metadata` read and checked
    with vanishing.away(), pytest.raises(dcp.CheckpointException) as excinfo:
        dcp.load(state(1), storage_reader=reader)
    assert "step 1" in str(raised_inside(excinfo, StoreUnavailableError))


def test_a_save_whose_store_goes_away_after_it_began_fails_as_store_unavailable(vanishing, monkeypatch):
    begin = vanishing.store.begin
    with contextlib.ExitStack() as outage:

        def begin_then_lose_the_store(step, **kwargs):
            txn = begin(step, **kwargs)
            outage.enter_context(vanishing.away())
            return txn

        monkeypatch.setattr(vanishing.store, "begin", begin_then_lose_the_store)
        with pytest.raises(dcp.CheckpointException) as excinfo:
            dcp.save(state(0), storage_writer=BundleStorageWriter(vanishing.store, step=1))
    assert "step 1" in str(raised_inside(excinfo, StoreUnavailableError))
