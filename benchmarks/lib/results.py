"""What a benchmark's `run` does with its results: measure (or, with --replot, read a JSON measured before), write
the JSON, render its markdown beside it and print it."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def measure_and_report(
    args: argparse.Namespace,
    measure: Callable[[argparse.Namespace], dict[str, Any]],
    markdown: Callable[[dict[str, Any]], str],
) -> int:
    """`args.out` (the JSON) and its .md from `measure(args)`, or from `args.replot` without measuring."""
    from rlckpt.bench.report import write_json

    out = Path(args.out)
    document = json.loads(Path(args.replot).read_text()) if args.replot else measure(args)
    if not args.replot:
        write_json(out, document)
    text = markdown(document)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text)
    print(text)
    print(f"wrote {out} and {out.with_suffix('.md')}", file=sys.stderr)
    return 0
