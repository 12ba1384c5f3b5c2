"""How the tensors of a bundle are named in an export: the bundle's own names (DCP's flattened keys, e.g.
`model.0.weight`) by default, rewritten by prefix rules (`model.=`) and then by the caller's hook."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rlckpt.errors import ExportError

Rename = Callable[[str], "str | None"]


@dataclass(frozen=True)
class PrefixRule:
    """`old=new`: a name that starts with `old` starts with `new` instead (`model.=` drops `model.`)."""

    old: str
    new: str

    @classmethod
    def parse(cls, text: str) -> PrefixRule:
        """A rule from its `OLD=NEW` form; ExportError naming the text otherwise."""
        old, sep, new = text.partition("=")
        if not sep or not old:
            raise ExportError(f"a rename rule is OLD=NEW with a non-empty OLD (e.g. 'model.='), got {text!r}")
        return cls(old, new)


def renamer(rules: Sequence[PrefixRule | str] = (), hook: Rename | None = None) -> Rename:
    """One function from bundle names to export names: the first prefix rule that matches, then `hook` (which may
    return None to leave a tensor out)."""
    parsed = [rule if isinstance(rule, PrefixRule) else PrefixRule.parse(rule) for rule in rules]

    def rename(name: str) -> str | None:
        for rule in parsed:
            if name.startswith(rule.old):
                name = rule.new + name[len(rule.old) :]
                break
        return hook(name) if hook is not None else name

    return rename


def export_names(names: Sequence[str], rename: Rename) -> dict[str, str]:
    """bundle name -> export name for every tensor kept; ExportError when two land on one name or one on ''."""
    out: dict[str, str] = {}
    taken: dict[str, str] = {}
    for name in names:
        new = rename(name)
        if new is None:
            continue
        if not isinstance(new, str) or not new:
            raise ExportError(f"the rename gives {name!r} the name {new!r}: a tensor needs a non-empty str name")
        if new in taken:
            raise ExportError(f"the rename gives {taken[new]!r} and {name!r} the same name {new!r}")
        taken[new] = name
        out[name] = new
    return out
