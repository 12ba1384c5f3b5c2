"""Names from the store are printed escaped: a newline or an ANSI escape in a file name, key, txid or
host cannot forge an output line or drive the terminal. --json stays lossless."""

from __future__ import annotations

import logging
import time

import pytest

from rlckpt.cli._common import configure_logging, printable
from rlckpt.store.records.intent import Intent

# A carriage return and "erase line" forge a line as well as a newline does; moto refuses keys with
# a newline (404 on PUT), so the file name shared by both backends uses CR, and the local-only tests
# below use newlines.
EVIL_FILE = "evil\r\x1b[2KCORRUPT: forged line \x1b[31mred\x1b[0m"
EVIL_TXID = "tx\r\x1b[2Jcleared"
EVIL_HOST = "host\x1b]0;title\x07\u202egnp.exe"


def _raw_controls(text: str) -> list[str]:
    """Control and other non-printable characters in `text`, line breaks aside."""
    return sorted({c for line in text.split("\n") for c in line if not c.isprintable()})


def _extra_file_in_step_1(run) -> None:
    run.commit(1)
    run.put_raw(b"x", "step_1", EVIL_FILE)


def _live_intent_of_step_7(run, txid: str = "tx-7") -> None:
    """A transaction held by a writer on another host that started a moment ago: live, left alone."""
    intent = Intent(step=7, txid=txid, host=EVIL_HOST, pid=1, started=time.time())
    run.put_raw(intent.to_bytes(), "_txn", "step_7.json")


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("a\nb", "a\\nb"),
        ("\x1b[31mred", "\\x1b[31mred"),
        ("cr\rtab\tnul\x00del\x7f", "cr\\rtab\\tnul\\x00del\\x7f"),
        ("c1\x85 line-sep\u2028 bidi\u202e", "c1\\x85 line-sep\\u2028 bidi\\u202e"),
        ("undecodable\udcff", "undecodable\\udcff"),
        ("plain é 日本 /a b/", "plain é 日本 /a b/"),
    ],
)
def test_printable_escapes_every_non_printable_character_and_nothing_else(text, shown):
    assert printable(text) == shown


def test_verify_escapes_the_name_of_an_extra_file_in_its_verdict(run, cli):
    _extra_file_in_step_1(run)
    result = cli("verify", run.url, "--step", "1", *run.options_args())
    assert result.code == 1
    assert result.err.count("\n") == 1 and _raw_controls(result.err) == []
    assert printable(EVIL_FILE) in result.err


def test_ls_shows_why_a_step_is_corrupt_with_the_file_name_escaped(run, cli):
    _extra_file_in_step_1(run)
    result = cli("ls", run.url, *run.options_args())
    assert result.code == 0
    header, row = result.out.splitlines()
    assert "DETAIL" in header and row.split()[:2] == ["1", "corrupt"]
    assert printable(EVIL_FILE) in row and _raw_controls(result.out) == []


def test_ls_shows_who_holds_a_transaction_with_the_host_escaped(run, cli):
    _live_intent_of_step_7(run)
    result = cli("ls", run.url, *run.options_args())
    header, row = result.out.splitlines()
    assert row.split()[:2] == ["7", "writing"]
    assert "tx-7" in row and printable(EVIL_HOST) in row
    assert _raw_controls(result.out) == []


def test_ls_json_keeps_names_exactly_as_stored(run, cli):
    _live_intent_of_step_7(run)
    (record,) = cli("ls", run.url, "--json", *run.options_args()).json()
    assert record["txid"] == "tx-7" and EVIL_HOST in record["detail"]


def test_intent_whose_txid_has_control_characters_is_unreadable_and_shown_escaped(run, cli):
    _live_intent_of_step_7(run, txid=EVIL_TXID)  # a txid names directories: it must be a plain name
    result = cli("ls", run.url, *run.options_args())
    header, row = result.out.splitlines()
    assert row.split()[:2] == ["7", "writing"]  # unreadable but fresh: it still holds the step
    assert "txid: expected txid" in row and _raw_controls(result.out) == []
    dry = cli("gc", run.url, "--dry-run", *run.options_args())
    assert dry.code == 0 and _raw_controls(dry.out) == []


def test_gc_escapes_the_paths_it_removes(tmp_path, cli):
    staging = tmp_path / "run" / "_tmp" / "dead\n\x1b[31mtx"
    staging.mkdir(parents=True)
    result = cli("gc", str(tmp_path / "run"), "--dry-run")
    assert f"would remove {tmp_path}/run/_tmp/dead\\n\\x1b[31mtx" in result.out.splitlines()
    assert _raw_controls(result.out) == []


def test_error_line_escapes_the_names_in_the_message(tmp_path, cli):
    blocker = tmp_path / "file\n\x1b[31mnamed"
    blocker.write_text("not a directory")
    result = cli("ls", str(blocker / "run"))
    assert result.code == 3
    assert result.err.count("\n") == 1 and _raw_controls(result.err) == []
    assert printable(str(blocker)) in result.err


def test_log_lines_escape_names_too(capsys):
    configure_logging(0)
    logging.getLogger("rlckpt.store").warning("could not remove intent %s", f"/run/_txn/{EVIL_TXID}")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and _raw_controls(err) == [] and printable(EVIL_TXID) in err
