"""Who holds a step: liveness of intents on this host and elsewhere, intents that are unreadable or absurd,
and a claimant's intent that no one can see half written."""

from __future__ import annotations

import dataclasses
import os
import socket
import time

import pytest

from rlckpt.errors import BundleExistsError
from rlckpt.store import BundleStore, Intent
from rlckpt.store.records.intent import CLOCK_SKEW, process_start
from rlckpt.store.records.manifest import canonical_json
from support.store_checks import debris, plant, save_sample


@pytest.fixture
def store(store_location):
    url, options = store_location
    return BundleStore(url, options)


def plant_intent(store, step, **changes):
    """An intent for `step` as some writer wrote it (by default: this process, now)."""
    intent = dataclasses.replace(Intent.new(step, f"planted-{step}"), **changes)
    plant(store, f"_txn/step_{step}.json", intent.to_bytes())
    return intent


def states(store):
    return {e.step: e.state for e in store.entries()}


# --- liveness ---------------------------------------------------------------------------------------


def test_gc_with_zero_stale_after_leaves_a_live_same_host_transaction_alone(store):
    save_sample(store, 1)
    with store.begin(2) as live:
        live.write_bytes("a", b"1" * 100)
        report = store.gc(stale_after=0)
        assert report.live == [live.txid]
        assert report.removed == []
        live.write_bytes("b", b"2")
        live.commit()
    store.open(2).verify()


def test_writer_on_this_host_whose_pid_now_belongs_to_another_process_is_stale(store):
    me = os.getpid()
    plant_intent(store, 3, pid=me, pid_start=(process_start(me) or 0) + 1)  # same pid, other start time
    assert states(store) == {3: "stale"}
    save_sample(store, 3)  # taken over
    assert store.steps() == [3]


def test_intent_dated_in_the_future_on_another_host_is_not_live_forever(store):
    plant_intent(store, 3, host="clock-ahead", started=time.time() + 365 * 86400)
    report = store.gc(stale_after=0)  # every other-host transaction is presumed dead at zero
    assert report.live == []
    assert debris(store) == []


def test_future_start_is_measured_from_the_objects_modification_time():
    ahead = Intent.new(3, "t")
    ahead = dataclasses.replace(ahead, host="clock-ahead", started=time.time() + 365 * 86400)
    now = time.time()
    assert ahead.stale_reason(3600, mtime=now - 60, now=now) is None  # written a minute ago: alive
    assert ahead.stale_reason(3600, mtime=now - 7200, now=now) is not None  # two hours ago: past its lease
    assert "future" in (ahead.stale_reason(3600, mtime=None, now=now) or "")  # no other evidence: not believed
    assert ahead.stale_reason(3600, mtime=None, now=ahead.started - CLOCK_SKEW / 2) is None  # small skew is fine


def test_fresh_unreadable_intent_is_not_taken_over(store):
    plant(store, "_txn/step_3.json", b"")  # what a claimant's intent looked like for a moment, before
    with pytest.raises(BundleExistsError, match="unreadable intent"):
        store.begin(3)
    assert states(store) == {3: "writing"}


def test_unreadable_intent_older_than_the_lease_is_taken_over(store_location):
    url, options = store_location
    impatient = BundleStore(url, options, stale_after=0)
    plant(impatient, "_txn/step_3.json", b"{not json")
    save_sample(impatient, 3)
    assert impatient.steps() == [3]


def test_claimant_intent_is_never_visible_half_written(tmp_path, monkeypatch):
    """A second writer that looks at the step while the first is writing its intent must not see an empty
    (unreadable, hence stale) intent and take the step over: exactly one of them holds it."""
    store = BundleStore(str(tmp_path / "run"))
    store.steps()
    real_write = os.write
    outcome = {}

    def write_then_race(fd, data):
        if "second" not in outcome and "_txn" in os.readlink(f"/proc/self/fd/{fd}"):
            outcome["second"] = None  # (its own intent write must not race again)
            try:  # the first claimant is between creating its intent file and filling it
                outcome["second"] = store.begin(5)
            except BundleExistsError as exc:
                outcome["second"] = exc
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write_then_race)
    try:
        outcome["first"] = store.begin(5)
    except BundleExistsError as exc:
        outcome["first"] = exc
    monkeypatch.setattr(os, "write", real_write)
    winners = [v for v in outcome.values() if not isinstance(v, BaseException)]
    assert len(winners) == 1, outcome
    holder = store.read_intent(5)
    assert holder is not None and holder.txid == winners[0].txid
    winners[0].abort()


# --- absurd values ----------------------------------------------------------------------------------


def test_intent_with_an_absurd_pid_is_unreadable_not_a_crash(store):
    save_sample(store, 1)
    absurd = canonical_json(
        {
            "format": 1,
            "host": socket.gethostname(),
            "pid": 2**70,
            "pid_start": None,
            "started": time.time(),
            "step": 3,
            "txid": "x",
        }
    )
    plant(store, "_txn/step_3.json", absurd)
    entries = store.entries()
    assert {e.step: e.state for e in entries} == {1: "committed", 3: "writing"}
    assert "intent: pid: expected int in 1..2147483647" in next(e.detail for e in entries if e.step == 3)
    store.gc()
    with pytest.raises(BundleExistsError, match="intent: pid: expected int in 1..2147483647"):
        store.begin(3)
    assert store.latest() == 1
    store.open(1).verify()


def test_intent_naming_a_path_as_its_txid_cannot_make_gc_delete_outside_the_run(tmp_path):
    store = BundleStore(str(tmp_path / "run"))
    save_sample(store, 1)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    hostile = canonical_json(
        {
            "format": 1,
            "host": "elsewhere",
            "pid": 1,
            "pid_start": None,
            "started": 0.0,
            "step": 3,
            "txid": "../../victim",
        }
    )
    plant(store, "_txn/step_3.json", hostile)  # a dead writer's intent, if its txid were believed
    report = store.gc(stale_after=0)
    assert (victim / "precious.txt").read_text() == "keep me"
    assert report.removed == [f"{store.root}/_txn/step_3.json"]
    assert store.steps() == [1]
