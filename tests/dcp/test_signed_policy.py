"""BundleStorageReader with a verify key loads only a policy checkpoint that key signed for the run: a
bundle committed without the key (same files, intact digests) is not read, and the newest one it loads
with step=None is the newest signed one. Local disk and S3, one body."""

from __future__ import annotations

import pytest
import torch.distributed.checkpoint as dcp

from rlckpt.dcp import BundleStorageReader, BundleStorageWriter
from rlckpt.errors import ShardedCheckpointError, UnsignedBundleError
from rlckpt.store import BundleStore, SigningKey
from support.dcp_ranks import bitwise_equal, flat_tensors, plain_policy, policy_state, quiet_dcp_warnings
from support.forge import forge_step

quiet_dcp_warnings()
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def state(seed: int) -> dict:
    return policy_state(*plain_policy(64, 2, seed=seed))


@pytest.fixture
def run(store_location):
    """(url, options, key) of a run whose step 1 was saved by a store with the signing key, and whose
    step 2 someone without the key committed from step 1's files."""
    url, options = store_location
    key = SigningKey.generate()
    dcp.save(state(0), storage_writer=BundleStorageWriter(BundleStore(url, options, signing_key=key), step=1))
    forge_step(BundleStore(url, options), 1, 2, {})
    return url, options, key


def test_the_newest_bundle_a_reader_with_the_verify_key_loads_is_the_newest_signed_one(run):
    url, options, key = run
    reader = BundleStorageReader(url, step=None, storage_options=options, verify_key=key.public)
    assert reader.step == 1
    loaded = state(9)
    dcp.load(loaded, storage_reader=reader)
    assert bitwise_equal(flat_tensors(loaded), flat_tensors(state(0))) == []


def test_a_reader_with_the_verify_key_refuses_an_unsigned_step(run):
    url, options, key = run
    with pytest.raises(UnsignedBundleError, match="step 2 at .*: unsigned"):
        BundleStorageReader(url, step=2, storage_options=options, verify_key=key.public)


def test_a_verify_key_beside_a_store_that_has_its_own_is_refused_not_ignored(run):
    url, options, key = run
    with pytest.raises(ShardedCheckpointError, match="verify_key and run_id go with a run URL"):
        BundleStorageReader(BundleStore(url, options), step=1, verify_key=key.public)
