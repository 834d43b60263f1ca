"""TensorBoard's event files, written with the standard library alone: SageMaker's PyTorch training images ship no
tensorboard package, and `torch.utils.tensorboard` cannot be imported without it, so the trainer writes the files
itself. Only what scalars need:

- the file is a sequence of records, each `length` (uint64, little-endian), the masked CRC-32C of those 8 bytes,
  the data, and the masked CRC-32C of the data (TensorFlow's TFRecord format, which TensorBoard reads);
- each record's data is an `Event` protocol buffer (tensorflow/core/util/event.proto): wall_time (field 1, double),
  step (2, int64), and either file_version (3, string: "brain.Event:2", the first record) or a summary (5: a
  `Summary` of `Value`s, each a tag (1, string) and a simple_value (2, float));
- the file's name holds "tfevents", which TensorBoard looks for: events.out.tfevents.<seconds>.<host>.<pid>.<n>.

tests/unit/trainer/test_trainer_tensorboard.py reads what this writes with TensorBoard's own reader.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path

FILE_VERSION = b"brain.Event:2"


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        crc = n
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # Castagnoli's polynomial, reflected
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC: rotated right by 15 bits, plus a constant."""
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def record(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc(length)) + data + struct.pack("<I", masked_crc(data))


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # a negative int64 as protobuf writes it: ten bytes
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _bytes_field(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def event(wall_time: float, step: int, *, file_version: bytes | None = None, scalars: dict[str, float] | None = None) -> bytes:
    """One Event, serialized."""
    out = _varint(1 << 3 | 1) + struct.pack("<d", wall_time) + _varint(2 << 3 | 0) + _varint(step)
    if file_version is not None:
        out += _bytes_field(3, file_version)
    if scalars:
        summary = b"".join(
            _bytes_field(1, _bytes_field(1, tag.encode()) + _varint(2 << 3 | 5) + struct.pack("<f", value))
            for tag, value in scalars.items()
        )
        out += _bytes_field(5, summary)
    return out


class EventWriter:
    """Scalars to one event file in `directory`, as `torch.utils.tensorboard.SummaryWriter.add_scalar` writes them."""

    def __init__(self, directory: str | Path) -> None:
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        now = time.time()
        self.path = folder / f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}.0"
        self._file = self.path.open("ab")
        self._file.write(record(event(now, 0, file_version=FILE_VERSION)))
        self._file.flush()

    def add_scalar(self, tag: str, value: float, step: int, wall_time: float | None = None) -> None:
        self.add_scalars({tag: value}, step, wall_time)

    def add_scalars(self, values: dict[str, float], step: int, wall_time: float | None = None) -> None:
        """Each value under its tag at `step`, in one event; on disk at once (SageMaker uploads the directory while
        the job runs)."""
        if self._file.closed:
            raise ValueError(f"{self.path} is closed")
        self._file.write(record(event(time.time() if wall_time is None else wall_time, step, scalars=values)))
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
