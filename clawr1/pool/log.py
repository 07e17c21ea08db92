"""An append-only record log that survives kill -9.

Each record is `length (4 bytes) | crc32 (4 bytes) | msgpack body`. `append`
returns only after the bytes are written and (optionally) fsynced. On open,
records are replayed; a torn tail (a crash mid-write) fails its length or crc
check and is cut off, so the file always ends at a whole record.
"""
from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path
from typing import Any, Iterator

import msgspec

_HEAD = struct.Struct("<II")


class RecordLog:
    def __init__(self, path: Path, record_type: Any, fsync: bool = True):
        self.path = Path(path)
        self.fsync = fsync
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(record_type)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch(exist_ok=True)
        self.torn_bytes = 0
        self._fd = -1

    def replay(self) -> Iterator[Any]:
        """Yield every whole record, then cut off a torn tail and open for appending."""
        data = self.path.read_bytes()
        good = 0
        while good + _HEAD.size <= len(data):
            length, crc = _HEAD.unpack_from(data, good)
            body = data[good + _HEAD.size: good + _HEAD.size + length]
            if len(body) < length or zlib.crc32(body) != crc:
                break
            yield self._decoder.decode(body)
            good += _HEAD.size + length
        self.torn_bytes = len(data) - good
        if self.torn_bytes:
            with open(self.path, "r+b") as f:
                f.truncate(good)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)

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

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
