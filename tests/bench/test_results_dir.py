"""benchmarks/results holds the current result of each benchmark and one HISTORY.md of earlier figures."""

from __future__ import annotations

from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
RESULTS = BENCHMARKS / "results"


def test_results_hold_one_result_per_benchmark_at_most():
    """The current result of each benchmark and nothing older: no more results than there are benchmarks (an
    earlier figure goes to HISTORY.md, not beside its successor)."""
    stems = {p.stem for p in RESULTS.iterdir() if p.is_file()} - {"HISTORY"}
    scripts = [p for p in BENCHMARKS.glob("*.py") if p.name != "__init__.py"]
    assert len(stems) <= len(scripts)


def test_a_result_is_its_json_its_report_and_at_most_one_plot():
    for path in RESULTS.iterdir():
        assert path.is_file() and path.suffix in (".json", ".md", ".png"), path.name


def test_every_report_but_the_history_has_its_json_beside_it():
    reports = {p.stem for p in RESULTS.glob("*.md")} - {"HISTORY"}
    assert sorted(r for r in reports if not (RESULTS / f"{r}.json").exists()) == []


def test_earlier_figures_are_in_one_history():
    assert (RESULTS / "HISTORY.md").read_text().startswith("# Earlier benchmark figures")
