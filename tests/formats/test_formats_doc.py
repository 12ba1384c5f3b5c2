"""docs/formats.md states each record as its readers check it: its sections are rendered from the
declarations, and every format constant is the number its record declares."""

from __future__ import annotations

from pathlib import Path

from rlckpt.checkpoint import layout
from rlckpt.checkpointer import record as checkpointer_record
from rlckpt.controller import loop_state
from rlckpt.dataplane import snapshot_records
from rlckpt.replay import records as replay_records
from rlckpt.store.records import intent, manifest_formats, run_record
from support.format_docs import SECTIONS, generated_part, render

DOC = Path(__file__).resolve().parents[2] / "docs" / "formats.md"


def test_docs_formats_md_holds_the_sections_rendered_from_the_declarations():
    # On a mismatch: PYTHONPATH=src python -m support.format_docs docs/formats.md
    assert generated_part(DOC.read_text()) == render()


def test_every_format_constant_is_named_for_its_record_and_is_the_number_it_declares():
    constants = {
        "MANIFEST_FORMAT": manifest_formats.MANIFEST_FORMAT,
        "COMMIT_FORMAT": manifest_formats.COMMIT_FORMAT,
        "INTENT_FORMAT": intent.INTENT_FORMAT,
        "RUN_RECORD_FORMAT": run_record.RUN_RECORD_FORMAT,
        "RUN_BUNDLE_FORMAT": layout.RUN_BUNDLE_FORMAT,
        "ROWS_FORMAT": snapshot_records.ROWS_FORMAT,
        "REPLAY_INDEX_FORMAT": replay_records.REPLAY_INDEX_FORMAT,
        "LOADER_STATE_FORMAT": loop_state.LOADER_STATE_FORMAT,
        "CHECKPOINTER_BUNDLE_FORMAT": checkpointer_record.CHECKPOINTER_BUNDLE_FORMAT,
    }
    declared = {s.formats[-1].constant: s.formats[-1].format for s in SECTIONS if s.formats[-1].version_key}
    assert declared == constants


def test_every_versioned_record_refuses_a_newer_format_as_written_by_a_newer_rlckpt():
    for section in SECTIONS:
        if section.formats[-1].version_key is not None:
            assert "was written by a newer rlckpt" in (section.refusal() or ""), section.formats[-1].name
