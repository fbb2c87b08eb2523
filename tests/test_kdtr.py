"""KDTR container: Python <-> C++ round trips (bit-exact, every dtype, 0-d and empty), the byte
layout of plans/0006-kdtr.md, and corrupt files rejected by both readers with the same message.
"""
import struct
import zlib

import numpy as np
import pytest

from kdbench import _kdtr, kdtr  # _kdtr: built by pip install -e . (setup.py)
from kdbench.kdtr import KdtrError, load, load_with_dtypes, save

SHAPES = [(), (0,), (2, 0, 3), (7, 13), (3, 1, 5, 2)]  # 0-d, empty, empty 3-d, odd, size-1 dim
# Every case has its own recorded seed: 1000 + its index in this list.
ROUNDTRIP_CASES = [(dt, shape, 1000 + i)
                   for i, (dt, shape) in enumerate((d, s) for d in kdtr.DTYPES for s in SHAPES)]
# Bit patterns planted at the front of float tensors: quiet NaN with payload, signalling NaN,
# negative quiet NaN, -0, +inf, the smallest subnormal. Compared as bytes, never as values.
SPECIALS = {
    "f16": [0x7E01, 0x7C01, 0xFE00, 0x8000, 0x7C00, 0x0001],
    "bf16": [0x7FC1, 0x7F81, 0xFFC0, 0x8000, 0x7F80, 0x0001],
    "f32": [0x7FC00001, 0x7F800001, 0xFFC00000, 0x80000000, 0x7F800000, 0x00000001],
    "f64": [0x7FF8000000000001, 0x7FF0000000000001, 0xFFF8000000000000, 1 << 63,
            0x7FF0000000000000, 1],
}
_BITS = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def _random(dtype: str, shape: tuple, seed: int) -> np.ndarray:
    """Random bits of `dtype` (every pattern possible, NaNs included) with SPECIALS in front."""
    rng = np.random.default_rng(seed)
    npd = np.dtype(kdtr.DTYPES[dtype][1])
    n = int(np.prod(shape))
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    arr = rng.integers(0, 256, size=n * npd.itemsize, dtype=np.uint8).view(npd)
    special = SPECIALS.get(dtype, [])[:n]
    arr.view(_BITS.get(npd.itemsize, np.uint8))[:len(special)] = special
    return arr.reshape(shape)


@pytest.mark.parametrize("dtype,shape,seed", ROUNDTRIP_CASES, ids=[
    f"{d}-{'x'.join(map(str, s)) or 'scalar'}-seed{k}" for d, s, k in ROUNDTRIP_CASES])
def test_roundtrip_py_cpp_py(tmp_path, dtype, shape, seed):
    arr = _random(dtype, shape, seed)
    tail = np.arange(3, dtype=np.int8)  # a second tensor so "x" is not always last
    src, dst = tmp_path / "py.kdtr", tmp_path / "cpp.kdtr"
    save(src, {"x": arr, "tail": tail}, {"x": dtype})
    _kdtr.roundtrip(str(src), str(dst))
    assert dst.read_bytes() == src.read_bytes()  # both writers are canonical
    assert _kdtr.read(str(src))["x"] == (dtype, shape, arr.tobytes())
    for mmap in (True, False):
        got, dtypes = load_with_dtypes(dst, mmap)
        assert list(got) == ["x", "tail"] and dtypes == {"x": dtype, "tail": "i8"}
        assert got["x"].shape == shape and got["x"].dtype == arr.dtype
        assert got["x"].tobytes() == arr.tobytes() and got["tail"].tobytes() == tail.tobytes()


def test_all_dtypes_in_one_file_are_aligned(tmp_path):
    tensors = {f"t_{d}": _random(d, (5, 3), seed=7 + i) for i, d in enumerate(kdtr.DTYPES)}
    path = tmp_path / "all.kdtr"
    save(path, tensors, {"t_bf16": "bf16"})
    header = kdtr.info(path)
    assert header.file_len == path.stat().st_size and header.file_len % 64 == 0
    assert all(t.offset % 64 == 0 for t in header.tensors)
    for mmap in (True, False):
        got = load(path, mmap)
        for name, arr in got.items():
            assert arr.ctypes.data % 64 == 0, name  # in memory too, not only in the file
            assert arr.flags.writeable is not mmap, name
            assert arr.tobytes() == tensors[name].tobytes(), name


def test_cpp_writer_matches_python_writer(tmp_path):
    tensors = {"w": _random("bf16", (4, 9), seed=21), "s": _random("f64", (), seed=22),
               "e": _random("i32", (0, 5), seed=23), "é名": _random("u64", (3,), seed=24)}
    dtypes = {"w": "bf16", "s": "f64", "e": "i32", "é名": "u64"}
    _kdtr.write(str(tmp_path / "cpp.kdtr"),
                [(n, dtypes[n], a.shape, a.tobytes()) for n, a in tensors.items()])
    save(tmp_path / "py.kdtr", tensors, {"w": "bf16"})
    assert (tmp_path / "cpp.kdtr").read_bytes() == (tmp_path / "py.kdtr").read_bytes()
    got, got_dtypes = load_with_dtypes(tmp_path / "cpp.kdtr")
    assert got_dtypes == dtypes
    for n, a in tensors.items():
        assert got[n].tobytes() == a.tobytes() and got[n].shape == a.shape, n


def test_layout_matches_the_spec_table(tmp_path):
    """One i16 tensor 'a' = [1, 2, 3], encoded by hand from plans/0006-kdtr.md."""
    entry = struct.pack("<HBB", 1, 6, 1) + b"a" + struct.pack("<QQQ", 3, 128, 6)  # 29 bytes
    data = bytes(128 - 69) + struct.pack("<3h", 1, 2, 3) + bytes(192 - 134)
    data_crc = zlib.crc32(data)
    pre = b"KDTR" + struct.pack("<IQQIII", 1, 69, 192, 1, 0, data_crc)
    expected = pre + struct.pack("<I", zlib.crc32(entry, zlib.crc32(pre))) + entry + data
    save(tmp_path / "a.kdtr", {"a": np.array([1, 2, 3], dtype=np.int16)})
    assert (tmp_path / "a.kdtr").read_bytes() == expected


def test_crc32_is_zlibs():
    data = np.random.default_rng(5).integers(0, 256, 1001, dtype=np.uint8).tobytes()
    assert _kdtr.crc32(b"123456789") == 0xCBF43926 == zlib.crc32(b"123456789")
    assert _kdtr.crc32(data[500:], _kdtr.crc32(data[:500])) == zlib.crc32(data)


def test_save_converts_byte_order_and_layout(tmp_path):
    big_endian = np.arange(12, dtype=">i4").reshape(3, 4)
    strided = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    save(tmp_path / "c.kdtr", {"be": big_endian, "st": strided})
    got = load(tmp_path / "c.kdtr")
    assert got["be"].dtype == np.dtype("<i4") and np.array_equal(got["be"], big_endian)
    assert np.array_equal(got["st"], strided)


def test_bf16_helpers_match_torch():
    import torch  # a dependency of kdbench; imported here to keep collection fast
    rng = np.random.default_rng(31)
    x = rng.integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([x, np.float32([0.0, -0.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 3.4e38, np.inf])])
    ours = kdtr.f32_to_bf16_bits(x)
    theirs = torch.from_numpy(x.copy()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    ok = ~np.isnan(x)
    assert np.array_equal(ours[ok], theirs[ok])  # round to nearest, ties to even; overflow -> inf
    assert np.isnan(kdtr.bf16_bits_to_f32(ours[~ok])).all()
    assert kdtr.bf16_bits_to_f32(ours).view(np.uint32)[ok].tolist() == \
        (ours[ok].astype(np.uint32) << 16).tolist()


@pytest.mark.parametrize("tensors,dtypes,match", [
    ({"x": np.zeros(2, np.float32)}, {"y": "f32"}, r"dtypes names \['y'\] not among"),
    ({"x": np.zeros(2, np.float32)}, {"x": "bf16"}, r"only 'bf16' retags"),
    ({"x": np.zeros(2, np.int16)}, {"x": "i32"}, r"dtypes says 'i32' but the array is int16"),
    ({"x": np.zeros(2, np.complex64)}, None, r"numpy dtype complex64 cannot be stored"),
    ({"x": np.zeros(2, object)}, None, r"numpy dtype object cannot be stored"),
    ({"": np.zeros(2)}, None, r"tensor #0: empty name"),
    ({"a": np.zeros(1), 7: np.zeros(1)}, None, r"tensor name 7 is not a str"),
    ({"\ud800": np.zeros(1)}, None, r"name is not valid UTF-8"),
    ({"a\0b": np.zeros(1)}, None, r"name contains a NUL character"),
    ({"n" * 65536: np.zeros(1)}, None, r"tensor #0: name longer than 65535 bytes"),
    ({"x": np.zeros((1,) * 33)}, None, r"ndim 33 exceeds 32"),
], ids=["unknown-tag", "bf16-on-f32", "wrong-tag", "complex", "object", "empty-name", "int-name",
        "surrogate-name", "nul-name", "long-name", "ndim-33"])
def test_save_rejects_bad_requests_atomically(tmp_path, tensors, dtypes, match):
    path = tmp_path / "keep.kdtr"
    save(path, {"old": np.arange(4)})
    before = path.read_bytes()
    with pytest.raises(KdtrError, match=match):
        save(path, tensors, dtypes)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["keep.kdtr"]


@pytest.mark.parametrize("items,match", [
    ([("w", "f32", [2], bytes(8)), ("w", "f32", [1], bytes(4))], r"duplicate tensor name 'w'"),
    ([("w", "f8", [2], bytes(8))], r"w.kdtr: tensor 'w': unknown dtype 'f8' \(valid: f16, bf16,"),
    ([("w", "f32", [3], bytes(8))], r"'w': nbytes 8 != 12 implied by shape \[3\] x 4-byte f32"),
    ([("", "u8", [1], bytes(1))], r"tensor #0: empty name"),
    ([(b"\xff", "u8", [1], bytes(1))], r"tensor #0: name is not valid UTF-8"),
    ([("n" * 65536, "u8", [1], bytes(1))], r"tensor #0: name longer than 65535 bytes"),
    ([("w", "u8", [1] * 33, bytes(1))], r"ndim 33 exceeds 32"),
    ([("w", "f32", [2**31, 2**31], b"")], r"\[2147483648, 2147483648\] holds more than 2\^63-1"),
], ids=["duplicate", "dtype", "nbytes", "empty-name", "utf8", "long-name", "ndim", "absurd-shape"])
def test_cpp_write_rejects_bad_requests(tmp_path, items, match):
    with pytest.raises(KdtrError, match=match):
        _kdtr.write(str(tmp_path / "w.kdtr"), items)
    assert list(tmp_path.iterdir()) == []  # no temp file left behind


def test_verify_false_skips_only_the_data_checksum(tmp_path):
    path = tmp_path / "v.kdtr"
    save(path, {"x": np.arange(16, dtype=np.float32)})  # data: bytes [128, 192), the file's end
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF  # top byte of x[15]: covered by the data CRC only
    path.write_bytes(bytes(raw))
    with pytest.raises(KdtrError, match="data checksum mismatch"):
        load(path)
    assert load(path, verify=False)["x"].tobytes() == bytes(raw[128:])


# ---- corrupt files: both readers reject them, with the same message ---------------------------

def _encode(entries, *, version=1, magic=b"KDTR", flags=0, n=None, header_len=None, file_len=None,
            extra_header=b"", data=None):
    """A KDTR file built straight from the spec table, with valid CRCs unless told otherwise.

    entries: [(name bytes, dtype code, shape, offset, nbytes)]; data: {offset: bytes}.
    """
    table = b"".join(struct.pack("<HBB", len(nm), code, len(shape)) + nm +
                     struct.pack(f"<{len(shape) + 2}Q", *shape, off, nb)
                     for nm, code, shape, off, nb in entries) + extra_header
    hl = 40 + len(table) if header_len is None else header_len
    ends = [off + nb for _, _, _, off, nb in entries if off + nb < 2**16] + [40 + len(table)]
    fl = -(-max(ends) // 64) * 64 if file_len is None else file_len
    body = bytearray(max(fl, 40 + len(table)))
    body[40:40 + len(table)] = table
    for off, blob in (data or {}).items():
        body[off:off + len(blob)] = blob
    nt = len(entries) if n is None else n
    pre = struct.pack("<4sIQQIII", magic, version, hl, fl, nt, flags, zlib.crc32(body[hl:]))
    body[:36] = pre
    body[36:40] = struct.pack("<I", zlib.crc32(body[40:hl], zlib.crc32(pre)))
    return bytes(body)


def _w(name=b"w", code=3, shape=(4,), offset=128, nbytes=16):
    """The entry of a valid f32 tensor 'w' [4]: header 69 bytes, data at 128, file 192 bytes."""
    return (name, code, shape, offset, nbytes)


def _flip(raw: bytes, pos: int) -> bytes:
    return raw[:pos] + bytes([raw[pos] ^ 0x01]) + raw[pos + 1:]


VALID = _encode([_w()], data={128: np.arange(4, dtype=np.float32).tobytes()})
U64 = 2**64
CORRUPT = [  # (id, file bytes, regex both readers must match)
    ("empty-file", b"", r"truncated: 0 bytes is shorter than the 40-byte KDTR preamble"),
    ("truncated-preamble", VALID[:20], r"truncated: 20 bytes"),
    ("truncated-header", VALID[:60], r"file is 60 bytes but its header records 192 \(truncated"),
    ("truncated-data", VALID[:-8], r"file is 184 bytes .* \(truncated or extended\)"),
    ("extended", VALID + bytes(64), r"file is 256 bytes .* \(truncated or extended\)"),
    ("bad-magic", b"PK\x03\x04" + VALID[4:], r"bad magic bytes 50 4b 03 04 \(expected 4b 44 54 52"),
    ("version-2", _encode([_w()], version=2),
     r"unsupported KDTR version 2 \(this reader reads version 1\)"),
    ("version-0", _encode([_w()], version=0), r"unsupported KDTR version 0"),
    ("flags", _encode([_w()], flags=4), r"nonzero reserved flags 0x00000004"),
    ("data-checksum", _flip(VALID, 130), r"data checksum mismatch: stored crc32 [0-9a-f]{8}, comp"),
    ("header-checksum", _flip(VALID, 44), r"header checksum mismatch"),
    ("header-len-small", _encode([_w()], header_len=8), r"header length 8 outside \[40, 192\]"),
    ("header-len-big", _encode([_w()], header_len=4096), r"header length 4096 outside \[40, 192\]"),
    ("too-many-tensors", _encode([_w()], n=2**32 - 1),
     r"4294967295 tensors cannot fit in a 69-byte header"),
    ("absurd-shape-f32", _encode([_w(shape=(2**31, 2**31), nbytes=0)]),
     r"tensor 'w': shape \[2147483648, 2147483648\] holds more than 2\^63-1 bytes"),
    ("absurd-shape-u8", _encode([_w(code=9, shape=(2**62,), nbytes=2**62)]),
     r"offset 128 \+ 4611686018427387904 bytes past end of file \(128 bytes\)"),
    ("absurd-empty-shape", _encode([_w(shape=(0, U64 - 1), nbytes=0)]),
     r"shape \[0, 18446744073709551615\] holds more than 2\^63-1 bytes"),
    ("negative-nbytes", _encode([_w(nbytes=U64 - 16)]),
     r"nbytes 18446744073709551600 != 16 implied by shape \[4\] x 4-byte f32"),
    ("overflowing-offset", _encode([_w(shape=(16,), offset=U64 - 64, nbytes=64)]),
     r"offset 18446744073709551552 \+ 64 bytes past end of file"),
    ("offset-past-end", _encode([_w(offset=4096)], file_len=192),
     r"tensor 'w': offset 4096 \+ 16 bytes past end of file \(192 bytes\)"),
    ("misaligned-offset", _encode([_w(offset=136)]), r"'w': offset 136 is not 64-byte aligned"),
    ("offset-in-header", _encode([_w(offset=0)]),
     r"offset 0 overlaps the header or the previous tensor \(data may start at 69\)"),
    ("overlapping", _encode([_w(), _w(name=b"v", nbytes=16)]),
     r"tensor 'v': offset 128 overlaps .* \(data may start at 144\)"),
    ("duplicate-names", _encode([_w(), _w(offset=192)]), r"duplicate tensor name 'w'"),
    ("dtype-code-0", _encode([_w(code=0)]), r"tensor 'w': unknown dtype code 0"),
    ("dtype-code-99", _encode([_w(code=99)]), r"tensor 'w': unknown dtype code 99"),
    ("ndim-33", _encode([_w(shape=(1,) * 33, nbytes=4, offset=384)]), r"'w': ndim 33 exceeds 32"),
    ("empty-name", _encode([_w(name=b"")]), r"tensor #0: empty name"),
    ("name-not-utf8", _encode([_w(name=b"\xff")]), r"tensor #0: name is not valid UTF-8"),
    ("name-surrogate", _encode([_w(name=b"\xed\xa0\x80")]), r"tensor #0: name is not valid UTF-8"),
    ("name-overlong", _encode([_w(name=b"\xc0\xaf")]), r"tensor #0: name is not valid UTF-8"),
    ("name-nul", _encode([_w(name=b"w\x00")]), r"tensor #0: name contains a NUL character"),
    ("entry-past-header", _encode([_w()], header_len=65),
     r"tensor #0: entry runs past the end of the 65-byte header"),
    ("trailing-header", _encode([_w()], extra_header=bytes(8)),
     r"header has 8 unparsed trailing bytes after 1 tensors"),
]
READERS = {"py-mmap": lambda p: load(p), "py-read": lambda p: load(p, mmap=False),
           "cpp": lambda p: _kdtr.read(str(p))}


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("raw,match", [c[1:] for c in CORRUPT], ids=[c[0] for c in CORRUPT])
def test_corrupt_file_rejected(tmp_path, reader, raw, match):
    path = tmp_path / "bad.kdtr"
    path.write_bytes(raw)
    with pytest.raises(KdtrError, match=match) as err:
        READERS[reader](path)
    assert str(err.value).startswith(f"{path}: ")


def test_valid_base_file_loads(tmp_path):
    """The corrupt cases are one edit away from VALID, so VALID itself must load in both readers."""
    path = tmp_path / "ok.kdtr"
    path.write_bytes(VALID)
    expected = np.arange(4, dtype=np.float32)
    assert _kdtr.read(str(path)) == {"w": ("f32", (4,), expected.tobytes())}
    for mmap in (True, False):
        assert load(path, mmap)["w"].tobytes() == expected.tobytes()


def _resign(raw: bytearray) -> bytes:
    """Recomputes both CRCs from whatever header_len the (mutated) bytes claim."""
    if len(raw) >= 40:
        hl = min(max(struct.unpack_from("<Q", raw, 8)[0], 40), len(raw))
        raw[32:36] = struct.pack("<I", zlib.crc32(raw[hl:]))
        raw[36:40] = struct.pack("<I", zlib.crc32(raw[40:hl], zlib.crc32(raw[:36])))
    return bytes(raw)


def _outcome(read, path):
    try:
        return "ok", read(path)
    except KdtrError as e:
        return "error", str(e)


def test_fuzzed_headers_get_the_same_verdict_in_both_readers(tmp_path):
    """Random byte edits (CRCs re-signed so parsing goes deep): never a crash, and the Python and
    C++ readers agree on every file: the same tensors, or the same error message."""
    rng = np.random.default_rng(4242)
    tensors = {"w": _random("f32", (3, 5), 1), "s": _random("f64", (), 2),
               "e": _random("u8", (0,), 3)}
    save(tmp_path / "base.kdtr", tensors)
    base = (tmp_path / "base.kdtr").read_bytes()
    header_len = kdtr.info(tmp_path / "base.kdtr").header_len
    path, verdicts = tmp_path / "fuzz.kdtr", set()
    for _ in range(300):
        raw = bytearray(base)
        for pos in rng.integers(0, header_len, size=rng.integers(1, 4)):
            flip = raw[pos] ^ (1 << rng.integers(8))
            raw[pos] = rng.integers(0, 256) if rng.random() < 0.5 else flip
        if rng.random() < 0.1:
            raw = raw[:rng.integers(0, len(raw))]
        path.write_bytes(_resign(raw))
        py, py_val = _outcome(load, path)
        cpp, cpp_val = _outcome(READERS["cpp"], path)
        assert py == cpp, (py_val, cpp_val)
        if py == "ok":
            assert {k: v.tobytes() for k, v in py_val.items()} == \
                {k: v[2] for k, v in cpp_val.items()}
        else:
            assert py_val == cpp_val
        verdicts.add(py_val.split(": ", 1)[1][:20] if py == "error" else "ok")
    assert len(verdicts) >= 10  # the edits reached many different checks, not just one
