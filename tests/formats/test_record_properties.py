"""Every record rlckpt writes, broken one field at a time, is refused by its own reader with the package's
error naming the record and the field; and every value its declaration describes passes.

The valid records are the real writers' output (a save through ``save_bundle``, ``Intent.new``,
``LoopState.to_state``, ``encode_rows``, a signed commit of the store, and the bundles the old code wrote in
tests/fixtures); hypothesis picks where to break them and with what."""

from __future__ import annotations

import asyncio
import copy
import json
import struct
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlckpt.checkpoint import codec, layout
from rlckpt.checkpoint.run_format import read_run_bundle
from rlckpt.checkpoint.save import SaveParticipants, StagedBytes, save_bundle
from rlckpt.controller.loop_state import LoopState
from rlckpt.dataplane.memory import InMemoryDataPlane
from rlckpt.dataplane.rows_snapshot import check_rows_snapshot, decode_rows, encode_rows, rows_metadata
from rlckpt.dataplane.snapshot_metadata import read_snapshot_metadata
from rlckpt.dataplane.snapshot_records import ROWS_HEADER, ROWS_MARKER, ROWS_SECTION, SNAPSHOT_METADATA
from rlckpt.errors import CorruptBundleError, DataPlaneError, LoaderStateError, MalformedRecordError, ReplayStateError
from rlckpt.formats import Record
from rlckpt.formats.json_text import MAX_JSON_DEPTH, QUOTED_CHARS, json_depth, nested_deeper_than
from rlckpt.grpo import DigitSumTask, PromptLoader
from rlckpt.replay import DataPlaneCheckpointBarrier, ReplayBuffer
from rlckpt.replay.index_formats import check_index
from rlckpt.store import COMMIT_FORMAT, MANIFEST_FORMAT, BundleStore, CommitMarker, Intent, Manifest, SigningKey
from rlckpt.store.records.manifest import canonical_json
from rlckpt.store.records.run_record import RunRecord
from support.format_docs import SECTIONS
from support.records import JSON_VALUES, Mutation, mutations, plain_and_foreign_values, valid_values
from support.store_checks import raw_path, save_sample

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
GROUP = 2
TASK = DigitSumTask(seed=0, num_prompts=8)
EVERY_DECLARATION = [record for section in SECTIONS for record in section.formats]


def refused_naming(error: type[Exception], record: Record, mutation: Mutation, read) -> None:
    """`read` refuses the broken record with `error`, naming the record and the broken field."""
    with pytest.raises(error) as refused:
        read()
    assert f"{record.name}: {mutation.path}" in str(refused.value), (mutation.what, str(refused.value))


# --- the declarations alone -----------------------------------------------------------------------


@pytest.mark.parametrize("record", EVERY_DECLARATION, ids=lambda r: f"{r.name} {r.format}")
@PROPERTY
@given(data=st.data())
def test_a_value_of_a_declaration_passes_and_broken_at_any_field_is_refused_naming_it(record, data):
    value = data.draw(valid_values(record.body), label="valid")
    record.check(value)
    mutation = data.draw(st.sampled_from(mutations(record, value, JSON_VALUES)), label="mutation")
    refused_naming(record.error, record, mutation, lambda: record.check(mutation.of(value)))


# --- what the writers wrote, through the readers --------------------------------------------------


def _rows(seed: int) -> list[dict[str, torch.Tensor]]:
    return [{"completion": torch.arange(3) + seed, "reward": torch.tensor([float(i)])} for i in range(GROUP)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict:
    """One bundle saved by save_bundle (staged, in-memory data plane): its records as written."""

    async def save(url: str):
        plane = InMemoryDataPlane()
        replay = ReplayBuffer(plane, DataPlaneCheckpointBarrier(), partition_id="rollouts", group_size=GROUP)
        for i in range(2):
            gid = replay.reserve(weight_version=1, target_step=2)
            await replay.commit(gid, _rows(i), start_weight=1, end_weight=1)
        replay.reserve(weight_version=2, target_step=3)  # reserved only
        loader = PromptLoader(TASK, 2)
        loop = LoopState(step=2, next_batch_step=3, draws=6, pending={"g00000002": {"draw_seq": 5, "prompt_id": 4}})

        class Policy:
            async def stage_policy(self):
                return StagedBytes(b"weights")

        parts = SaveParticipants(BundleStore(url), Policy(), replay, lambda: loop.to_state(loader))
        await save_bundle(parts, 4)

    url = str(tmp_path_factory.mktemp("saved") / "run")
    asyncio.run(save(url))
    bundle = BundleStore(url).open(4)
    return {
        "manifest": dict(bundle.manifest.metadata),
        "snapshot": json.loads(bundle.read_bytes(layout.DATA_PLANE_METADATA)),
        "index": codec.loads(bundle.read_bytes(layout.REPLAY_FILE), origin="index"),
        "loader": codec.loads(bundle.read_bytes(layout.LOADER_FILE), origin="loader"),
    }


def _record_of(name: str, number: int | None = None) -> Record:
    return next(r for r in EVERY_DECLARATION if r.name == name and number in (None, r.format))


@PROPERTY
@given(data=st.data())
def test_a_broken_replay_index_is_refused_by_load_state_dict_before_its_digest(saved, data):
    index, record = saved["index"], _record_of("replay index", 3)
    mutation = data.draw(st.sampled_from(mutations(record, index, plain_and_foreign_values())))
    buffer = ReplayBuffer(None, DataPlaneCheckpointBarrier(), partition_id="rollouts", group_size=GROUP)
    broken = mutation.of(index)
    refused_naming(ReplayStateError, record, mutation, lambda: buffer.load_state_dict(broken, expected_digest="0"))
    refused_naming(ReplayStateError, record, mutation, lambda: check_index(broken))
    assert len(buffer) == 0


@PROPERTY
@given(data=st.data())
def test_a_broken_loader_state_is_refused_before_the_loader_moves(saved, data):
    state, record = saved["loader"], _record_of("loader state")
    mutation = data.draw(st.sampled_from(mutations(record, state, plain_and_foreign_values())))
    loader = PromptLoader(TASK, 2)
    refused_naming(LoaderStateError, record, mutation, lambda: LoopState.from_state(mutation.of(state), loader))
    assert (loader.epoch, loader.position) == (0, 0)


@PROPERTY
@given(data=st.data())
def test_broken_run_bundle_metadata_is_refused_as_a_corrupt_bundle(saved, data):
    meta, record = saved["manifest"], _record_of("run-bundle metadata", 3)
    # the format number's own refusals (newer, none, not a number) are one line each: tests/checkpoint
    mutation = data.draw(st.sampled_from(mutations(record, meta, JSON_VALUES, skip=[layout.META_FORMAT])))
    refused_naming(CorruptBundleError, record, mutation, lambda: read_run_bundle(4, mutation.of(meta)))


@PROPERTY
@given(data=st.data())
def test_broken_data_plane_metadata_is_refused_as_a_corrupt_bundle(saved, data):
    user = saved["snapshot"]["user_metadata"]
    record = read_run_bundle(4, saved["manifest"]).data_plane_record
    mutation = data.draw(st.sampled_from(mutations(record, user, JSON_VALUES)))
    refused_naming(CorruptBundleError, record, mutation, lambda: record.check(mutation.of(user)))


def _snapshot_dir(document: dict, files: dict[str, bytes] | None = None) -> Path:
    local = Path(tempfile.mkdtemp(prefix="rlckpt-records-"))
    (local / "metadata.json").write_text(json.dumps(document))
    for name, data in (files or {}).items():
        (local / name).write_bytes(data)
    return local


@PROPERTY
@given(data=st.data())
def test_broken_snapshot_metadata_is_refused_by_its_reader(saved, data):
    document = saved["snapshot"]
    mutation = data.draw(st.sampled_from(mutations(SNAPSHOT_METADATA, document, JSON_VALUES)))
    local = _snapshot_dir(mutation.of(document))
    refused_naming(DataPlaneError, SNAPSHOT_METADATA, mutation, lambda: read_snapshot_metadata(local))


ROWS_FILE = encode_rows(["g1:0", "g1:1"], {"completion": [torch.arange(3), torch.arange(4)], "r": [torch.ones(1)] * 2})
ROWS_DOCUMENT = json.loads(rows_metadata("rollouts", ["rows-000000.bin"], {"k": 1}))


@PROPERTY
@given(data=st.data())
def test_a_broken_rows_section_is_refused_before_any_row_is_read(data):
    section = ROWS_DOCUMENT[ROWS_MARKER]
    mutation = data.draw(st.sampled_from(mutations(ROWS_SECTION, section, JSON_VALUES)))
    local = _snapshot_dir({**ROWS_DOCUMENT, ROWS_MARKER: mutation.of(section)}, {"rows-000000.bin": ROWS_FILE})
    refused_naming(DataPlaneError, ROWS_SECTION, mutation, lambda: check_rows_snapshot(local))


def _with_header(header: dict) -> bytes:
    old_len = struct.unpack_from("<Q", ROWS_FILE, 8)[0]
    head = json.dumps(header).encode()
    return ROWS_FILE[:8] + struct.pack("<Q", len(head)) + head + ROWS_FILE[16 + old_len :]


@PROPERTY
@given(data=st.data())
def test_a_broken_rows_header_is_refused_before_its_rows_are_built(data):
    header = json.loads(ROWS_FILE[16 : 16 + struct.unpack_from("<Q", ROWS_FILE, 8)[0]])
    mutation = data.draw(st.sampled_from(mutations(ROWS_HEADER, header, JSON_VALUES)))
    broken = _with_header(mutation.of(header))
    refused_naming(DataPlaneError, ROWS_HEADER, mutation, lambda: decode_rows(broken, "rows-000000.bin"))
    local = _snapshot_dir(ROWS_DOCUMENT, {"rows-000000.bin": broken})
    refused_naming(DataPlaneError, ROWS_HEADER, mutation, lambda: check_rows_snapshot(local))


@PROPERTY
@given(data=st.data())
def test_a_broken_intent_is_unreadable_naming_the_field(data):
    intent, record = json.loads(Intent.new(3, "t1").to_bytes()), _record_of("intent")
    mutation = data.draw(st.sampled_from(mutations(record, intent, JSON_VALUES)))
    broken = canonical_json(mutation.of(intent))
    refused_naming(MalformedRecordError, record, mutation, lambda: Intent.from_bytes(broken))


# --- the store's own records: manifest and COMMIT ---------------------------------------------------------

FORMAT_1_BUNDLE = Path(__file__).resolve().parents[1] / "fixtures" / "run_format_1" / "run" / "step_2"
# A format number above today's is a newer record, refused with NewerFormatError in one line of its own
# (tests/store/test_formats.py); every other wrong value of it is a malformed record like any field's.
STORE_VALUES = tuple(v for v in JSON_VALUES if not (type(v) is int and v > min(MANIFEST_FORMAT, COMMIT_FORMAT)))


@pytest.fixture(scope="module")
def store_records(tmp_path_factory) -> dict[tuple[str, int], dict]:
    """manifest.json and COMMIT as a signed commit writes them today, and as rlckpt wrote them in format 1
    (tests/fixtures: the old code's own bundle)."""
    store = BundleStore(str(tmp_path_factory.mktemp("store") / "run"), signing_key=SigningKey.generate())
    save_sample(store, 2, metadata={"note": "x"})
    today = {
        name: json.loads(store.fs.cat_file(raw_path(store, "step_2", name))) for name in ("manifest.json", "COMMIT")
    }
    old = {name: json.loads((FORMAT_1_BUNDLE / name).read_bytes()) for name in ("manifest.json", "COMMIT")}
    assert today["COMMIT"]["signature"] is not None and (old["manifest.json"]["format"], old["COMMIT"]["format"]) == (
        1,
        1,
    )
    return {
        ("manifest", MANIFEST_FORMAT): today["manifest.json"],
        ("manifest", 1): old["manifest.json"],
        ("COMMIT", COMMIT_FORMAT): today["COMMIT"],
        ("COMMIT", 1): old["COMMIT"],
    }


STORE_READERS = {"manifest": Manifest.from_bytes, "COMMIT": CommitMarker.from_bytes}


@pytest.mark.parametrize(
    ("name", "number"),
    [("manifest", MANIFEST_FORMAT), ("manifest", 1), ("COMMIT", COMMIT_FORMAT), ("COMMIT", 1)],
    ids=lambda v: str(v),
)
@PROPERTY
@given(data=st.data())
def test_a_broken_manifest_or_commit_is_refused_as_a_corrupt_bundle_naming_the_field(store_records, name, number, data):
    value, record = store_records[(name, number)], _record_of(name, number)
    mutation = data.draw(st.sampled_from(mutations(record, value, STORE_VALUES)))
    broken = canonical_json(mutation.of(value))
    refused_naming(CorruptBundleError, record, mutation, lambda: STORE_READERS[name](broken))


# --- what whoever writes a run can put in any record: nesting and length ----------------------------------

PLACEHOLDER = "\u2603 the value goes here"
DEEPER = st.integers(min_value=MAX_JSON_DEPTH, max_value=3_000)  # under a key of the record: one level more
LONG = st.integers(min_value=QUOTED_CHARS + 1, max_value=200_000)


def nested(depth: int, kind: str) -> bytes:
    """A canonical JSON value `depth` levels deep, of arrays or of objects."""
    if kind == "array":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * (depth - 1) + b"{}" + b"}" * (depth - 1)


def with_raw(record: dict, path: tuple[str, ...], raw: bytes) -> bytes:
    """`record`'s canonical bytes with the value at key `path` (made if missing) replaced by raw JSON."""
    value = copy.deepcopy(record)
    inner = value
    for key in path[:-1]:
        inner = inner[key]
    inner[path[-1]] = PLACEHOLDER
    return canonical_json(value).replace(canonical_json(PLACEHOLDER), raw, 1)


@pytest.fixture(scope="module")
def text_records(store_records) -> dict[str, tuple[dict, object, type[Exception]]]:
    """Every JSON record of a run the store reads: a valid one, its reader (bytes in) and its error."""
    return {
        "manifest": (store_records[("manifest", MANIFEST_FORMAT)], Manifest.from_bytes, CorruptBundleError),
        "COMMIT": (store_records[("COMMIT", COMMIT_FORMAT)], CommitMarker.from_bytes, CorruptBundleError),
        "intent": (json.loads(Intent.new(3, "t1").to_bytes()), Intent.from_bytes, MalformedRecordError),
        "run record": (json.loads(RunRecord.new().to_bytes()), RunRecord.from_bytes, MalformedRecordError),
    }


def one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("name", ["manifest", "COMMIT", "intent", "run record"])
@PROPERTY
@given(data=st.data(), depth=DEEPER, kind=st.sampled_from(["array", "object"]))
def test_a_record_nested_deeper_than_the_bound_anywhere_is_refused_in_one_line(text_records, name, data, depth, kind):
    record, read, error = text_records[name]
    path = data.draw(st.sampled_from([(key,) for key in sorted(record)] + [("unknown",)]), label="where")
    with pytest.raises(error) as refused:
        read(with_raw(record, path, nested(depth, kind)))
    assert f"{name} is nested deeper than {MAX_JSON_DEPTH} levels" in one_line(refused)


def test_a_manifest_nested_exactly_as_deep_as_the_bound_reads(store_records):
    manifest = store_records[("manifest", MANIFEST_FORMAT)]
    at_the_bound = with_raw(manifest, ("metadata", "deep"), nested(MAX_JSON_DEPTH - 2, "array"))
    assert json_depth(at_the_bound) == MAX_JSON_DEPTH
    assert Manifest.from_bytes(at_the_bound).metadata["deep"] is not None
    with pytest.raises(CorruptBundleError, match="nested deeper"):
        Manifest.from_bytes(with_raw(manifest, ("metadata", "deep"), nested(MAX_JSON_DEPTH - 1, "array")))


@PROPERTY
@given(depth=DEEPER, kind=st.sampled_from(["array", "object"]))
def test_data_plane_metadata_and_a_rows_header_nested_deeper_than_the_bound_are_refused(saved, depth, kind):
    document = saved["snapshot"]
    local = _snapshot_dir({})
    (local / "metadata.json").write_bytes(with_raw(document, ("user_metadata", "deep"), nested(depth, kind)))
    with pytest.raises(DataPlaneError, match=f"nested deeper than {MAX_JSON_DEPTH} levels"):
        read_snapshot_metadata(local)
    header = json.loads(ROWS_FILE[16 : 16 + struct.unpack_from("<Q", ROWS_FILE, 8)[0]])
    head = with_raw(header, ("deep",), nested(depth, kind))
    old_len = struct.unpack_from("<Q", ROWS_FILE, 8)[0]
    broken = ROWS_FILE[:8] + struct.pack("<Q", len(head)) + head + ROWS_FILE[16 + old_len :]
    with pytest.raises(DataPlaneError, match=f"nested deeper than {MAX_JSON_DEPTH} levels"):
        decode_rows(broken, "rows-000000.bin")


@pytest.mark.parametrize("name", ["manifest", "COMMIT", "intent", "run record"])
@PROPERTY
@given(data=st.data(), length=LONG, char=st.sampled_from(["k", "-", "é"]))
def test_a_long_key_in_a_record_is_quoted_short_in_its_refusal(text_records, name, data, length, char):
    record, read, error = text_records[name]
    key = char * length
    places = [canonical_json({**record, key: 1}), b'{"' + key.encode() + b'":1,"' + key.encode() + b'":1}']
    if name == "manifest":
        (rel, entry), *_ = record["files"].items()
        places += [
            canonical_json({**record, "files": {key + "\\": entry}}),  # a path no bundle may hold
            canonical_json({**record, "files": {rel: {**entry, key: 1}}}),
            canonical_json({**record, "files": {key: entry, key + "/x": entry}}),  # a file under a file
        ]
    broken = data.draw(st.sampled_from(places), label="where")
    with pytest.raises(error) as refused:
        read(broken)
    message = one_line(refused)
    assert "characters)" in message and len(message) < 3 * QUOTED_CHARS + 300, message[:400]


JSON_TEXT = st.text(alphabet='"\\[]{}a/é\n', max_size=6)
JSON_TREES = st.recursive(
    st.none() | st.integers() | JSON_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(JSON_TEXT, inner, max_size=3),
    max_leaves=20,
)


def depth_of(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(value=JSON_TREES, ascii_only=st.booleans())
def test_json_depth_is_the_nesting_of_the_value_whatever_its_strings_hold(value, ascii_only):
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert json_depth(text) == json_depth(text.encode()) == depth_of(value)


@settings(max_examples=300, deadline=None)
@given(value=JSON_TREES)
def test_a_value_is_nested_deeper_than_a_limit_exactly_when_its_json_is(value):
    depth = json_depth(json.dumps(value))
    assert [nested_deeper_than(value, limit) for limit in range(depth + 2)] == [True] * depth + [False, False]


def test_a_value_that_holds_itself_is_too_deep_not_a_hang():
    loop: list = []
    loop.append(loop)
    assert nested_deeper_than(loop, MAX_JSON_DEPTH)
