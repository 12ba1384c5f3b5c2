"""A hypothesis state machine over begin (with and without reuse of unchanged files) / write / commit / abort /
crash / gc / copy that checks invariants 1-6 after every step, on local disk and on S3: payloads repeat, so
saves take files from the bundles before them, which retention then deletes."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from rlckpt.errors import BundleExistsError, InvalidPathError
from rlckpt.store import BundleStore, copy_bundle
from support.store_checks import debris, make_intent_foreign

STEPS = st.integers(min_value=0, max_value=3)
RELPATHS = st.sampled_from(["a", "dir/b", "dir/sub/c"])
DATA = st.one_of(st.sampled_from([b"", b"frozen" * 10, b"other" * 9]), st.binary(max_size=64))


def make_machine(base_url: str, options: dict | None, shared_fs: object) -> type[RuleBasedStateMachine]:
    class StoreMachine(RuleBasedStateMachine):
        @initialize()
        def fresh_store(self) -> None:
            self.store = BundleStore(f"{base_url}/ex-{uuid.uuid4().hex[:8]}", options, fs=shared_fs)
            self.committed: dict[int, dict[str, bytes]] = {}
            self.open: dict[int, tuple[object, dict[str, bytes]]] = {}
            self.crashed: set[int] = set()
            self.copy = BundleStore(f"{base_url}/copy-{uuid.uuid4().hex[:8]}", options, fs=shared_fs)
            self.copied: dict[int, dict[str, bytes]] = {}
            self.copied_txids: dict[int, str] = {}

        @rule(step=STEPS, reuse=st.booleans())
        def begin(self, step: int, reuse: bool) -> None:
            if step in self.committed or step in self.open or step in self.crashed:
                with pytest.raises(BundleExistsError):
                    self.store.begin(step, reuse=reuse)
                return
            self.open[step] = (self.store.begin(step, reuse=reuse), {})

        @precondition(lambda self: self.open)
        @rule(data=st.data(), relpath=RELPATHS, payload=DATA, compress=st.booleans())
        def write(self, data: st.DataObject, relpath: str, payload: bytes, compress: bool) -> None:
            step = data.draw(st.sampled_from(sorted(self.open)))
            txn, files = self.open[step]
            if relpath in files:
                with pytest.raises(InvalidPathError):
                    txn.write_bytes(relpath, payload)
                return
            txn.write_bytes(relpath, payload, compression="zstd" if compress else None)
            files[relpath] = payload

        @precondition(lambda self: self.open)
        @rule(data=st.data())
        def commit(self, data: st.DataObject) -> None:
            step = data.draw(st.sampled_from(sorted(self.open)))
            txn, files = self.open.pop(step)
            manifest = txn.commit({"step": step})
            assert sorted(manifest.files) == sorted(files)
            self.committed[step] = files

        @precondition(lambda self: self.open)
        @rule(data=st.data())
        def abort(self, data: st.DataObject) -> None:
            step = data.draw(st.sampled_from(sorted(self.open)))
            txn, _ = self.open.pop(step)
            txn.abort()

        @precondition(lambda self: self.open)
        @rule(data=st.data())
        def crash(self, data: st.DataObject) -> None:
            """The writer vanishes: no abort, its intent and data stay behind. It ran on another host a
            minute ago: within the default lease, so only a zero threshold declares it dead."""
            step = data.draw(st.sampled_from(sorted(self.open)))
            self.open.pop(step)
            make_intent_foreign(self.store, step, age=60)
            self.crashed.add(step)

        @rule(keep_last=st.sampled_from([None, 1, 2]))
        def gc_default(self, keep_last: int | None) -> None:
            """Default threshold: live and recently crashed transactions (our pid is alive) are kept."""
            report = self.store.gc(keep_last=keep_last)
            self._apply_retention(report, keep_last)
            open_txids = {t.txid for t, _ in self.open.values()}
            assert open_txids <= set(report.live)

        @precondition(lambda self: not self.open)
        @rule(keep_last=st.sampled_from([None, 1, 2]))
        def gc_everything_stale(self, keep_last: int | None) -> None:
            """With no transaction running, a zero threshold must leave nothing but committed bundles."""
            report = self.store.gc(keep_last=keep_last, stale_after=0)
            self._apply_retention(report, keep_last)
            self.crashed.clear()
            assert debris(self.store) == []

        def _apply_retention(self, report: object, keep_last: int | None) -> None:
            expected_deleted = sorted(self.committed)[:-keep_last] if keep_last else []
            assert report.deleted_steps == expected_deleted
            for step in expected_deleted:
                del self.committed[step]

        @precondition(lambda self: self.committed)
        @rule(data=st.data(), keep_last=st.sampled_from([None, 1]))
        def copy_with_reuse(self, data: st.DataObject, keep_last: int | None) -> None:
            """A committed bundle copied to another store, taking what it can from the copy's previous bundle;
            then that store's own retention."""
            step = data.draw(st.sampled_from(sorted(self.committed)))
            txid = self.store.open(step).manifest.txid
            if step in self.copied and self.copied_txids[step] != txid:  # deleted and saved anew since its copy
                with pytest.raises(BundleExistsError, match="holds another bundle"):
                    copy_bundle(self.store, step, self.copy, reuse=True)
            elif step in self.copied:
                assert copy_bundle(self.store, step, self.copy, reuse=True).already
            else:
                copy_bundle(self.store, step, self.copy, reuse=True)
                self.copied[step], self.copied_txids[step] = self.committed[step], txid
            deleted = self.copy.gc(keep_last=keep_last).deleted_steps
            assert deleted == (sorted(self.copied)[:-keep_last] if keep_last else [])
            for gone in deleted:
                del self.copied[gone], self.copied_txids[gone]

        @rule()
        def read_everything_back(self) -> None:
            for store, bundles in ((self.store, self.committed), (self.copy, self.copied)):
                for step, files in bundles.items():
                    bundle = store.open(step)
                    bundle.verify()
                    assert {rel: bundle.read_bytes(rel) for rel in bundle.manifest.files} == files

        @invariant()
        def only_committed_steps_are_visible(self) -> None:
            if hasattr(self, "store"):
                assert self.store.steps() == sorted(self.committed)

        def teardown(self) -> None:
            for txn, _ in getattr(self, "open", {}).values():
                txn.abort()

    return StoreMachine


def test_store_keeps_its_invariants_under_random_operations(store_location):
    url, options = store_location
    shared_fs = BundleStore(url, options).fs
    examples = 15 if options else 40
    run_state_machine_as_test(
        make_machine(url, options, shared_fs),
        settings=settings(
            max_examples=examples,
            stateful_step_count=12,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
            database=None,
        ),
    )
