"""docs/formats.md's section of one record, rendered from its declarations (so the docs cannot drift from
what the readers check): what it is, where it is kept, its fields (and those of every object inside it),
its formats' history, and what this rlckpt does with a newer one."""

from __future__ import annotations

from collections.abc import Sequence

from rlckpt.formats.spec import Obj, Record


def render_record(formats: Sequence[Record], *, newer_refusal: str | None = None, container: str = "") -> str:
    """The markdown section of one record, today's format last in `formats`.

    Args:
        newer_refusal: the message its reader gives a format newer than any of `formats` (shown as is).
        container: for a record versioned by the record that holds it, what that is ("run-bundle").
    """
    today = formats[-1]
    lines = [f"## {today.name[0].upper()}{today.name[1:]}", ""]
    if today.doc:
        lines += [today.doc, ""]
    lines += [f"- **Stored in** {today.stored_in}", f"- **Written by** {today.writer}"]
    lines.append(f"- **Format** {_format_line(today, container)}")
    lines.append(
        "- **Closed**: a key not below is refused"
        if today.closed
        else "- **Open**: keys not below are kept and not read"
    )
    lines.append("")
    lines += _tables(today.body, "")
    if len(formats) > 1 or today.version_key is not None:
        lines += _history(formats, container)
    if newer_refusal is not None:
        numbers = [r.format for r in formats if r.format is not None]
        reads = f"format {numbers[0]}" if len(numbers) == 1 else f"formats {numbers[0]}-{numbers[-1]}"
        lines += [f"This rlckpt reads {reads}. A newer one is refused: `{newer_refusal}`", ""]
    return "\n".join(lines)


def _format_line(record: Record, container: str) -> str:
    if record.version_key is not None:
        return f"`{record.constant}` = {record.format}, stored under `{record.version_key}`"
    if container:
        return f"none of its own: the {container} format says which shape it has"
    return "none of its own"


def _tables(obj: Obj, path: str) -> list[str]:
    """The table of `obj`'s fields, then one per object inside it (depth first)."""
    lines = ["| field | type | required | meaning |", "|---|---|---|---|"]
    nested: list[tuple[str, Obj]] = []
    for field in obj.fields:
        required = "yes" if field.required else "no"
        lines.append(f"| `{field.name}` | {_cell(field.kind.describe())} | {required} | {_cell(field.doc)} |")
        for suffix, inner in field.kind.objects():
            nested.append((f"{path}{'.' if path else ''}{field.name}{suffix}", inner))
    lines.append("")
    for where, inner in nested:
        closed = "closed" if inner.closed else "open"
        lines += [f"`{where}`: {inner.name} object, {closed}", ""]
        lines += _tables(inner, where)
    return lines


def _history(formats: Sequence[Record], container: str) -> list[str]:
    head = f"{container} format" if container and formats[-1].version_key is None else "format"
    lines = [f"| {head} | written by | what changed |", "|---|---|---|"]
    for record in formats:
        lines.append(f"| {record.format} | {_cell(record.written_by)} | {_cell(record.changes)} |")
    lines.append("")
    return lines


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
