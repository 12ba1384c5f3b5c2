"""Exclusivity: two (or more) writers of the same step, as threads or processes: exactly one commits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from rlckpt.errors import BundleExistsError
from rlckpt.store import BundleStore
from support.store_checks import make_intent_foreign


def attempt(store: BundleStore, step: int, tag: bytes) -> str:
    try:
        with store.begin(step) as txn:
            txn.write_bytes("who", tag)
            txn.write_bytes("payload", tag * 1000)
            txn.commit({"who": tag.decode()})
        return "committed"
    except BundleExistsError:
        return "refused"


def test_threads_writing_one_step_commit_exactly_once(store_location):
    url, options = store_location
    store = BundleStore(url, options)
    store.steps()  # connect once before the race
    barrier = threading.Barrier(4)
    results: dict[int, str] = {}

    def run(i: int) -> None:
        barrier.wait()
        results[i] = attempt(store, 9, b"t%d" % i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(results.values()) == ["committed", "refused", "refused", "refused"]
    winner = next(i for i, r in results.items() if r == "committed")
    bundle = store.open(9)
    bundle.verify()
    assert bundle.read_bytes("who") == b"t%d" % winner
    assert bundle.read_bytes("payload") == b"t%d" % winner * 1000


PROCESS_WRITER = textwrap.dedent(
    """
    import json, sys
    from rlckpt.errors import BundleExistsError
    from rlckpt.store import BundleStore
    url, options, tag = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3].encode()
    store = BundleStore(url, options)
    store.steps()  # connected and probed: the race starts at begin()
    print("ready", flush=True)
    assert sys.stdin.readline().strip() == "go"
    try:
        with store.begin(9) as txn:
            txn.write_bytes("who", tag)
            txn.write_bytes("payload", tag * 1000)
            txn.commit()
        print("committed", flush=True)
    except BundleExistsError:
        print("refused", flush=True)
    """
)


def test_processes_writing_one_step_commit_exactly_once(store_location):
    url, options = store_location
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PROCESS_WRITER, url, json.dumps(options or {}), f"p{i}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=dict(os.environ),
        )
        for i in range(2)
    ]
    for proc in procs:  # both interpreters up and connected before either may begin
        assert proc.stdout.readline().strip() == b"ready"
    for proc in procs:
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
    outs = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        outs.append(out.decode().strip())
    assert sorted(outs) == ["committed", "refused"]
    winner = outs.index("committed")
    bundle = BundleStore(url, options).open(9)
    bundle.verify()
    assert bundle.read_bytes("who") == b"p%d" % winner


def test_second_begin_of_a_step_being_written_is_refused_naming_the_holder(store_location):
    url, options = store_location
    store = BundleStore(url, options)
    with store.begin(3) as first:
        with pytest.raises(BundleExistsError, match=first.txid):
            store.begin(3)
        first.write_bytes("a", b"1")
        first.commit()
    store.open(3).verify()


def test_writer_whose_claim_was_taken_over_cannot_commit(store_location):
    url, options = store_location
    store = BundleStore(url, options)
    txn = store.begin(4)
    txn.write_bytes("a", b"1")
    make_intent_foreign(store, 4, age=7200)  # a writer elsewhere whose lease ran out, but is still running
    store.gc()
    with pytest.raises(BundleExistsError, match="lost its claim"):
        txn.commit()
    assert store.steps() == []


def test_listing_taken_before_a_commit_finished_does_not_make_the_bundle_look_corrupt(
    s3_run_url, s3_storage_options, monkeypatch
):
    """On S3 open() lists the step in parallel with reading COMMIT; a listing that predates the last
    upload of a concurrent commit must be re-taken, not reported as a missing file."""
    from rlckpt.store.backends import Listing

    store = BundleStore(s3_run_url, s3_storage_options)
    attempt(store, 1, b"a")
    real_list_files = store.backend.list_files
    calls = []

    def first_listing_is_early(path):
        calls.append(path)
        return Listing({}, {}) if len(calls) == 1 else real_list_files(path)

    monkeypatch.setattr(store.backend, "list_files", first_listing_is_early)
    assert store.open(1).read_bytes("who") == b"a"
    assert len(calls) == 2  # the early listing was refused, and a fresh one decided
