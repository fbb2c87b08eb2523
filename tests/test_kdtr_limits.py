"""Issue 14, the C++ KDTR reader on hostile files: the 40-byte preamble and every size are checked before the
body is read or allocated (a multi-GB sparse file is rejected at once), an allocation failure is a KdtrError
(never std::bad_alloc), and a path with a NUL byte is refused instead of silently truncated."""
from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
import time
import zlib

import numpy as np
import pytest

from kdbench import _kdtr
from kdbench.kdtr import KdtrError, save

SPARSE = 8 * 2**30            # bytes: far more than the address-space limit the child process gets


def _preamble(size: int, n: int = 0, table: bytes = b"") -> bytes:
    """A valid KDTR preamble + table for a file of `size` bytes (data CRC left 0: never reached)."""
    hl = 40 + len(table)
    pre = struct.pack("<4sIQQIII", b"KDTR", 1, hl, size, n, 0, 0)
    return pre + struct.pack("<I", zlib.crc32(table, zlib.crc32(pre))) + table


def _sparse(path, head: bytes, size: int = SPARSE):
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(size)         # a hole: no disk blocks, but stat says `size` bytes
    return path


def _read_limited(path, limit_bytes: int = 2 * 2**30) -> subprocess.CompletedProcess:
    """Read `path` with the C++ reader in a child whose address space is capped (so a reader that
    allocates the whole file fails there instead of eating this machine's memory)."""
    code = textwrap.dedent(f"""
        import resource, sys, time
        from kdbench import _kdtr
        from kdbench.kdtr import KdtrError
        resource.setrlimit(resource.RLIMIT_AS, ({limit_bytes}, {limit_bytes}))
        t0 = time.perf_counter()
        try:
            _kdtr.read({str(path)!r})
            print("ok")
        except KdtrError as e:
            print(f"KdtrError {{time.perf_counter() - t0:.3f}} {{e}}")
        except BaseException as e:
            print(f"OTHER {{type(e).__name__}} {{e}}")
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_a_huge_sparse_file_that_is_not_kdtr_is_rejected_at_once(tmp_path):
    path = _sparse(tmp_path / "zeros.kdtr", b"")
    t0 = time.perf_counter()
    with pytest.raises(KdtrError, match="bad magic bytes 00 00 00 00"):
        _kdtr.read(str(path))
    assert time.perf_counter() - t0 < 1.0


def test_an_entry_past_the_end_is_rejected_before_the_body_is_read(tmp_path):
    name = b"w"
    table = struct.pack("<HBB", len(name), 3, 1) + name + struct.pack("<3Q", 4, 2**40, 16)
    path = _sparse(tmp_path / "far.kdtr", _preamble(SPARSE, 1, table))
    proc = _read_limited(path)
    assert proc.stdout.startswith("KdtrError"), proc.stdout + proc.stderr
    seconds = float(proc.stdout.split()[1])
    assert seconds < 1.0 and "past end of file" in proc.stdout


def test_a_body_too_large_to_allocate_is_a_kdtr_error(tmp_path):
    path = _sparse(tmp_path / "big.kdtr", _preamble(SPARSE))
    proc = _read_limited(path)
    assert proc.stdout.startswith("KdtrError"), proc.stdout + proc.stderr
    assert f"cannot allocate {SPARSE} bytes" in proc.stdout


def test_a_path_with_a_nul_byte_is_refused(tmp_path):
    good = tmp_path / "good.kdtr"
    save(good, {"w": np.arange(3, dtype=np.float32)})
    assert _kdtr.read(str(good))["w"][0] == "f32"
    with pytest.raises(KdtrError, match="path contains a NUL byte"):
        _kdtr.read(str(good) + "\0.evil")          # would have opened good.kdtr
    with pytest.raises(KdtrError, match="path contains a NUL byte"):
        _kdtr.write(str(tmp_path / "out.kdtr") + "\0x", [("w", "f32", [1], b"\0\0\0\0")])
    assert not (tmp_path / "out.kdtr").exists()
