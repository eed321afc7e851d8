"""The resumable generation store: compact append-only segments plus an index, one pair per writer.

Why this shape (docs/generation.md, "Store"):

* **A restart reads only the index.** ``{writer}.idx`` holds one fixed-size
  entry per generation (key, where its frame is, its CRC, token count,
  attempt, finish reason), so a restarted shard knows what is done, how many
  tokens were generated and which attempts were truncated without decoding a
  single record; a record is read from ``{writer}.seg`` only when needed.
* **Compact frames.** A frame is the record's JSON without its token lists,
  then the token ids (uint32) and the token offsets as per-token character
  deltas (uint16, or uint32 when a token spells more), all zlib-compressed.
* **Group commit, off the engine's loop.** ``put`` only queues; a writer thread
  appends frames, fsyncs the segment, then appends and fsyncs the index, once
  ``commit_records`` records wait or ``commit_seconds`` after the first of
  them.  The queue holds at most one batch behind the one being written (a
  full queue makes ``put`` wait), so a ``kill -9`` loses at most
  ``2 x commit_records`` finished generations, and none older than
  ``commit_seconds`` plus one commit.  ``close`` (also on SIGTERM/SIGINT,
  through the job's ``finally``) commits what is queued.
* **Crash-safe by order.** Frames are durable before their index entries; a
  reader ignores a torn index tail and recovers any whole frame past the last
  indexed one (its commit time unknown: NaN, never an invented one); a writer
  cuts a torn segment tail before appending.  Reading a record checks that the
  frame the entry points at is a frame of that length and key; an index whose
  segment is gone is named to ``warn``.
* **A format that says what it is.** An index starts with a header naming its
  format version; finish reasons are stored as fixed codes (``FINISH_CODES``),
  never as a position in a Python tuple.  Format 1 (indexes without a header,
  written before the header existed) used the same entries and codes and is
  read as it is; an index of an unknown version, or an entry with an unknown
  code, is refused with one line instead of being reinterpreted.
* **Partial records are entries of their own kind.** The tokens so far of a
  generation an interrupt cut short (SIGTERM/SIGINT) are stored under a key
  derived from the generation's key, with finish code ``partial`` (format 3):
  ``key in store`` still means finished, ``entries_of`` leaves partials out
  (``procexec status`` and the cost account count finished generations only),
  and a procexec older than format 3 refuses such an entry as an unknown code
  instead of counting it as done.

Every writer's files are merged on load, so a rerun with another shard layout
still finds what earlier jobs produced.  Keys are decided by the job.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import queue
import re
import struct
import threading
import time
import zlib
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from procexec.errors import ProcexecError
from procexec.records import ends_looping

_WRITER = re.compile(r"^[A-Za-z0-9._-]+$")
_STAGE_WRITER = re.compile(r"^([a-z]+)-\d+-of-\d+$")
FRAME = struct.Struct("<4sI32sI")  # magic, payload length, key (raw sha256), crc32 of payload
MAGIC = b"PXS1"
# key, frame offset, payload length, crc32, tokens, commit time (unix s), attempt, finish reason
ENTRY = struct.Struct("<32sQIIIdBBBx")
PAYLOAD = struct.Struct("<III")  # json length, number of token ids (or 0xFFFFFFFF: none), offsets width (0: none)
NO_IDS = 0xFFFFFFFF
INDEX_HEADER = struct.Struct("<6sH56x")  # magic, format version, reserved: one entry's size
INDEX_MAGIC = b"PXIDX\x00"
# 1: the same entries without a header; 2: without partial entries (code 4).  An index keeps the format
# it was started with; a partial entry appended to an older one is refused by older readers (unknown code).
INDEX_FORMAT = 3
READABLE_FORMATS = (1, 2, 3)
#: Finish-reason codes of index entries: fixed for good; a new reason takes a new code.
#: ``partial`` (format 3): an unfinished generation's tokens so far, never a finished record.
FINISH_CODES = {"stop": 0, "length": 1, "abort": 2, "repetition": 3, "partial": 4}
FINISH_NAMES = {code: name for name, code in FINISH_CODES.items()}


@dataclass(frozen=True)
class Entry:
    """What the index says about one stored generation."""

    key: str
    writer: str
    offset: int
    length: int
    crc: int
    tokens: int
    committed: float | None  # unix time of the commit that made it durable (status' ETA); None: recovered, unknown
    attempt: int
    finish_reason: str
    looping: bool | None = None  # the record ends in a repetition loop; None: not known (written before the flag)

    @property
    def partial(self) -> bool:
        return self.finish_reason == "partial"

    def pack(self) -> bytes:
        committed = math.nan if self.committed is None else self.committed  # NaN: not known
        fields = (self.offset, self.length, self.crc, self.tokens, committed, self.attempt)
        return ENTRY.pack(bytes.fromhex(self.key), *fields, FINISH_CODES[self.finish_reason], _flags(self.looping))


#: Flag bits of an index entry (a byte that was padding before: 0 reads as "not checked").
LOOP_CHECKED, LOOPING = 2, 1


def _flags(looping: bool | None) -> int:
    return 0 if looping is None else LOOP_CHECKED | (LOOPING if looping else 0)


def _looping(flags: int) -> bool | None:
    return bool(flags & LOOPING) if flags & LOOP_CHECKED else None


def _frame_entry(writer: str, offset: int, key: bytes, payload: bytes, crc: int) -> Entry | None:
    """The entry of a whole frame found past the index (its metadata read from the record; no commit time).

    None for a frame that passed its CRC but is not a record this procexec wrote (foreign data):
    recovery stops there, as at a torn tail.
    """
    try:
        tokens, attempt, finish, looping = _meta(_decode(payload))
    except (ValueError, TypeError, KeyError, ProcexecError, zlib.error, struct.error, UnicodeDecodeError):
        return None
    return Entry(key.hex(), writer, offset, len(payload), crc, tokens, None, attempt, finish, looping)


_IDS, _OFFSETS = "@token_ids", "@token_offsets"  # where the binary token lists go back in the record's JSON


def _encode(record: dict[str, Any]) -> bytes:
    body = dict(record)
    ids, offsets = body.get("token_ids"), body.get("token_offsets")
    n, width, tail = NO_IDS, 0, []
    if ids is not None:
        n = len(ids)
        body["token_ids"] = _IDS
        tail.append(array("I", ids).tobytes())
        if offsets is not None:
            deltas = [b - a for a, b in zip([0, *offsets], offsets)]
            width = 2 if 0 <= min(deltas, default=0) and max(deltas, default=0) < 1 << 16 else 4
            body["token_offsets"] = _OFFSETS
            tail.append(array("H" if width == 2 else "i", deltas).tobytes())
    text = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
    return zlib.compress(PAYLOAD.pack(len(text), n, width) + text + b"".join(tail), 6)


def _decode(payload: bytes) -> dict[str, Any]:
    raw = zlib.decompress(payload)
    text_len, n, width = PAYLOAD.unpack_from(raw)
    pos = PAYLOAD.size
    record = json.loads(raw[pos : pos + text_len].decode("utf-8", "surrogatepass"))
    pos += text_len
    if n != NO_IDS:
        ids = array("I")
        ids.frombytes(raw[pos : pos + 4 * n])
        record["token_ids"] = ids.tolist()
        pos += 4 * n
        if width:
            deltas = array("H" if width == 2 else "i")
            deltas.frombytes(raw[pos : pos + width * n])
            offsets, total = [], 0
            for d in deltas:
                total += d
                offsets.append(total)
            record["token_offsets"] = offsets
    return record


def _index_start(idx: Path, data: bytes) -> int:
    """Where an index's entries begin: after its header, or at 0 in format 1 (no header).

    A torn header (a kill while a new index was being started) holds no entries: its whole length.
    """
    if len(data) < INDEX_HEADER.size and data and INDEX_MAGIC.startswith(data[: len(INDEX_MAGIC)]):
        return len(data)
    if not data.startswith(INDEX_MAGIC):
        return 0
    _, version = INDEX_HEADER.unpack_from(data)
    if version not in READABLE_FORMATS:
        raise ProcexecError(
            f"{idx}: a store index of format {version}; this procexec reads formats "
            f"{', '.join(map(str, READABLE_FORMATS))}: run the procexec that wrote it, "
            "or move the store away (its generations would be made again)"
        )
    return INDEX_HEADER.size


def _read_entries(
    writer: str, idx: Path, seg_size: int, warn: Callable[[str], None] | None = None
) -> tuple[list[Entry], int, int]:
    """Whole index entries whose frame lies inside the segment: them, the indexed end and where entries begin
    (``warn`` is told when the segment ends before a frame its index names: frames are durable first, so
    only a damaged or cut segment does)."""
    data = idx.read_bytes() if idx.exists() else b""
    start = _index_start(idx, data)
    entries, end = [], 0
    for pos in range(start, len(data) - (len(data) - start) % ENTRY.size, ENTRY.size):
        key, offset, length, crc, tokens, committed, attempt, finish, flags = ENTRY.unpack_from(data, pos)
        stop = offset + FRAME.size + length
        if stop > seg_size:  # written before its frame was durable (cannot happen) or cut: stop trusting the tail
            if warn is not None:
                warn(
                    f"{idx}: entry {(pos - start) // ENTRY.size + 1} and those after it name frames past the end "
                    f"of {idx.with_suffix('.seg').name} ({seg_size} bytes: cut or damaged)"
                )
            break
        if finish not in FINISH_NAMES:
            raise ProcexecError(
                f"{idx}: entry {(pos - start) // ENTRY.size + 1} has finish-reason code {finish}, "
                f"which this procexec does not know ({FINISH_CODES}); it was written by another "
                "version: move the store away or run that version"
            )
        when = None if math.isnan(committed) else committed  # NaN: a recovered frame's, not known
        entries.append(
            Entry(key.hex(), writer, offset, length, crc, tokens, when, attempt, FINISH_NAMES[finish], _looping(flags))
        )
        end = max(end, stop)
    return entries, end, start


def _scan_frames(handle: BinaryIO, start: int, size: int) -> Iterator[tuple[int, bytes, bytes, int]]:
    """Whole frames from ``start``: (offset, raw key, payload, crc); stops at a torn or foreign tail."""
    pos = start
    while pos + FRAME.size <= size:
        handle.seek(pos)
        magic, length, key, crc = FRAME.unpack(handle.read(FRAME.size))
        if magic != MAGIC or pos + FRAME.size + length > size:
            return
        payload = handle.read(length)
        if zlib.crc32(payload) != crc:
            return
        yield pos, key, payload, crc
        pos += FRAME.size + length


def _meta(record: dict[str, Any]) -> tuple[int, int, str, bool | None]:
    """Token count, attempt, finish reason and loop flag of a record, for its index entry (no reason is guessed).

    The flag is the verdict the record carries (``provenance.loop``, judged once by the job that made it:
    ``GenerationRecord.looping``), never judged again here; None for a record written before records carried it.
    """
    finish = record.get("finish_reason")
    if finish not in FINISH_CODES:
        raise ProcexecError(
            f"record {record.get('id')!r:.60}: finish reason {finish!r:.40} has no store code "
            f"({', '.join(FINISH_CODES)})"
        )
    provenance = record.get("provenance") or {}
    looping = ends_looping(provenance["loop"], finish) if "loop" in provenance else None
    return int(record.get("num_generated_tokens") or 0), int(record.get("attempt") or 0), finish, looping


class Store:
    """One writer's view of a store directory (it reads every writer's index)."""

    def __init__(
        self, directory: str | os.PathLike[str], writer: str, commit_records: int = 64, commit_seconds: float = 10.0
    ):
        if not _WRITER.match(writer):
            raise ProcexecError(f"store writer name '{writer}' must match {_WRITER.pattern}")
        self.directory = Path(directory)
        self.writer = writer
        self.seg_path = self.directory / f"{writer}.seg"
        self.idx_path = self.directory / f"{writer}.idx"
        self.commit_records, self.commit_seconds = commit_records, commit_seconds
        self._entries: dict[str, Entry] = {}
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        # Bounded: when the filesystem falls behind the engine, put() waits rather than let
        # more than one batch queue up behind the one being written (the kill -9 bound).
        self._queue: queue.Queue[tuple[str, Any] | None] = queue.Queue(maxsize=commit_records)
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._seg: BinaryIO | None = None
        self._idx: BinaryIO | None = None

    # ------------------------------------------------------------------ reading

    def load(self, warn: Callable[[str], None] | None = None) -> int:
        """Read every writer's index (and recover unindexed whole frames); returns the number of finished
        generations (partial records are loaded too, not counted).  ``warn`` is given the problem of each stretch
        of a segment that holds no record this procexec wrote (left out: the key reads as missing)."""
        if not self.directory.is_dir():
            return 0
        old = sorted(p.name for p in self.directory.glob("*.jsonl"))
        if old:
            raise ProcexecError(
                f"{self.directory}: {old[0]} is a store file of an older procexec "
                "(JSON Lines); move it away, its generations would be made again"
            )
        for entry in latest_entries(store_segments(self.directory, warn), partials=True, warn=warn):
            self._entries[entry.key] = entry
        return sum(not e.partial for e in self._entries.values())

    def drop(self, key: str) -> None:
        """Forget the entry of ``key`` (one its reader refused): the key reads as missing, a ``put``
        stores it again, and that later frame is the one every later ``load`` finds (``_newer``).
        The segment is append-only: nothing is rewritten."""
        with self._lock:
            self._entries.pop(key, None)

    def __contains__(self, key: str) -> bool:
        return key in self._entries or key in self._pending

    def entry(self, key: str) -> Entry | None:
        return self._entries.get(key)

    def get(self, key: str) -> dict[str, Any] | None:
        if key in self._pending:
            self.flush()
        entry = self._entries.get(key)
        return None if entry is None else read_record(self.directory, entry)

    # ------------------------------------------------------------------ writing

    def put(self, key: str, record: dict[str, Any] | Callable[[], dict[str, Any]]) -> None:
        """Queue one record (or a function that builds it, run by the writer thread).

        It is durable once the commit that takes it returns: at the latest after
        ``commit_records`` more records or ``commit_seconds``, or on ``flush``/``close``.
        """
        if self._failure is not None:
            raise ProcexecError(f"{self.seg_path}: writing the store failed: {self._failure}") from self._failure
        if key in self:
            return
        if self._thread is None:
            self._open()
        with self._lock:
            self._pending.add(key)
        self._queue.put((key, record))

    def flush(self) -> None:
        """Commit everything queued (blocks until it is durable)."""
        if self._thread is not None:
            done = threading.Event()
            self._queue.put(("", done))
            done.wait()
            if self._failure is not None:
                raise ProcexecError(f"{self.seg_path}: writing the store failed: {self._failure}")

    def close(self) -> None:
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join()
        self._thread = None
        for handle in (self._seg, self._idx):
            if handle is not None:
                handle.close()
        self._seg = self._idx = None
        if self._failure is not None:
            raise ProcexecError(f"{self.seg_path}: writing the store failed: {self._failure}")

    def _open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        seg = open(self.seg_path, "a+b")
        try:
            fcntl.flock(seg.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            seg.close()
            raise ProcexecError(f"{self.seg_path}: another job is writing this store shard") from None
        size = seg.seek(0, os.SEEK_END)
        entries, end, start = _read_entries(self.writer, self.idx_path, size)
        recovered = _recovered(self.writer, seg, end, size, self.seg_path, None)  # told by load
        keep = end if not recovered else recovered[-1].offset + FRAME.size + recovered[-1].length
        idx = open(self.idx_path, "a+b")
        whole = len(entries) * ENTRY.size + (start if entries else 0)
        if idx.seek(0, os.SEEK_END) != whole:  # a torn or untrusted index tail (or a torn header)
            idx.truncate(whole)
        if whole == 0:  # a new index: its header first (an index with entries keeps the format it has)
            idx.write(INDEX_HEADER.pack(INDEX_MAGIC, INDEX_FORMAT))
        for entry in recovered:  # durable frames whose entries a kill cut off
            idx.write(entry.pack())
        if keep != size:  # a torn frame: cut before appending
            seg.truncate(keep)
        for handle in (seg, idx):
            handle.flush()
            os.fsync(handle.fileno())
        self._seg, self._idx = seg, idx
        self._thread = threading.Thread(target=self._writer, name=f"procexec-store-{self.writer}", daemon=True)
        self._thread.start()

    def _writer(self) -> None:
        batch: list[tuple[str, dict[str, Any]]] = []
        waiters: list[threading.Event] = []
        deadline = None
        stop = False
        while not stop:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                item = self._queue.get(timeout=timeout)
            except queue.Empty:
                item = ("", None)  # the time bound: commit what is there
            if item is None:
                stop = True
            elif isinstance(item[1], threading.Event):
                waiters.append(item[1])
            elif item[0]:
                batch.append(item)
                deadline = deadline or time.monotonic() + self.commit_seconds
            due = (
                stop
                or waiters
                or len(batch) >= self.commit_records
                or (deadline is not None and time.monotonic() >= deadline)
            )
            if due:
                if batch and self._failure is None:
                    try:
                        self._commit(batch)
                    except BaseException as exc:  # reported to the job by put/flush/close
                        self._failure = exc
                batch, deadline = [], None
                for waiter in waiters:
                    waiter.set()
                waiters = []

    def _commit(self, batch: list[tuple[str, dict[str, Any]]]) -> None:
        assert self._seg is not None and self._idx is not None
        offset = self._seg.seek(0, os.SEEK_END)
        frames, entries = [], []
        now = time.time()
        failure: BaseException | None = None
        built_batch = []
        for key, record in batch:  # a record that cannot be built fails the store, not the ones before it
            try:
                built_batch.append((key, record() if callable(record) else record))
            except BaseException as exc:
                failure = exc
                break
        for key, built in built_batch:
            payload = _encode(built)
            crc = zlib.crc32(payload)
            frames.append(FRAME.pack(MAGIC, len(payload), bytes.fromhex(key), crc) + payload)
            tokens, attempt, finish, looping = _meta(built)
            entries.append(Entry(key, self.writer, offset, len(payload), crc, tokens, now, attempt, finish, looping))
            offset += FRAME.size + len(payload)
        self._seg.write(b"".join(frames))
        self._seg.flush()
        os.fsync(self._seg.fileno())
        self._idx.write(b"".join(e.pack() for e in entries))
        self._idx.flush()
        os.fsync(self._idx.fileno())
        with self._lock:
            for entry in entries:
                self._entries[entry.key] = entry
                self._pending.discard(entry.key)
        if failure is not None:
            raise failure


class MisplacedFrame(ProcexecError):
    """The frame an index entry points at is another key's (a damaged entry): ``frame_key`` is the frame's own."""

    def __init__(self, frame_key: str, message: str):
        super().__init__(message)
        self.frame_key = frame_key


def frame_place(directory: Path, entry: Entry) -> str:
    """Where ``entry``'s record lies, as warnings and refusals name it."""
    return f"{directory / entry.writer}.seg: the frame of {entry.key[:12]} at byte {entry.offset}"


def read_record(directory: Path, entry: Entry) -> dict[str, Any]:
    """The record ``entry`` indexes, read from its writer's segment in ``directory`` (one line when its frame
    fails its CRC or does not decode: a damaged disk, or a writer that was not procexec)."""
    with open(directory / f"{entry.writer}.seg", "rb") as handle:
        handle.seek(entry.offset)
        head = handle.read(FRAME.size)
        payload = handle.read(entry.length)
    magic, length, key, crc = FRAME.unpack(head) if len(head) == FRAME.size else (b"", 0, b"", 0)
    if magic != MAGIC or length != entry.length:
        raise ProcexecError(f"{frame_place(directory, entry)}: no frame of that length starts there (a damaged index)")
    if key.hex() != entry.key:
        raise MisplacedFrame(key.hex(), f"{frame_place(directory, entry)} holds key {key.hex()[:12]}, not its entry's")
    if zlib.crc32(payload) != entry.crc or crc != entry.crc:
        raise ProcexecError(f"{frame_place(directory, entry)} is damaged (CRC mismatch)")
    try:
        return _decode(payload)
    except (ValueError, zlib.error, struct.error, UnicodeDecodeError) as exc:
        raise ProcexecError(
            f"{frame_place(directory, entry)} is not a record this procexec wrote ({type(exc).__name__})"
        ) from None


def _newer(entry: Entry, current: Entry | None) -> bool:
    """Whether ``entry`` replaces ``current`` for the same key: the later frame of one writer; across writers the
    later commit (a repair), a known commit over a recovered frame's unknown one."""
    if current is None:
        return True
    if entry.writer == current.writer and None in (entry.committed, current.committed):
        return entry.offset > current.offset
    if entry.committed is None or current.committed is None:
        return current.committed is None and entry.committed is not None
    if entry.committed != current.committed:
        return entry.committed > current.committed
    return entry.writer == current.writer and entry.offset > current.offset


def store_writer(stage: str, shard: int, num_shards: int) -> str:
    """A shard job's writer name: ``I-of-N`` in the full study, ``{stage}-I-of-N`` in a smoke or pilot, so that
    the cost account and status tell the study stages' segments apart without decoding a record."""
    name = f"{shard}-of-{num_shards}"
    return name if stage == "full" else f"{stage}-{name}"


def writer_stage(writer: str) -> str:
    """The study stage of a writer named by ``store_writer`` (any other name: the full study's, as before study
    stages)."""
    match = _STAGE_WRITER.match(writer)
    return match.group(1) if match else "full"


def store_segments(directory: Path, warn: Callable[[str], None] | None = None) -> list[Path]:
    """Every writer's segment of a store; ``warn`` is told of each index whose segment is gone (what it
    indexed is lost: its generations read as missing)."""
    for idx in sorted(directory.glob("*.idx")):
        if warn is not None and not idx.with_suffix(".seg").exists():
            lost = max(0, (idx.stat().st_size - INDEX_HEADER.size) // ENTRY.size)
            warn(f"{idx}: its segment {idx.with_suffix('.seg').name} is missing ({lost} indexed generations lost)")
    return sorted(directory.glob("*.seg"))


def study_segments(directory: Path, warn: Callable[[str], None] | None = None) -> list[Path]:
    """The segments that count for the study: every writer's but a smoke's (its budgets are its own)."""
    return [seg for seg in store_segments(directory, warn) if writer_stage(seg.stem) != "smoke"]


def entries_of(seg: Path, partials: bool = False, warn: Callable[[str], None] | None = None) -> list[Entry]:
    """The entries of one writer (``{writer}.seg`` + ``.idx``), index first, then unindexed whole frames.

    Finished generations only, unless ``partials``: what status, the cost account and tests count.
    ``warn`` is told of unindexed bytes that are not a torn tail but a damaged or foreign frame.
    """
    writer = seg.name.removesuffix(".seg")
    size = seg.stat().st_size
    entries, end, _ = _read_entries(writer, seg.with_suffix(".idx"), size, warn)
    if end < size:
        with open(seg, "rb") as handle:
            entries += _recovered(writer, handle, end, size, seg, warn)
    return entries if partials else [e for e in entries if not e.partial]


def latest_entries(
    segments: list[Path], partials: bool = False, warn: Callable[[str], None] | None = None
) -> list[Entry]:
    """One entry per key over ``segments``: the one a reader gets (``_newer``).  A record regenerated after
    damage supersedes the damaged one, and writers of two shard layouts that stored one key count it once."""
    latest: dict[str, Entry] = {}
    for seg in segments:
        for entry in entries_of(seg, partials, warn):
            if _newer(entry, latest.get(entry.key)):
                latest[entry.key] = entry
    return list(latest.values())


def _recovered(
    writer: str,
    handle: BinaryIO,
    start: int,
    size: int,
    seg: Path,
    warn: Callable[[str], None] | None,
) -> list[Entry]:
    """Entries of the whole frames past the index, up to the first torn or foreign one.

    A torn tail (a kill while a batch was written) is what recovery is for: silent.  Anything else it
    stops at (a damaged frame, or bytes no procexec writer made) is told to ``warn``.
    """
    entries, pos = [], start
    for offset, key, payload, crc in _scan_frames(handle, start, size):
        entry = _frame_entry(writer, offset, key, payload, crc)
        if entry is None:
            break
        entries.append(entry)
        pos = offset + FRAME.size + len(payload)
    if warn is not None and pos < size and not _torn_tail(handle, pos, size):
        warn(f"{seg}: bytes {pos}..{size} are not a record this procexec wrote (a damaged or foreign frame)")
    return entries


def _torn_tail(handle: BinaryIO, pos: int, size: int) -> bool:
    """Whether the bytes from ``pos`` are one frame cut short: a frame's start (or a part of one) whose
    stated length runs past the end of the segment."""
    handle.seek(pos)
    head = handle.read(FRAME.size)
    if len(head) < FRAME.size:
        return MAGIC.startswith(head[: len(MAGIC)])
    magic, length, _, _ = FRAME.unpack(head)
    return magic == MAGIC and pos + FRAME.size + length > size
