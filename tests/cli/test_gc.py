"""`rlckpt gc`: --dry-run reports and removes nothing; a real run removes debris and old bundles only."""

from __future__ import annotations

from rlckpt.store import BundleStore
from support.store_checks import declare_writers_dead


def _states(cli, run):
    return [(r["step"], r["state"]) for r in cli("ls", run.url, "--json", *run.options_args()).json()]


def _begin(run, step):
    """A transaction in progress: data and intent written, not yet committed nor aborted."""
    tx = run.store().begin(step)
    tx.write_bytes("partial.bin", b"p" * 500)
    return tx


def _abandon(run, step):
    """A transaction whose writer process died: its data and intent stay behind."""
    tx = _begin(run, step)
    declare_writers_dead(run.store())
    return tx


def test_gc_dry_run_lists_debris_and_removes_nothing(run, cli):
    run.commit(1)
    _abandon(run, 2)
    before = _states(cli, run)
    result = cli("gc", run.url, "--dry-run", "--stale-after", "0", *run.options_args())
    assert result.code == 0
    assert "would remove" in result.out and "step_2" in result.out
    assert _states(cli, run) == before


def test_gc_removes_a_dead_transaction_and_keeps_committed_bundles(run, cli):
    run.commit(1)
    _abandon(run, 2)
    result = cli("gc", run.url, "--stale-after", "0", "--json", *run.options_args())
    assert result.code == 0
    assert result.json()["removed"]
    assert _states(cli, run) == [(1, "committed")]


def test_gc_leaves_a_live_transaction_alone(run, cli):
    run.commit(1)
    tx = _begin(run, 2)
    try:
        result = cli("gc", run.url, "--json", *run.options_args())
        assert result.json()["live"] == [tx.txid]
        assert _states(cli, run) == [(1, "committed"), (2, "writing")]
    finally:
        tx.abort()


def test_gc_keep_last_deletes_older_bundles_only_when_not_dry_run(run, cli):
    for step in (1, 2, 3):
        run.commit(step)
    dry = cli("gc", run.url, "--keep-last", "1", "--dry-run", *run.options_args())
    assert "would remove committed step 1" in dry.out and "would remove committed step 2" in dry.out
    assert [s for s, _ in _states(cli, run)] == [1, 2, 3]
    real = cli("gc", run.url, "--keep-last", "1", *run.options_args())
    assert real.code == 0
    assert _states(cli, run) == [(3, "committed")]


def test_gc_refuses_keep_last_zero_on_the_command_line(run, cli):
    result = cli("gc", run.url, "--keep-last", "0", *run.options_args())
    assert result.code == 64
    assert "--keep-last" in result.err


def test_gc_deletes_nothing_through_a_symlinked_tmp_dir_and_says_why(tmp_path, cli):
    """Local disk: retention renames a doomed bundle into `_tmp/` first; a `_tmp` that is a symlink to a
    directory elsewhere is refused (the skip names it), and what it points to is left as it was."""
    url = str(tmp_path / "run")
    for step in (1, 2):
        with BundleStore(url).begin(step) as tx:
            tx.write_bytes("weights.bin", b"w" * 100)
            tx.commit()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "run" / "_tmp").rmdir()
    (tmp_path / "run" / "_tmp").symlink_to(elsewhere)
    result = cli("gc", url, "--keep-last", "1")
    assert result.code == 0
    assert f"skipped {url}/step_1: failed (IrregularFileError: {url}/_tmp is a symlink" in result.out
    assert list(elsewhere.iterdir()) == []
    assert [r["step"] for r in cli("ls", url, "--json").json()] == [1, 2]
