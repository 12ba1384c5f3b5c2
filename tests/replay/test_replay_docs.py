"""docs/dataplane.md's replay-buffer API and replay-index fields are the code's."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

from rlckpt.replay import ReplayBuffer
from rlckpt.replay.records import GROUP, REPLAY_INDEX

DOC = (Path(__file__).resolve().parents[2] / "docs" / "dataplane.md").read_text()


def _documented_api() -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """The methods of the ``class ReplayBuffer:`` block of docs/dataplane.md, by name."""
    block = re.search(r"```python\n(class ReplayBuffer:.*?)```", DOC, re.S)
    assert block, "docs/dataplane.md has no `class ReplayBuffer:` block"
    (cls,) = ast.parse(block.group(1)).body
    assert isinstance(cls, ast.ClassDef)
    return {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}


def _shape(args: ast.arguments) -> tuple[list[str], list[str], int]:
    """Positional names, keyword-only names, how many positional ones have defaults."""
    return [a.arg for a in args.posonlyargs + args.args], [a.arg for a in args.kwonlyargs], len(args.defaults)


def test_every_method_dataplane_md_shows_has_the_codes_parameters_and_is_async_where_the_code_is():
    for name, documented in _documented_api().items():
        method = getattr(ReplayBuffer, name)
        real = ast.parse(inspect.cleandoc("\n" + inspect.getsource(method))).body[0]
        assert isinstance(real, ast.FunctionDef | ast.AsyncFunctionDef)
        assert _shape(documented.args) == _shape(real.args), name
        assert isinstance(documented, ast.AsyncFunctionDef) == inspect.iscoroutinefunction(method), name


def test_dataplane_md_names_every_field_of_the_replay_index_record():
    paragraph = DOC[DOC.index("- The state dict is the **replay index** record") :]
    paragraph = paragraph[: paragraph.index("\n- ")]
    named = set(re.findall(r"`([a-z_]+)`", paragraph))
    assert {f.name for f in REPLAY_INDEX.body.fields} | {f.name for f in GROUP.fields} <= named
