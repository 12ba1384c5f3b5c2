"""The same outage, the same error, everywhere: once a store that opened fine goes away (the S3 server
stops; local disk denies access), every read of an open Bundle and every write of a running transaction
or participant raises StoreUnavailableError naming the store and what was being done, like every
BundleStore method, never a raw botocore or OS error.

On S3 the server goes away behind a TCP forwarder (support.outage); the store is built with one
attempt per request and a 2 s connect timeout (`config_kwargs`, ONE_QUICK_ATTEMPT), so each refusal
comes at once instead of after botocore's retries."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from rlckpt.errors import StoreUnavailableError
from support.outage import VanishingStore, vanishing_store
from support.store_checks import save_sample


@pytest.fixture
def location(store_location) -> Iterator[VanishingStore]:
    """A store with one committed bundle that goes away at `location.away()`."""
    with vanishing_store(*store_location) as vanishing:
        save_sample(vanishing.store, 1)
        yield vanishing


def unavailable(location: VanishingStore, action: Callable[[], Any]) -> StoreUnavailableError:
    """Run `action` with the store gone; the StoreUnavailableError it must raise."""
    with location.away(), pytest.raises(StoreUnavailableError) as info:
        action()
    assert str(info.value).startswith(f"store {location.store.url} unavailable while ")
    return info.value


# --- reads of an open bundle ------------------------------------------------------------------------


def _read_bytes(bundle, out):
    bundle.read_bytes("train_dataloader.pt")


def _open(bundle, out):
    bundle.open("policy/weights.bin").close()


def _get_file(bundle, out):
    bundle.get_file("policy/optim.bin", out / "optim.bin")


def _get_dir(bundle, out):
    bundle.get_dir("policy", out / "policy")


def _verify(bundle, out):
    bundle.verify()


@pytest.mark.parametrize("read", [_read_bytes, _open, _get_file, _get_dir, _verify], ids=lambda f: f.__name__[1:])
def test_every_read_of_an_open_bundle_is_store_unavailable_once_the_store_is_gone(location, tmp_path, read):
    bundle = location.store.open(1)
    error = unavailable(location, lambda: read(bundle, tmp_path / "out"))
    assert "step 1" in str(error)


# --- writes of a running transaction and of a participant ------------------------------------------


def _write_bytes(txn, source):
    txn.write_bytes("a.bin", b"a" * 1000)


def _stream(txn, source):
    with txn.open("b.bin", compression="zstd") as stream:
        stream.write(b"b" * 1000)
    txn.commit()  # a stream's file finishes (its upload) in the background: the commit waits for it


def _put_file(txn, source):
    txn.put_file("c.bin", source)
    txn.commit()


def _commit(txn, source):
    txn.commit()


def _abort(txn, source):
    txn.abort()


@pytest.mark.parametrize("write", [_write_bytes, _stream, _put_file, _commit, _abort], ids=lambda f: f.__name__[1:])
def test_every_write_of_a_running_transaction_is_store_unavailable_once_the_store_is_gone(location, tmp_path, write):
    source = tmp_path / "source.bin"
    source.write_bytes(b"c" * 1000)
    txn = location.store.begin(2)
    txn.write_bytes("first.bin", b"f" * 100)
    error = unavailable(location, lambda: write(txn, source))
    assert "step 2" in str(error)


@pytest.mark.parametrize("moment", ["write", "seal"])
def test_a_participant_sees_the_store_gone_as_store_unavailable(location, moment):
    txn = location.store.begin(2)
    part = location.store.participant(txn.handle(), "rank0")
    if moment == "seal":
        part.write_bytes("r0.bin", b"0" * 1000)
    error = unavailable(location, part.seal if moment == "seal" else lambda: part.write_bytes("r0.bin", b"0" * 1000))
    assert "step 2" in str(error)
