"""S3 files written and read several requests at a time (store/backends/s3_io.py): which requests a file of
each size makes, a part that fails midway, the bound on requests and buffers in flight, and ranged reads hashed
in order. S3 only: local disk has no requests to count; its reads and writes are the same store calls, covered
by every other store test on both backends. Parts are 5 MiB here (S3's smallest), to keep the files small."""

from __future__ import annotations

import asyncio
import io
import os
import threading
import tracemalloc

import pytest

from rlckpt.errors import CorruptBundleError
from rlckpt.store import BundleStore, BundleTransaction, copy_bundle
from rlckpt.store.backends.s3_checksums import crc32c_base64
from rlckpt.store.backends.s3_io import PartBody, PartBuffers, UploadSlots, _pieces
from support.faults import FaultPlan, FaultyFileSystem, InjectedFault
from support.store_checks import debris, declare_writers_dead, multipart_uploads, stored_path

PART = 5 << 20


@pytest.fixture
def real_fs(s3_run_url, s3_storage_options):
    return BundleStore(s3_run_url, s3_storage_options).fs


def faulty_store(url, options, real_fs, plan=None, slots=None, buffers=None):
    """A store over the real filesystem behind the call recorder / fault injector, with 5 MiB parts."""
    store = BundleStore(url, options, fs=FaultyFileSystem(real_fs, plan or FaultPlan()), max_workers=2)
    store.backend.part_buffers = buffers or PartBuffers(PART, max_idle=2)
    if slots is not None:
        store.backend.upload_slots = slots
    return store


def requests(plan: FaultPlan) -> list[str]:
    """The S3 requests the uploads made, by operation, in order."""
    return [call.split(":", 1)[1] for call in plan.calls if call.startswith("_call_s3:")]


def pattern(n: int) -> bytes:
    return bytes(range(256)) * (n // 256) + bytes(n % 256)


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (0, ["put_object"]),
        (PART, ["put_object"]),
        (PART + 1, ["create_multipart_upload", "upload_part", "upload_part", "complete_multipart_upload"]),
    ],
    ids=["empty", "exactly-one-part", "one-byte-more"],
)
def test_a_file_that_fits_one_part_is_one_put_and_one_byte_more_is_a_multipart_upload(
    s3_run_url, s3_storage_options, real_fs, size, expected
):
    plan = FaultPlan()
    store = faulty_store(s3_run_url, s3_storage_options, real_fs, plan)
    data = pattern(size)
    with store.begin(2) as txn:
        plan.calls.clear()
        with txn.open("file.bin") as stream:
            stream.write(data[: size // 2])
            stream.write(data[size // 2 :])
        txn.commit()
    assert requests(plan) == expected
    assert store.open(2).read_bytes("file.bin") == data


class SentHeaders:
    """The checksum headers of every PutObject / UploadPart the filesystem's botocore client sends, by the name
    of the file (the key's last part), in order."""

    def __init__(self, fs) -> None:
        self.sent: dict[str, list[dict[str, str]]] = {}
        fs.s3.meta.events.register("before-send.s3", self._sent)

    def _sent(self, request, **_kwargs) -> None:
        if request.method == "PUT" and "uploads" not in request.url:
            name = request.url.split("?")[0].rsplit("/", 1)[-1]
            headers = {k.lower(): v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()}
            checksums = {k: v for k, v in headers.items() if k.startswith("x-amz-checksum-")}
            self.sent.setdefault(name, []).append(checksums)


def test_the_crc32c_header_is_the_checksum_s3_defines():
    assert crc32c_base64(b"123456789") == "4waSgw=="  # CRC-32C's check value 0xE3069283, big-endian, base64
    assert crc32c_base64(memoryview(bytearray(b"0123456789"))[1:]) == crc32c_base64(b"123456789")


def write_files(store, files: dict[str, bytes]) -> SentHeaders:
    """Commit `files` (each written through the store's upload, in 1 MiB writes) as step 2; what was sent."""
    with store.begin(2) as txn:
        headers = SentHeaders(store.fs)
        for name, data in files.items():
            with txn.open(name) as stream:
                for at in range(0, len(data), 1 << 20):
                    stream.write(data[at : at + (1 << 20)])
        txn.commit()
    return headers


def test_every_upload_request_carries_the_crc32c_of_its_own_body_and_botocore_adds_no_crc32(
    s3_run_url, s3_storage_options
):
    """The checksum is rlckpt's, computed by the writer's thread; botocore's own CRC32 (on the loop) is not sent."""
    store = BundleStore(s3_run_url, s3_storage_options)
    store.backend.part_buffers = PartBuffers(PART, max_idle=2)
    big, small = os.urandom(2 * PART + 7), b"a small file"
    headers = write_files(store, {"big.bin": big, "small.bin": small})
    parts = [big[:PART], big[PART : 2 * PART], big[2 * PART :]]
    assert headers.sent["big.bin"] == [{"x-amz-checksum-crc32c": crc32c_base64(part)} for part in parts]
    assert headers.sent["small.bin"] == [{"x-amz-checksum-crc32c": crc32c_base64(small)}]
    bundle = store.open(2)
    assert (bundle.read_bytes("big.bin"), bundle.read_bytes("small.bin")) == (big, small)


def test_a_client_set_to_send_checksums_only_where_required_gets_none_from_rlckpt(s3_run_url, s3_storage_options):
    """`request_checksum_calculation="when_required"` is how users reach servers that refuse the headers."""
    options = {**s3_storage_options, "config_kwargs": {"request_checksum_calculation": "when_required"}}
    store = BundleStore(s3_run_url, options)
    store.backend.part_buffers = PartBuffers(PART, max_idle=2)
    headers = write_files(store, {"big.bin": pattern(PART + 1), "small.bin": b"a small file"})
    assert (len(headers.sent["big.bin"]), len(headers.sent["small.bin"])) == (2, 1)
    assert all(sent == {} for requests in headers.sent.values() for sent in requests)  # nor from botocore


@pytest.mark.parametrize("sticky", [False, True], ids=["fails-once", "dies-there"])
def test_a_part_that_fails_midway_commits_nothing_and_leaves_no_upload_behind(
    s3_run_url, s3_storage_options, real_fs, sticky
):
    """The second of three parts fails while the others are in flight: the save fails, nothing is committed,
    and the upload is aborted by the writer, or (when the writer died there) found and aborted by gc."""
    plan = FaultPlan(fail_at=2, sticky=sticky, only="upload_part")
    store = faulty_store(s3_run_url, s3_storage_options, real_fs, plan)
    txn = store.begin(2)
    with pytest.raises(Exception) as info:  # the injected fault, wrapped or not
        with txn.open("big.bin") as stream:
            stream.write(pattern(2 * PART + (1 << 20)))
        txn.commit()
    assert isinstance(info.value, InjectedFault) or isinstance(info.value.__cause__, InjectedFault)
    try:
        txn.abort()
    except Exception:
        assert sticky, "only a writer that died at the fault fails to abort"
    clean = BundleStore(s3_run_url, s3_storage_options, fs=real_fs)
    assert clean.steps() == []
    if not sticky:
        assert multipart_uploads(clean) == []  # the writer aborted its upload itself
    declare_writers_dead(clean)
    clean.gc(stale_after=0)
    assert debris(clean) == []


def test_a_part_in_flight_is_sent_from_its_buffer_without_a_copy_of_it(s3_run_url, s3_storage_options, real_fs):
    buffers = PartBuffers(PART, max_idle=6)
    for buf in [buffers.take() for _ in range(6)]:  # the pool's buffers exist before: only copies are counted
        buffers.give(buf)
    store = faulty_store(s3_run_url, s3_storage_options, real_fs, buffers=buffers)
    data = memoryview(pattern(3 * PART + 1))
    with store.begin(2) as txn:
        tracemalloc.start()
        try:
            with txn.open("big.bin") as stream:
                for at in range(0, len(data), 1 << 20):
                    stream.write(data[at : at + (1 << 20)])
            txn.commit()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert store.open(2).read_bytes("big.bin") == data
    assert peak < PART  # a part copied on its way to the socket would be a whole 5 MiB allocation


def test_a_part_body_reads_to_botocore_as_the_same_bytes_a_bytes_body_would():
    """What botocore does with a body: its length, its CRC32 (plain http), and its aws-chunked encoding with a
    trailing checksum (https) come out as for the bytes themselves, after a retry's rewind too."""
    from botocore.httpchecksum import AwsChunkedWrapper, Crc32Checksum
    from botocore.utils import determine_content_length

    data = os.urandom(3 * PartBody.SLICE + 123)
    body = PartBody(memoryview(bytearray(data))[: len(data) - 23])
    expected = data[: len(data) - 23]

    def encoded(raw):
        return AwsChunkedWrapper(raw, checksum_cls=Crc32Checksum, checksum_name="x-amz-checksum-crc32").read()

    assert determine_content_length(body) == len(expected)
    assert Crc32Checksum().handle(body) == Crc32Checksum().handle(io.BytesIO(expected))
    assert body.tell() == 0  # botocore rewinds after hashing
    assert encoded(body) == encoded(io.BytesIO(expected))
    body.seek(0)  # a retry sends it again from its start

    async def sent():
        return b"".join([bytes(piece) async for piece in body])

    assert asyncio.run(sent()) == expected


def test_a_writer_waits_for_a_free_slot_holding_one_part_and_never_exceeds_the_bound(
    s3_run_url, s3_storage_options, real_fs
):
    """Memory is bounded by construction: with every request slot taken, a writer whose part is full holds
    that one buffer and waits; requests in flight never exceed the slots."""
    slots, buffers = UploadSlots(2), PartBuffers(PART, max_idle=2)
    store = faulty_store(s3_run_url, s3_storage_options, real_fs, slots=slots, buffers=buffers)
    txn = store.begin(2)
    slots.acquire()  # two requests of someone else in flight: every slot taken
    slots.acquire()
    failures: list[BaseException] = []

    def write() -> None:
        try:
            with txn.open("big.bin") as stream:
                stream.write(pattern(3 * PART + 1))
        except BaseException as exc:
            failures.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    assert slots.wait_until(lambda s: s.waiting == 1), "the writer never asked for a slot"
    assert (slots.in_flight, buffers.lent) == (2, 1)  # it waits holding its one full part
    slots.release()
    slots.release()
    writer.join()
    assert failures == []
    txn.commit()
    assert slots.peak == 2 and slots.in_flight == 0
    assert buffers.lent == 0
    assert store.open(2).read_bytes("big.bin") == pattern(3 * PART + 1)


def test_a_stored_range_is_read_as_parallel_ranged_gets_hashed_in_order(s3_run_url, s3_storage_options, real_fs):
    plan = FaultPlan()
    store = faulty_store(s3_run_url, s3_storage_options, real_fs, plan)
    store.backend.read_piece, store.backend.reads_in_flight = 64 << 10, 4
    data = pattern(1 << 20)
    with store.begin(2) as txn:
        txn.write_bytes("file.bin", data)
        txn.commit()
    bundle = store.open(2)
    plan.calls.clear()
    buffer = bytearray(len(data) + 1)
    assert bytes(bundle.read_into("file.bin", buffer)) == data
    assert plan.calls.count("_call_s3:get_object") == 16  # 1 MiB in 64 KiB ranges; the last one asks one byte more


def test_a_ranged_get_streams_into_its_place_without_holding_a_second_copy_of_its_piece(
    s3_run_url, s3_storage_options, real_fs
):
    store = BundleStore(s3_run_url, s3_storage_options)
    store.backend.read_piece, store.backend.reads_in_flight = 8 << 20, 1
    data = os.urandom(8 << 20)
    with store.begin(2) as txn:
        txn.write_bytes("file.bin", data)
        txn.commit()
    bundle = store.open(2)
    buffer = bytearray(len(data) + 1)
    tracemalloc.start()
    try:
        view = bundle.read_into("file.bin", buffer)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert bytes(view) == data
    assert peak < 2 << 20  # a body joined before it is copied into place would be the whole 8 MiB piece


def test_a_flipped_byte_in_one_range_is_refused_naming_the_file(s3_run_url, s3_storage_options, real_fs):
    store = faulty_store(s3_run_url, s3_storage_options, real_fs)
    store.backend.read_piece, store.backend.reads_in_flight = 64 << 10, 4
    data = pattern(1 << 20)
    with store.begin(2) as txn:
        txn.write_bytes("file.bin", data)
        txn.commit()
    flipped = bytearray(data)
    flipped[9 * (64 << 10) + 123] ^= 0x10  # inside the tenth range
    real_fs.pipe_file(stored_path(store, 2, "file.bin"), bytes(flipped))
    bundle = store.open(2)
    with pytest.raises(CorruptBundleError, match="file.bin has blake3:"):
        bundle.read_into("file.bin", bytearray(len(data) + 1))
    with pytest.raises(CorruptBundleError, match="file.bin has blake3:"):
        bundle.open("file.bin")


def test_the_last_byte_of_a_read_rides_with_the_last_range():
    assert _pieces(0, (16 << 20) + 1, 8 << 20) == [(0, (8 << 20) + 1), ((8 << 20) + 1, 8 << 20)]
    assert _pieces(100, 1, 8 << 20) == [(100, 1)]
    assert sum(n for _at, n in _pieces(7, (5 << 20) + 3, 1 << 20)) == (5 << 20) + 3


class GatedPuts(FaultyFileSystem):
    """The real filesystem, with every PUT the uploads make held (off the loop) until `gate` is set."""

    def __init__(self, inner, gate: threading.Event):
        super().__init__(inner)
        self._gate = gate

    def __getattr__(self, name):
        attr = super().__getattr__(name)
        if name != "_call_s3":
            return attr

        def call(method, *args, **kwargs):
            if method != "put_object":
                return attr(method, *args, **kwargs)

            async def held():
                await asyncio.to_thread(self._gate.wait)
                return await attr(method, *args, **kwargs)

            return held()

        return call


def test_a_replica_commit_waits_for_the_uploads_still_finishing(tmp_path, s3_run_url, s3_storage_options, real_fs):
    """A copied file's upload finishes in the background: the replica's commit must wait for it (here it is
    let go only once the commit waits), as every commit does, or its listing check finds the file missing."""
    source = BundleStore(str(tmp_path / "src"))
    with source.begin(3) as txn:
        with txn.open("policy/state.pt") as stream:
            stream.write(pattern(3 << 20))
        txn.commit()
    gate = threading.Event()
    dest = BundleStore(s3_run_url, s3_storage_options, fs=GatedPuts(real_fs, gate))
    original_wait, original_abort = BundleTransaction._wait_durable, BundleTransaction.abort

    def wait_durable(self):
        gate.set()
        original_wait(self)

    def abort(self):  # a commit that did not wait fails; its abort must not wait on the held PUT forever
        gate.set()
        original_abort(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(BundleTransaction, "_wait_durable", wait_durable)
        patch.setattr(BundleTransaction, "abort", abort)
        report = copy_bundle(source, 3, dest)
    assert report.copied_files == 1
    assert BundleStore(s3_run_url, s3_storage_options, fs=real_fs).open(3).read_bytes("policy/state.pt") == pattern(
        3 << 20
    )
