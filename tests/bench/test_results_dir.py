"""benchmarks/results holds the current result of each benchmark and one HISTORY.md of earlier figures."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def test_results_hold_at_most_30_files():
    assert len([p for p in RESULTS.iterdir() if p.is_file()]) <= 30


def test_every_report_but_the_history_has_its_json_beside_it():
    reports = {p.stem for p in RESULTS.glob("*.md")} - {"HISTORY"}
    assert sorted(r for r in reports if not (RESULTS / f"{r}.json").exists()) == []


def test_earlier_figures_are_in_one_history():
    assert (RESULTS / "HISTORY.md").read_text().startswith("# Earlier benchmark figures")
