"""S3 requests several at a time: a file is uploaded in parts while it is still being written (one PUT when it
fits in one part, otherwise a multipart upload whose parts go out in parallel), and a stored range is read as
several ranged GETs at once, hashed in order as the pieces land.

Every request goes through the filesystem's own async client (s3fs's `_call_s3` on its event loop, with its
retry loop): the same connections, retries and options as every other call of the store, and no thread of our own.

Memory is bounded by construction, not by luck:
- a file being written holds one buffer: a small growing one up to SMALL_FILE bytes, then one of PART_SIZE;
- at most `UploadSlots.limit` requests are in flight per process (UPLOADS_IN_FLIGHT), each holding at most one
  part; a writer whose next part finds every slot taken waits for one (the slots are the only thing it waits
  for, and a request in flight waits for nothing, so this cannot deadlock);
- a read holds its caller's buffer and, per ranged GET in flight (at most READS_IN_FLIGHT), one socket read's
  chunk on its way into that buffer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from concurrent.futures import Future
from typing import Any

from rlckpt.store.backends.base import HeldFile, PendingWrite
from rlckpt.store.backends.object_store import WRITE_BLOCK_SIZE
from rlckpt.store.backends.s3_checksums import body_checksum

log = logging.getLogger(__name__)

FRAMING_SLACK = 256 << 10  # a file this far past WRITE_BLOCK_SIZE is still one PUT: a shard file of one 16 MiB tensor
# (a common size) is 16 MiB plus about 1.5 KiB of zip framing. With parts of exactly 16 MiB it was a multipart upload
# of four requests (create, a 16 MiB part, a 1.5 KiB part, complete), the writer waiting on the create.
PART_SIZE = WRITE_BLOCK_SIZE + FRAMING_SLACK  # a file up to this size is one PUT; a larger one goes in parts this size
SMALL_FILE = 1 << 20  # a file's first bytes go to a small buffer that grows; a part buffer only beyond this
UPLOADS_IN_FLIGHT = 4  # PUTs and parts in flight per process (a trainer rank): 4 x PART_SIZE at most
READ_PIECE = WRITE_BLOCK_SIZE  # a read of a larger range is split into ranged GETs of about this size (a
# shard file is one GET: through a proxy each request costs more than its bytes, 4 MiB pieces loaded 1 GiB in
# 2.67 s against 2.36 s for whole files, on RGW through nginx; 2.04 s against 1.67 s direct) ...
READS_IN_FLIGHT = 2  # ... this many of them at once (each streams into its place: no second copy held)
STREAM_STEP = 4 << 20  # a held object's read hands its bytes on (to be hashed) this many at a time as they land
PEEK_AHEAD_MAX = 64 << 10  # a peek this close ahead of a held object's stream reads ahead on it: no request
STREAM_REOPENS = 2  # a held object's GET that breaks after giving bytes is reopened where it broke, this many times

# What CompleteMultipartUpload needs of each part besides its number (as s3fs sends it).
_PART_KEYS = ("ETag", "ChecksumSHA256")


class UploadSlots:
    """At most `limit` requests in flight at once; `acquire()` blocks while all are taken. `peak` is the most
    that were ever in flight together and `waiting` how many callers wait for a slot now (tests read the
    bound off them)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"at least one request must be allowed in flight, got {limit}")
        self.limit = limit
        self._changed = threading.Condition()
        self.in_flight = 0
        self.peak = 0
        self.waiting = 0

    def acquire(self) -> None:
        with self._changed:
            self.waiting += 1
            self._changed.notify_all()
            while self.in_flight >= self.limit:
                self._changed.wait()
            self.waiting -= 1
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            self._changed.notify_all()

    def release(self) -> None:
        with self._changed:
            self.in_flight -= 1
            self._changed.notify_all()

    def wait_until(self, condition: Callable[[UploadSlots], bool], timeout: float = 60.0) -> bool:
        """Block until `condition(self)` holds (tests: "a writer now waits for a slot"); False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: condition(self), timeout)


class PartBuffers:
    """Part buffers of exactly `size` bytes, reused (their pages are faulted in once, as READ_BUFFERS' are); at
    most `max_idle` are kept between uses."""

    def __init__(self, size: int, max_idle: int) -> None:
        self.size = size
        self.max_idle = max_idle
        self._idle: list[bytearray] = []
        self._lock = threading.Lock()
        self.lent = 0  # buffers out now: one per file being written, one per part in flight

    def take(self) -> bytearray:
        with self._lock:
            self.lent += 1
            if self._idle:
                return self._idle.pop()
        return bytearray(self.size)

    def give(self, buf: bytearray) -> None:
        with self._lock:
            self.lent -= 1
            if len(buf) == self.size and len(self._idle) < self.max_idle:
                self._idle.append(buf)

    @property
    def idle_bytes(self) -> int:
        """What the pool keeps between uploads."""
        with self._lock:
            return len(self._idle) * self.size


UPLOAD_SLOTS = UploadSlots(UPLOADS_IN_FLIGHT)  # one per process: a rank's uploads, of every store, share them
PART_BUFFERS = PartBuffers(PART_SIZE, max_idle=UPLOADS_IN_FLIGHT + 1)  # the most one writer has out at once


class PartBody:
    """A request body sent from the part buffer it views, never copied whole: botocore reads it as a file (its
    length; its CRC32 only when the request carries no checksum of ours), and aiohttp sends it as an async
    iterable of SLICE-sized views. A bytearray body was copied whole up to three times on the client's loop
    thread, each a fresh allocation of the part's size while in flight (py3.11 aiohttp: cut to its length,
    joined with the headers, its unsent rest buffered). Its bytes must not change until the request has ended
    (the buffer returns to the pool only then)."""

    SLICE = 1 << 20

    def __init__(self, data: memoryview) -> None:
        self._data = data
        self._pos = 0

    def __len__(self) -> int:
        return len(self._data) - self._pos  # what is left to send: botocore's Content-Length

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: len(self._data)}[whence]
        self._pos = min(max(base + offset, 0), len(self._data))
        return self._pos

    def read(self, size: int = -1) -> memoryview:
        """A view, not a copy: botocore only hashes what it reads (and compares the end with b"")."""
        end = len(self._data) if size is None or size < 0 else min(self._pos + size, len(self._data))
        out = self._data[self._pos : end]
        self._pos = end
        return out

    def __aiter__(self) -> AsyncIterator[memoryview]:
        return self._slices()

    async def _slices(self) -> AsyncIterator[memoryview]:
        while self._pos < len(self._data):
            end = min(self._pos + self.SLICE, len(self._data))
            yield self._data[self._pos : end]
            self._pos = end


def _on_loop(fs: Any, coro: Coroutine[Any, Any, Any]) -> Future[Any]:
    """Run a coroutine of the filesystem's client on its event loop; a future of its result."""
    return asyncio.run_coroutine_threadsafe(coro, fs.loop)


class S3Upload:
    """A write-only file of one S3 object that publishes nothing before `finish()`'s completion runs.

    Bytes fill a buffer; a full part goes out (a multipart upload is created at the first one) as soon as more
    bytes follow it, so parts upload while the next ones are written and hashed. A file that ends within one
    part is one PUT, sent by `finish()`. A part that failed is raised at the next `write()` (the caller then
    aborts); `abort()` waits for the parts in flight and aborts the multipart upload, so nothing is left but
    what a crash leaves (an incomplete upload under the run, which gc finds and aborts).
    """

    def __init__(
        self, fs: Any, path: str, slots: UploadSlots = UPLOAD_SLOTS, buffers: PartBuffers = PART_BUFFERS
    ) -> None:
        self.fs = fs
        self.path = path
        self.part_size = buffers.size  # parts are as large as the buffers they are sent from
        self._slots = slots
        self._buffers = buffers
        self._bucket, self._key, _version = fs.split_path(path)
        self._small = bytearray()  # the first bytes, up to SMALL_FILE
        self._part: bytearray | None = None  # then a part buffer
        self._filled = 0
        self._upload_id: str | None = None
        self._parts: list[Future[Any]] = []
        self._single: Future[Any] | None = None
        self._state = "open"  # open -> finished -> completed | aborted
        self.size = 0
        self.closed = False

    # --- writing ----------------------------------------------------------------------------------
    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if self._state != "open":
            raise ValueError(f"write to {self.path} after it was {self._state}")
        self._raise_failed_part()
        view = memoryview(data).cast("B")
        n = len(view)
        if self._part is None and len(self._small) + n <= min(SMALL_FILE, self.part_size):
            self._small += view
            self.size += n
            return n
        if self._part is None:
            self._part = self._buffers.take()
            self._filled = len(self._small)
            self._part[: self._filled] = self._small
            self._small = bytearray()
        while view:
            if self._filled == self.part_size:  # full, and more follows: it is a part, not the whole file
                self._send_part(self._part, self._filled)
                self._part, self._filled = self._buffers.take(), 0
            take = min(self.part_size - self._filled, len(view))
            self._part[self._filled : self._filled + take] = view[:take]
            self._filled += take
            view = view[take:]
        self.size += n
        return n

    def flush(self) -> None:
        """Nothing to flush: bytes go out as whole parts (S3 has no appends)."""

    def _raise_failed_part(self) -> None:
        for part in self._parts:
            if part.done() and part.exception() is not None:
                raise part.exception()  # type: ignore[misc]

    def _request(self, method: str, **kwargs: Any) -> Future[Any]:
        """One request in flight, holding a slot until it ends (waits for a slot first)."""
        self._slots.acquire()
        try:
            future = _on_loop(self.fs, self.fs._call_s3(method, Bucket=self._bucket, Key=self._key, **kwargs))
        except BaseException:
            self._slots.release()
            raise
        future.add_done_callback(lambda _f: self._slots.release())
        return future

    def _send_part(self, buf: bytearray, filled: int) -> None:
        """Upload `buf[:filled]` as the next part (creating the multipart upload first)."""
        if self._upload_id is None:
            created = _on_loop(self.fs, self.fs._call_s3("create_multipart_upload", Bucket=self._bucket, Key=self._key))
            self._upload_id = created.result()["UploadId"]
        number = len(self._parts) + 1
        self._parts.append(self._send(buf, filled, "upload_part", UploadId=self._upload_id, PartNumber=number))

    def _send(self, buf: bytearray, filled: int, method: str, **kwargs: Any) -> Future[Any]:
        """Request `method` with body `buf[:filled]`, sent from the buffer itself (PartBody) with its checksum
        computed here, off the event loop (s3_checksums); `buf` goes back to the pool once the request ended."""
        try:
            body = memoryview(buf)[:filled]
            request = self._request(method, Body=PartBody(body), **body_checksum(self.fs, body), **kwargs)
        except BaseException:
            self._buffers.give(buf)
            raise
        request.add_done_callback(lambda _f: self._buffers.give(buf))
        return request

    # --- ending ---------------------------------------------------------------------------------
    def finish(self) -> PendingWrite:
        """No more bytes: send what is buffered (the last part, or the whole file as one PUT). Returns what makes
        the object visible (`complete`, to run beside writing the next files) or never (`abandon`)."""
        if self._state != "open":
            raise ValueError(f"{self.path} was already {self._state}")
        self._raise_failed_part()
        self._state = "finished"
        try:
            if self._upload_id is None and self._part is None:
                body, self._small = self._small, bytearray()
                self._single = self._request("put_object", Body=body, **body_checksum(self.fs, body))
            elif self._upload_id is None:
                part, self._part = self._part, None
                assert part is not None
                self._single = self._send(part, self._filled, "put_object")
            else:
                assert self._part is not None and self._filled > 0, "a part goes out only when bytes follow it"
                part, filled = self._part, self._filled
                self._part = None
                self._send_part(part, filled)
        except BaseException:
            self.abort()
            raise
        self.closed = True
        return PendingWrite(complete=self._complete, abandon=self.abort, in_place=False)

    def _complete(self) -> None:
        """Wait for every request of the file; complete the multipart upload (or abort it if a part failed)."""
        if self._single is not None:
            self._single.result()
            self._state = "completed"
            return
        try:
            parts = []
            for number, part in enumerate(self._parts, start=1):
                answer = part.result()
                parts.append({"PartNumber": number, **{k: answer[k] for k in _PART_KEYS if k in answer}})
            done = _on_loop(
                self.fs,
                self.fs._call_s3(
                    "complete_multipart_upload",
                    Bucket=self._bucket,
                    Key=self._key,
                    UploadId=self._upload_id,
                    MultipartUpload={"Parts": parts},
                ),
            )
            done.result()
        except BaseException:
            self.abort()
            raise
        self._state = "completed"

    def abort(self) -> None:
        """Publish nothing: wait for the requests in flight, then abort the multipart upload (if one began).
        Idempotent; a file already completed stays (the transaction's discard removes it)."""
        if self._state in ("aborted", "completed"):
            return
        self._state = "aborted"
        self.closed = True
        self._release_buffer()
        for request in [*self._parts, *([self._single] if self._single is not None else [])]:
            try:
                request.result()
            except BaseException:
                pass  # the upload is being thrown away; its own failure says nothing more
        upload_id, self._upload_id = self._upload_id, None
        if upload_id is not None:
            aborted = _on_loop(
                self.fs,
                self.fs._call_s3("abort_multipart_upload", Bucket=self._bucket, Key=self._key, UploadId=upload_id),
            )
            aborted.result()

    def _release_buffer(self) -> None:
        if self._part is not None:
            self._buffers.give(self._part)
            self._part = None
        self._small = bytearray()

    def __del__(self) -> None:  # dropped unfinished: publish nothing (an upload it began is left to gc)
        if self._state == "open":
            self._state = "aborted"
            self._release_buffer()


def _pieces(start: int, length: int, piece: int) -> list[tuple[int, int]]:
    """[start, start+length) as about-equal ranges of at most about `piece` bytes (offset, size). The last byte
    of a read is usually the one that notices a longer file: it rides with the last piece, not alone."""
    count = max(1, -(-(length - 1) // piece)) if length > 1 else 1
    base, extra = divmod(length, count)
    out, at = [], start
    for i in range(count):
        size = base + (1 if i < extra else 0)
        out.append((at, size))
        at += size
    return out


def is_invalid_range(exc: BaseException) -> bool:
    """416 InvalidRange: a ranged GET that starts at or beyond the end of the object (an empty object's too;
    Ceph RGW's reaches us as `OSError: [Errno 22] None`, the code only in the cause)."""
    from rlckpt.store.io.storage_errors import service_error_code

    text = f"{type(exc).__name__}: {exc}"
    return (
        service_error_code(exc) == "InvalidRange"
        or "InvalidRange" in text
        or "416" in text
        or "not satisfiable" in text.lower()
    )


async def _ranged_into(fs: Any, path: str, start: int, target: memoryview) -> int:
    """GET bytes [start, start+len(target)) of `path` into `target` as the body arrives, chunk by chunk (with
    s3fs's retries and error translation, as its `_cat_file`); how many there were (fewer at the end of the
    object, 0 past it). The body is never joined into one bytes object first: a GET in flight holds a
    socket read's worth beside `target`, not a second copy of its whole range, so a piece may be as large as
    a shard file (one GET per file) without doubling what a read holds."""
    if not target:
        return 0
    from s3fs.core import _error_wrapper, version_id_kw  # s3fs's own retry loop, as `_cat_file` uses it

    bucket, key, version = fs.split_path(path)
    end = start + len(target) - 1

    async def get_and_fill() -> int:
        answer = await fs._call_s3(
            "get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end}", **version_id_kw(version)
        )
        body = answer["Body"]
        try:
            got = 0
            while got < len(target):
                n = await body.readinto(target[got:])
                if n == 0:
                    break
                got += n
            return got
        finally:
            body.close()

    try:
        return int(await _error_wrapper(get_and_fill, retries=fs.retries))
    except OSError as exc:
        if is_invalid_range(exc):
            return 0
        raise


def read_ranges(
    fs: Any,
    path: str,
    view: memoryview,
    start: int,
    on_chunk: Callable[[memoryview], object] | None,
    piece: int = READ_PIECE,
    in_flight: int = READS_IN_FLIGHT,
) -> int:
    """Fill `view` with bytes [start, start+len(view)) of `path` by ranged GETs, up to `in_flight` at once, each
    copied into its place on the client's loop; each piece is handed to `on_chunk` in order, as soon as it and
    those before it have landed. Returns how many bytes there were (fewer than asked at the end of the object)."""
    ranges = _pieces(start, len(view), piece)
    futures: list[Future[int]] = []
    got = 0
    try:
        for i, (at, size) in enumerate(ranges):
            while len(futures) - i < in_flight and len(futures) < len(ranges):
                a, n = ranges[len(futures)]
                futures.append(_on_loop(fs, _ranged_into(fs, path, a, view[a - start : a - start + n])))
            n = futures[i].result()
            if on_chunk is not None and n:
                on_chunk(view[at - start : at - start + n])
            got += n
            if n < size:
                break  # the object ends here: what follows is not read
        return got
    finally:
        for future in futures:
            future.cancel()
        for future in futures:  # none may still write into `view` once this returns
            with contextlib.suppress(BaseException):
                future.result()


class StreamedObject(HeldFile):
    """One S3 object held for reads in order (`S3Backend.hold`): consecutive reads are served by one GET of the rest
    of the object, kept open between them, so a file read in many pieces (a reader placing tensors one by one) costs
    one request, and no buffer of its size. A peek at most PEEK_AHEAD_MAX ahead of the stream reads ahead on it into
    a small buffer, which the next reads take first; any other read or peek is a ranged GET of its own (the stream
    then restarts where the next read asks). A GET that breaks after giving bytes is reopened where it broke; one
    that gives none (a silent server) fails the read.

    Reads come from one thread at a time (the read's owner); each waits on the client's event loop."""

    def __init__(self, backend: Any, path: str) -> None:
        super().__init__(backend, path)
        self._fs = backend.fs
        self._body: Any = None  # the open GET's body, read on the client's loop
        self._at = 0  # the offset of the next byte the body gives
        self._ahead = bytearray()  # bytes the body gave before a read asked for them (a peek's)
        self.requests = 0  # GETs this object's reads made (tests read it: one per file read in order)

    @property
    def position(self) -> int:
        """The offset the stream's next read is served from without a request."""
        return self._at - len(self._ahead)

    def read_into(self, view: memoryview, start: int, on_chunk: Callable[[memoryview], object] | None = None) -> int:
        if start != self.position:
            self._restart(start)
        got = self._take_ahead(view)
        if on_chunk is not None and got:
            on_chunk(view[:got])
        while got < len(view):
            step = view[got : got + STREAM_STEP]
            n = self._from_body(step)
            if n and on_chunk is not None:
                on_chunk(step[:n])
            got += n
            if n < len(step):
                break  # the object ends here
        return got

    def peek_into(self, view: memoryview, start: int) -> int:
        end = start + len(view)
        pos = self.position
        if not (pos <= start and end - pos <= PEEK_AHEAD_MAX):
            self.requests += 1
            return read_ranges(self._fs, self._path, view, start, None, max(1, len(view)), 1)
        while self._at < end:  # read ahead on the stream, keeping what it gives
            more = bytearray(end - self._at)
            n = self._from_body(memoryview(more))
            self._ahead += more[:n]
            if n < len(more):
                break
        lo = start - pos
        got = max(0, min(len(self._ahead), end - pos) - lo)
        view[:got] = self._ahead[lo : lo + got]
        return got

    def _take_ahead(self, view: memoryview) -> int:
        n = min(len(view), len(self._ahead))
        if n:
            view[:n] = self._ahead[:n]
            del self._ahead[:n]
        return n

    def _restart(self, start: int) -> None:
        """Drop the stream; the next bytes come from a GET starting at `start` (opened when first read)."""
        self._drop_body()
        self._ahead = bytearray()
        self._at = start

    def _from_body(self, target: memoryview) -> int:
        """Fill `target` from the stream at `_at` (opening it there first), reopening it where a read broke;
        fewer bytes at the end of the object."""
        got = 0
        for attempt in range(STREAM_REOPENS + 1):
            try:
                if self._body is None:
                    self.requests += 1
                    self._body = _on_loop(self._fs, _open_from(self._fs, self._path, self._at)).result()
                    if self._body is None:  # at or past the end of the object
                        return got
                n = _on_loop(self._fs, _fill(self._body, target[got:])).result()
                got += n
                self._at += n
                return got
            except _BodyBroke as broke:
                got += broke.got
                self._at += broke.got
                self._drop_body()
                if attempt == STREAM_REOPENS or not broke.got:  # a body that gives nothing is not retried: a
                    # silent server is refused within the deadline of one GET (location.py), not three
                    raise OSError(f"the GET of {self._path} broke at byte {self._at}: {broke.cause}") from broke.cause
                log.info("the GET of %s broke at byte %d (%s); reopening it there", self._path, self._at, broke.cause)
        return got

    def _drop_body(self) -> None:
        body, self._body = self._body, None
        if body is not None:
            _on_loop(self._fs, _close(body)).result()

    def close(self) -> None:
        self._restart(self._at)


class _BodyBroke(Exception):
    """A body read failed after `got` bytes had landed."""

    def __init__(self, got: int, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.got = got
        self.cause = cause


async def _open_from(fs: Any, path: str, start: int) -> Any:
    """The body of a GET of `path` from byte `start` to its end (s3fs's retries and error translation); None when
    `start` is at or past the end."""
    from s3fs.core import _error_wrapper, version_id_kw

    bucket, key, version = fs.split_path(path)

    async def get() -> Any:
        ranged = {"Range": f"bytes={start}-", **version_id_kw(version)}
        answer = await fs._call_s3("get_object", Bucket=bucket, Key=key, **ranged)
        return answer["Body"]

    try:
        return await _error_wrapper(get, retries=fs.retries)
    except OSError as exc:
        if is_invalid_range(exc):
            return None
        raise


async def _fill(body: Any, target: memoryview) -> int:
    """`target` filled from `body` as it arrives (fewer at its end); _BodyBroke if the body fails midway."""
    got = 0
    try:
        while got < len(target):
            n = await body.readinto(target[got:])
            if n == 0:
                break
            got += n
    except Exception as exc:
        raise _BodyBroke(got, exc) from exc
    return got


async def _close(body: Any) -> None:
    body.close()
