"""Test helpers and pytest plugins shared by the suite, benchmarks and scripts."""
