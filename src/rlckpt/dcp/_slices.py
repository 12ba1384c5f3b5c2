"""Where `.metadata` says each item lies, checked before anything is sliced; and what a failed item is called.

DCP's reader slices each item out of its shard file by the `_StorageInfo(relative_path, offset, length)`
that `.metadata` records, and hands the slice to `torch.load`. A bundle's digests prove that `.metadata` is
what its writer wrote, not that it is sane: a forged one with an offset past the end, a negative offset or
an absurd length reaches torch as `EOFError('')`, "negative seek value" or a zip error naming no file. So
every record is held against its file's size in the manifest first, and no two items may share bytes
(DCP's writer appends each item once): a refusal then names the file and the item.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from torch.distributed.checkpoint.metadata import MetadataIndex

from rlckpt.errors import CorruptBundleError
from rlckpt.store import Bundle, join_relpath

# How much of what torch raised for an item a refusal quotes: its first sentence, at most this long. Some
# run to a page, and torch's weights-only refusal goes on to advise `weights_only=False`, which would
# run whatever a forged bundle holds.
_CAUSE_CHARS = 160


def item_name(index: MetadataIndex) -> str:
    """`'optim.state.0.weight.exp_avg'`, with `chunk at [64, 0]` for one chunk of a sharded tensor."""
    chunk = f" chunk at {list(index.offset)}" if index.offset is not None and any(index.offset) else ""
    return f"item {index.fqn!r}{chunk}"


def check_slices(
    storage_data: Mapping[MetadataIndex, Any],
    planned: Iterable[MetadataIndex],
    bundle: Bundle,
    prefix: str,
    metadata_relpath: str,
) -> None:
    """CorruptBundleError unless every planned item has a record, every item's (offset, length) lies inside
    its shard file (the manifest's logical size) and no two items of one file overlap.

    Args:
        storage_data: `.metadata`'s records, item -> `_StorageInfo` (relative to `prefix`).
        planned: the items a load plan will read.
        bundle: the bundle they were read from, whose manifest holds each file's size.
    """
    where = f"step {bundle.step} at {bundle.url}: {metadata_relpath}"
    for index in planned:
        if index not in storage_data:
            raise CorruptBundleError(f"{where} describes {item_name(index)} but records no bytes for it")
    by_file: dict[str, list[tuple[int, int, MetadataIndex]]] = {}
    for index, info in storage_data.items():
        relpath = join_relpath(prefix, info.relative_path)
        entry = bundle.manifest.files.get(relpath)
        if entry is None:
            raise CorruptBundleError(f"{where} puts {item_name(index)} in {relpath}, which the bundle does not hold")
        offset, length = info.offset, info.length
        if not (_is_int(offset) and _is_int(length)):
            raise CorruptBundleError(
                f"{where} puts {item_name(index)} at offset {offset!r}, length {length!r} of {relpath}: not integers"
            )
        if offset < 0 or length < 0 or offset + length > entry.logical_size:
            raise CorruptBundleError(
                f"{where} puts {item_name(index)} at offset {offset}, length {length} of {relpath}, "
                f"outside its {entry.logical_size} bytes"
            )
        by_file.setdefault(relpath, []).append((offset, length, index))
    for relpath, items in by_file.items():
        items.sort(key=lambda item: (item[0], item[1]))
        for (offset, length, index), (next_offset, next_length, next_index) in zip(items, items[1:], strict=False):
            if offset + length > next_offset:
                raise CorruptBundleError(
                    f"{where} puts {item_name(index)} (offset {offset}, length {length}) and {item_name(next_index)} "
                    f"(offset {next_offset}, length {next_length}) on the same bytes of {relpath}"
                )


def unloadable_item(
    bundle: Bundle, relpath: str, index: MetadataIndex, info: Any, cause: Exception
) -> CorruptBundleError:
    """The refusal of an item whose checked bytes torch (or the planner) could not load, naming file and item."""
    said = str(cause).strip().splitlines()[0].split(". ")[0] if str(cause).strip() else ""
    if len(said) > _CAUSE_CHARS:
        said = said[:_CAUSE_CHARS] + "…"
    return CorruptBundleError(
        f"step {bundle.step} at {bundle.url}: {item_name(index)} in {relpath} (offset {info.offset}, length "
        f"{info.length}) does not load: {type(cause).__name__}{': ' + said if said else ''}"
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
