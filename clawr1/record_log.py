"""An append-only record log that survives kill -9.

Each record is `length (4 bytes) | crc32 (4 bytes) | msgpack body`. `append`
returns only after the bytes are written and (optionally) fsynced. On open,
records are replayed. A crash mid-write can only damage the end of the file: a
bad record with nothing valid after it is such a torn tail, and is cut off, so
the file always ends at a whole record. A bad record followed by good ones is
not a torn write but corruption: the log refuses to open, naming the file and
the offset, and changes nothing, so no record after it is lost.
"""
from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path
from typing import Any, Iterator, Optional

import msgspec

_HEAD = struct.Struct("<II")


class CorruptLog(RuntimeError):
    """A damaged record in the middle of a log (not a torn tail): refused, nothing changed."""


def _record_end(data: bytes, offset: int) -> Optional[int]:
    """Where the record at `offset` ends if one whole, intact record starts there; else None."""
    if offset + _HEAD.size > len(data):
        return None
    length, crc = _HEAD.unpack_from(data, offset)
    end = offset + _HEAD.size + length
    if length == 0 or end > len(data) or zlib.crc32(data[offset + _HEAD.size:end]) != crc:
        return None  # a body is never empty: a run of zero bytes is not a record
    return end


def _next_intact_record(data: bytes, start: int) -> Optional[int]:
    """The first offset at or after `start` where an intact record begins, if any."""
    for offset in range(start, len(data) - _HEAD.size):
        if _record_end(data, offset) is not None:
            return offset
    return None


def read_records(path: Path, record_type: Any) -> list[Any]:
    """Every intact record of a log, read only (no cut, no lock): for inspecting a log a process is writing."""
    decoder, data, out, offset = msgspec.msgpack.Decoder(record_type), Path(path).read_bytes(), [], 0
    while (end := _record_end(data, offset)) is not None:
        out.append(decoder.decode(data[offset + _HEAD.size:end]))
        offset = end
    return out


class RecordLog:
    def __init__(self, path: Path, record_type: Any, fsync: bool = True):
        self.path = Path(path)
        self.fsync = fsync
        self._encoder = msgspec.msgpack.Encoder()
        self.record_type = record_type
        self._decoder = msgspec.msgpack.Decoder(record_type)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch(exist_ok=True)
        self.torn_bytes = 0
        self._fd = -1

    def replay(self) -> Iterator[Any]:
        """Yield every record, then cut off a torn tail and open for appending.

        Raises CorruptLog (before yielding anything) when a damaged record has intact ones after it, or
        when an intact record cannot be read as a record of this log's type."""
        data = self.path.read_bytes()
        records, good = self._read_all(data)
        yield from records
        self.torn_bytes = len(data) - good
        if self.torn_bytes:
            with open(self.path, "r+b") as f:
                f.truncate(good)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)

    def _read_all(self, data: bytes) -> tuple[list[Any], int]:
        records, offset = [], 0
        while offset < len(data):
            end = _record_end(data, offset)
            if end is None:
                later = _next_intact_record(data, offset + 1)
                if later is not None:
                    raise CorruptLog(f"{self.path}: damaged record at byte {offset}, but intact records follow (from "
                                     f"byte {later}): this is corruption, not a torn write. Refusing to open it; "
                                     f"nothing was changed. Inspect or restore the file before starting again.")
                break  # a torn tail
            try:
                records.append(self._decoder.decode(data[offset + _HEAD.size:end]))
            except msgspec.DecodeError as e:
                raise CorruptLog(f"{self.path}: the record at byte {offset} is intact but not a valid "
                                 f"{self._decoder.type}: {e} (written by another schema version?)") from None
            offset = end
        return records, offset

    def append(self, record: Any) -> None:
        self.append_many([record])

    def append_many(self, records: list[Any]) -> None:
        """Write records and make them durable with one fsync (group commit)."""
        if self._fd < 0:
            raise RuntimeError("replay() the log before appending")
        chunks = []
        for r in records:
            body = self._encoder.encode(r)
            chunks.append(_HEAD.pack(len(body), zlib.crc32(body)) + body)
        os.write(self._fd, b"".join(chunks))
        if self.fsync:
            os.fsync(self._fd)

    def sync(self) -> None:
        """fsync what was appended (for a log opened with fsync=False that commits in groups)."""
        os.fsync(self._fd)

    def rewrite(self, records: list[Any]) -> None:
        """Replace the whole log by `records`, atomically (written aside, fsynced, renamed over it); then open
        for appending again. A crash leaves either the old log or the new one."""
        tmp = self.path.with_name(self.path.name + ".rewrite")
        tmp.unlink(missing_ok=True)
        fresh = RecordLog(tmp, self.record_type, fsync=False)
        list(fresh.replay())
        fresh.append_many(records)
        fresh.sync()
        fresh.close()
        self.close()
        os.replace(tmp, self.path)
        list(self.replay())

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
