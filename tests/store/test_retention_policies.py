"""Retention rules (store/upkeep/retention.py): the K newest, every N-th step forever, the K best by a metric the
run recorded in the manifest, and the caller's holds. A bundle any rule keeps is kept; the newest bundle
that verifies always is; a corrupt one is never deleted nor counted."""

from __future__ import annotations

import pytest

from rlckpt.store import BundleStore, Retention
from support.store_checks import corrupt_file, save_sample

REWARD = {1: 0.1, 2: 0.9, 3: 0.5, 4: 0.8, 5: 0.2, 6: 0.3}


@pytest.fixture
def store(store_location):
    """Bundles 1-6, each recording its reward (REWARD) and a loss of 1 - reward."""
    url, options = store_location
    s = BundleStore(url, options)
    for step, reward in REWARD.items():
        save_sample(s, step, metadata={"metrics": {"reward": reward, "loss": 1 - reward}})
    return s


def gc(store: BundleStore, **rules) -> tuple[list[int], list[int]]:
    """gc with these rules; (kept, deleted), after checking the store holds exactly what was kept."""
    report = store.gc(retention=Retention(**rules))
    assert store.steps() == sorted(report.kept_steps + report.corrupt_steps)
    return report.kept_steps, report.deleted_steps


def test_keep_every_keeps_each_multiple_of_n_beside_the_newest(store):
    assert gc(store, keep_last=1, keep_every=4) == ([4, 6], [1, 2, 3, 5])


def test_keep_best_keeps_the_bundles_of_highest_metric_and_the_newest(store):
    assert gc(store, keep_best=2, metric="reward") == ([2, 4, 6], [1, 3, 5])


def test_lower_is_better_keeps_the_bundles_of_lowest_metric(store):
    assert gc(store, keep_best=2, metric="loss", lower_is_better=True) == ([2, 4, 6], [1, 3, 5])


def test_rules_keep_the_union_of_what_each_keeps(store):
    assert gc(store, keep_last=2, keep_every=3, keep_best=1, metric="reward") == ([2, 3, 5, 6], [1, 4])


def test_a_corrupt_best_bundle_is_not_counted_and_never_deleted(store):
    corrupt_file(store, 2, "policy/weights.bin", "flip")
    report = store.gc(retention=Retention(keep_best=2, metric="reward"))
    assert report.kept_steps == [3, 4, 6]  # the next best (3) takes the place of the corrupt 2
    assert report.corrupt_steps == [2]
    assert report.deleted_steps == [1, 5]


def test_the_newest_good_bundle_is_kept_whatever_the_rules(store):
    corrupt_file(store, 6, "policy/weights.bin", "flip")
    kept, deleted = gc(store, keep_best=1, metric="reward")
    assert kept == [2, 5]  # 5: the newest that verifies, though its reward is the second lowest
    assert deleted == [1, 3, 4]


def test_a_bundle_without_the_metric_is_not_ranked(store_location):
    url, options = store_location
    s = BundleStore(url, options)
    save_sample(s, 1, metadata={"metrics": {"reward": 0.5}})
    save_sample(s, 2, metadata={"metrics": {"loss": 0.1}})
    save_sample(s, 3, metadata={"metrics": {"reward": "high"}})
    save_sample(s, 4, metadata={"metrics": {"reward": 0.2}})
    assert gc(s, keep_best=3, metric="reward") == ([1, 4], [2, 3])


def test_holds_are_kept_and_say_why(store):
    report = store.gc(retention=Retention(keep_last=1, holds={3: "not yet replicated"}))
    assert (report.kept_steps, report.deleted_steps) == ([3, 6], [1, 2, 4, 5])
    assert report.kept_reasons == {3: "not yet replicated", 6: "one of the 1 newest good bundles"}


def test_a_dry_run_is_the_plan_the_real_run_applies(store):
    rules = Retention(keep_last=1, keep_every=2, keep_best=1, metric="reward")
    dry = store.gc(retention=rules, dry_run=True)
    assert store.steps() == [1, 2, 3, 4, 5, 6]
    real = store.gc(retention=rules)
    assert (dry.kept_steps, dry.deleted_steps) == (real.kept_steps, real.deleted_steps) == ([2, 4, 6], [1, 3, 5])


def test_without_a_rule_no_bundle_is_deleted(store):
    assert gc(store, holds={2: "held"}) == ([1, 2, 3, 4, 5, 6], [])


@pytest.mark.parametrize(
    ("rules", "refusal"),
    [
        ({"keep_last": 0}, "keep_last must be an int >= 1"),
        ({"keep_every": True}, "keep_every must be an int >= 1"),
        ({"keep_best": 2}, "keep_best and metric go together"),
        ({"metric": "reward"}, "keep_best and metric go together"),
        ({"keep_best": 1, "metric": ""}, "metric must be a non-empty name"),
    ],
)
def test_malformed_rules_are_refused(rules, refusal):
    with pytest.raises(ValueError, match=refusal):
        Retention(**rules)


def test_keep_last_and_a_retention_together_are_refused(store):
    with pytest.raises(ValueError, match="not both"):
        store.gc(keep_last=1, retention=Retention(keep_last=2))
