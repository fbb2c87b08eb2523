"""KDTR: a little-endian container of named tensors (golden test vectors, traces, checkpoints).

Pure numpy + stdlib; csrc/kdtr.h is the independent C++ implementation.
Byte layout and design notes: plans/0006-kdtr.md.
"""
from __future__ import annotations

import contextlib
import mmap as _mmap
import os
import secrets
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

MAGIC = b"KDTR"
VERSION = 1
# magic, version, header_len, file_len, n_tensors, flags, data_crc32, header_crc32 (40 bytes)
PREAMBLE = struct.Struct("<4sIQQIIII")
ENTRY_HEAD = struct.Struct("<HBB")  # name_len, dtype code, ndim; then name, shape, offset, nbytes
ALIGN = 64  # every data offset is a multiple of this (cache line; AVX-512 and GPU copy friendly)
MAX_NDIM = 32
MAX_BYTES = 2**63 - 1  # sizes must fit a signed 64-bit int (numpy intp, off_t)
MIN_ENTRY = ENTRY_HEAD.size + 1 + 16  # a 1-byte name, no dims, offset, nbytes

# name -> (code, little-endian numpy dtype). bf16 has no numpy dtype: its raw bits travel as uint16.
DTYPES = {
    "f16": (1, "<f2"), "bf16": (2, "<u2"), "f32": (3, "<f4"), "f64": (4, "<f8"),
    "i8": (5, "i1"), "i16": (6, "<i2"), "i32": (7, "<i4"), "i64": (8, "<i8"),
    "u8": (9, "u1"), "u16": (10, "<u2"), "u32": (11, "<u4"), "u64": (12, "<u8"),
    "bool": (13, "?"),
}
_BY_CODE = {code: name for name, (code, _) in DTYPES.items()}
_NUMPY = {name: np.dtype(npd) for name, (_, npd) in DTYPES.items()}
_NATURAL = {np.dtype(npd): name for name, (_, npd) in DTYPES.items() if name != "bf16"}


class KdtrError(ValueError):
    """A malformed KDTR file or save request; the message names the file and what is wrong."""


@dataclass(frozen=True)
class TensorInfo:
    """One header table entry."""

    name: str
    dtype: str              # a DTYPES key
    shape: tuple[int, ...]
    offset: int             # bytes from the start of the file, a multiple of ALIGN
    nbytes: int


@dataclass(frozen=True)
class Header:
    header_len: int         # preamble + table, bytes
    file_len: int
    data_crc: int           # CRC-32 of bytes [header_len, file_len)
    tensors: tuple[TensorInfo, ...]


def save(path, tensors: Mapping[str, np.ndarray], dtypes: Mapping[str, str] | None = None) -> None:
    """Write `tensors` (in dict order) atomically: a temp file beside `path`, fsync, os.replace.

    dtypes[name] may tag a tensor; the only tag that changes anything is "bf16", which marks a
    uint16 array as raw bfloat16 bits (see f32_to_bf16_bits). Other tags must match the array.
    """
    p = os.fspath(path)
    arrays, header = _plan(p, tensors, dict(dtypes or {}))
    tmp = f"{p}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        with open(tmp, "xb") as f:
            data_crc = _write_data(f, arrays, header)
            f.seek(0)
            f.write(_encode_header(header, data_crc))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def load(path, mmap: bool = True, *, verify: bool = True) -> dict[str, np.ndarray]:
    """name -> array (bf16 tensors come back as uint16 bits; load_with_dtypes says which)."""
    return load_with_dtypes(path, mmap, verify=verify)[0]


def load_with_dtypes(path, mmap: bool = True, *, verify: bool = True
                     ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(name -> array, name -> KDTR dtype name). Arrays are 64-byte aligned in memory.

    mmap=True: read-only views of one read-only memory map (pages load on first touch; the
    map stays open while any array lives). mmap=False: writable views of one in-memory copy.
    verify=False skips the data CRC (a full read); the header CRC and all bounds are always checked.
    """
    p = os.fspath(path)
    with open(p, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        header = _read_header(p, f, size)
        if mmap:
            buf = _mmap.mmap(f.fileno(), 0, access=_mmap.ACCESS_READ)
        else:
            buf = _read_aligned(p, f, size)
    if verify:
        crc = zlib.crc32(memoryview(buf)[header.header_len:])
        if crc != header.data_crc:
            raise KdtrError(f"{p}: data checksum mismatch: stored crc32 {header.data_crc:08x}, "
                            f"computed {crc:08x}")
    arrays = {t.name: _view(buf, t) for t in header.tensors}
    return arrays, {t.name: t.dtype for t in header.tensors}


def info(path) -> Header:
    """The parsed, checked header alone (no data read, data CRC not verified)."""
    p = os.fspath(path)
    with open(p, "rb") as f:
        return _read_header(p, f, os.fstat(f.fileno()).st_size)


def f32_to_bf16_bits(x) -> np.ndarray:
    """Round float32 values to bfloat16 (nearest, ties to even) and return the uint16 bits.

    Inputs of other dtypes are first cast to float32; NaN becomes 0x7fc0 with its sign kept.
    """
    f = np.asarray(x, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = (bits >> 16) & 0x8000 | 0x7FC0
    return np.where(np.isnan(f), nan, rounded).astype(np.uint16)


def bf16_bits_to_f32(bits) -> np.ndarray:
    """Widen bfloat16 bits (uint16) to float32, exactly (NaN payloads kept)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


# ---- writing ---------------------------------------------------------------------------------

def _plan(p: str, tensors: Mapping[str, np.ndarray], tags: dict[str, str]
          ) -> tuple[list[np.ndarray], Header]:
    """Checks every tensor and lays out the canonical file (same layout as csrc/kdtr.h)."""
    unknown = sorted(set(tags) - set(tensors))
    if unknown:
        raise KdtrError(f"{p}: dtypes names {unknown} not among the tensors {list(tensors)}")
    arrays, entries, names = [], [], set()
    for i, (name, value) in enumerate(tensors.items()):
        arr = np.asarray(value)
        dtype = _resolve_dtype(p, name, arr, tags.get(name))
        arr = np.asarray(arr, dtype=_NUMPY[dtype], order="C")  # little-endian; keeps 0-d
        raw = (name, DTYPES[dtype][0], tuple(int(d) for d in arr.shape), 0, arr.nbytes)
        entries.append(_check_tensor(p, i, raw, names))
        arrays.append(arr)
    header_len = PREAMBLE.size + sum(_entry_size(t) for t in entries)
    placed, end = [], header_len
    for t in entries:
        offset = _align(end)
        placed.append(TensorInfo(t.name, t.dtype, t.shape, offset, t.nbytes))
        end = offset + t.nbytes
    if end > MAX_BYTES:
        raise KdtrError(f"{p}: total size {end} exceeds 2^63-1 bytes")
    return arrays, Header(header_len, _align(end), 0, tuple(placed))


def _resolve_dtype(p: str, name, arr: np.ndarray, tag: str | None) -> str:
    if not isinstance(name, str):
        raise KdtrError(f"{p}: tensor name {name!r} is not a str")
    natural = _NATURAL.get(arr.dtype.newbyteorder("<"))
    if tag is None and natural is not None:
        return natural
    if tag is not None and (tag == natural or (tag == "bf16" and natural == "u16")):
        return tag
    if tag is None:
        raise KdtrError(f"{p}: tensor '{name}': numpy dtype {arr.dtype} cannot be stored "
                        f"(storable: {sorted(_NATURAL.values())}; bf16 as uint16 bits)")
    raise KdtrError(f"{p}: tensor '{name}': dtypes says {tag!r} but the array is {arr.dtype} "
                    "(only 'bf16' retags, and it needs a uint16 array of raw bits)")


def _write_data(f, arrays: list[np.ndarray], header: Header) -> int:
    """Writes a placeholder header, the padded blobs and the tail; returns the data CRC-32."""
    f.write(bytes(header.header_len))  # the real header needs the data CRC, known only at the end
    crc, pos = 0, header.header_len
    for arr, t in zip(arrays, header.tensors):
        pad, raw = bytes(t.offset - pos), arr.reshape(-1).view(np.uint8)
        crc = zlib.crc32(raw, zlib.crc32(pad, crc))
        f.write(pad)
        f.write(raw)
        pos = t.offset + t.nbytes
    tail = bytes(header.file_len - pos)
    f.write(tail)
    return zlib.crc32(tail, crc)


def _encode_header(header: Header, data_crc: int) -> bytes:
    table = b"".join(_encode_entry(t) for t in header.tensors)
    pre = PREAMBLE.pack(MAGIC, VERSION, header.header_len, header.file_len, len(header.tensors),
                        0, data_crc, 0)[:36]
    return pre + struct.pack("<I", zlib.crc32(table, zlib.crc32(pre))) + table


def _encode_entry(t: TensorInfo) -> bytes:
    name = t.name.encode("utf-8")
    head = ENTRY_HEAD.pack(len(name), DTYPES[t.dtype][0], len(t.shape))
    return head + name + struct.pack(f"<{len(t.shape) + 2}Q", *t.shape, t.offset, t.nbytes)


def _entry_size(t: TensorInfo) -> int:
    return ENTRY_HEAD.size + len(t.name.encode("utf-8")) + 8 * len(t.shape) + 16


def _align(x: int) -> int:
    return -(-x // ALIGN) * ALIGN


# ---- reading ---------------------------------------------------------------------------------

def _read_header(p: str, f, size: int) -> Header:
    """Checks the preamble, bounds the header, checks its CRC, then parses and checks the table."""
    pre = f.read(PREAMBLE.size)
    header_len, file_len, n, data_crc = _check_preamble(p, pre, size)
    head = pre + f.read(header_len - PREAMBLE.size)
    if len(head) != header_len:
        raise KdtrError(f"{p}: truncated while reading: header is {header_len} bytes, "
                        f"got {len(head)}")
    stored = struct.unpack_from("<I", head, 36)[0]
    crc = zlib.crc32(memoryview(head)[PREAMBLE.size:], zlib.crc32(head[:36]))
    if crc != stored:
        raise KdtrError(f"{p}: header checksum mismatch: stored crc32 {stored:08x}, "
                        f"computed {crc:08x}")
    tensors, names, pos, min_offset = [], set(), PREAMBLE.size, header_len
    for i in range(n):
        raw, pos = _parse_entry(p, i, head, pos)
        t = _check_tensor(p, i, raw, names)
        _check_placement(p, t, min_offset, file_len)
        min_offset = t.offset + t.nbytes
        tensors.append(t)
    if pos != header_len:
        raise KdtrError(f"{p}: header has {header_len - pos} unparsed trailing bytes "
                        f"after {n} tensors")
    return Header(header_len, file_len, data_crc, tuple(tensors))


def _check_preamble(p: str, pre: bytes, size: int) -> tuple[int, int, int, int]:
    if size < PREAMBLE.size or len(pre) < PREAMBLE.size:
        raise KdtrError(f"{p}: truncated: {size} bytes is shorter than the 40-byte KDTR preamble")
    magic, version, header_len, file_len, n, flags, data_crc, _ = PREAMBLE.unpack(pre)
    if magic != MAGIC:
        got = " ".join(f"{b:02x}" for b in magic)
        raise KdtrError(f"{p}: bad magic bytes {got} (expected 4b 44 54 52 = 'KDTR')")
    if version != VERSION:
        raise KdtrError(f"{p}: unsupported KDTR version {version} (this reader reads version 1)")
    if flags != 0:
        raise KdtrError(f"{p}: nonzero reserved flags 0x{flags:08x}")
    if file_len != size:
        raise KdtrError(f"{p}: file is {size} bytes but its header records {file_len} "
                        "(truncated or extended)")
    if not PREAMBLE.size <= header_len <= size:
        raise KdtrError(f"{p}: header length {header_len} outside [40, {size}]")
    if n > (header_len - PREAMBLE.size) // MIN_ENTRY:
        raise KdtrError(f"{p}: {n} tensors cannot fit in a {header_len}-byte header "
                        f"(each entry takes at least {MIN_ENTRY} bytes)")
    return header_len, file_len, n, data_crc


def _parse_entry(p: str, i: int, head: bytes, pos: int) -> tuple[tuple, int]:
    """Raw (name bytes, code, shape, offset, nbytes) at head[pos:], every length checked first."""
    past = f"{p}: tensor #{i}: entry runs past the end of the {len(head)}-byte header"
    if len(head) - pos < ENTRY_HEAD.size:
        raise KdtrError(past)
    name_len, code, ndim = ENTRY_HEAD.unpack_from(head, pos)
    if len(head) - pos < ENTRY_HEAD.size + name_len + 8 * ndim + 16:
        raise KdtrError(past)
    start = pos + ENTRY_HEAD.size
    name = head[start:start + name_len]
    *shape, offset, nbytes = struct.unpack_from(f"<{ndim + 2}Q", head, start + name_len)
    return (name, code, tuple(shape), offset, nbytes), start + name_len + 8 * ndim + 16


def _check_tensor(p: str, i: int, raw: tuple, names: set) -> TensorInfo:
    """Name, dtype, ndim, shape and nbytes agree (shared by reader and writer, as in kdtr.h)."""
    name, code, shape, offset, nbytes = raw
    if isinstance(name, str):
        try:
            name = name.encode("utf-8")
        except UnicodeEncodeError:
            raise KdtrError(f"{p}: tensor #{i}: name is not valid UTF-8") from None
    if not name:
        raise KdtrError(f"{p}: tensor #{i}: empty name")
    if len(name) > 0xFFFF:
        raise KdtrError(f"{p}: tensor #{i}: name longer than 65535 bytes")
    try:
        name = name.decode("utf-8")
    except UnicodeDecodeError:
        raise KdtrError(f"{p}: tensor #{i}: name is not valid UTF-8") from None
    if "\0" in name:  # C strings (and error messages) would cut it short
        raise KdtrError(f"{p}: tensor #{i}: name contains a NUL character")
    if name in names:
        raise KdtrError(f"{p}: duplicate tensor name '{name}'")
    names.add(name)
    where = f"{p}: tensor '{name}'"
    if code not in _BY_CODE:
        raise KdtrError(f"{where}: unknown dtype code {code}")
    if len(shape) > MAX_NDIM:
        raise KdtrError(f"{where}: ndim {len(shape)} exceeds {MAX_NDIM}")
    dtype = _BY_CODE[code]
    want = _shape_bytes(where, shape, _NUMPY[dtype].itemsize)
    if nbytes != want:
        raise KdtrError(f"{where}: nbytes {nbytes} != {want} implied by shape {_fmt(shape)} "
                        f"x {_NUMPY[dtype].itemsize}-byte {dtype}")
    return TensorInfo(name, dtype, shape, offset, nbytes)


def _shape_bytes(where: str, shape: tuple[int, ...], itemsize: int) -> int:
    """Bytes of the shape; the product of the non-zero dims x itemsize must stay <= 2^63-1."""
    nonzero = itemsize
    for d in shape:
        nonzero *= d or 1
    if nonzero > MAX_BYTES:
        raise KdtrError(f"{where}: shape {_fmt(shape)} holds more than 2^63-1 bytes")
    return 0 if 0 in shape else nonzero


def _check_placement(p: str, t: TensorInfo, min_offset: int, file_len: int) -> None:
    where, off = f"{p}: tensor '{t.name}'", f"offset {t.offset}"
    if t.offset % ALIGN:
        raise KdtrError(f"{where}: {off} is not 64-byte aligned")
    if t.offset < min_offset:
        raise KdtrError(f"{where}: {off} overlaps the header or the previous tensor "
                        f"(data may start at {min_offset})")
    if t.offset + t.nbytes > file_len:
        raise KdtrError(f"{where}: {off} + {t.nbytes} bytes past end of file ({file_len} bytes)")


def _fmt(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _read_aligned(p: str, f, size: int) -> np.ndarray:
    """The whole file in a writable uint8 buffer whose first byte is 64-byte aligned."""
    raw = np.empty(size + ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % ALIGN
    buf = raw[start:start + size]
    f.seek(0)
    if f.readinto(buf) != size:
        raise KdtrError(f"{p}: truncated while reading: expected {size} bytes")
    return buf


def _view(buf, t: TensorInfo) -> np.ndarray:
    dt = _NUMPY[t.dtype]
    if t.nbytes == 0:
        return np.empty(t.shape, dtype=dt)  # nothing to map (the offset may equal the file length)
    flat = np.frombuffer(buf, dtype=dt, count=t.nbytes // dt.itemsize, offset=t.offset)
    return flat.reshape(t.shape)
