"""Golden vectors (tests/golden/*.kdtr, written by tests/golden/make_golden.py): the generator is
deterministic and current, both KDTR readers agree, a C++ round trip is byte-identical, and the current
numpy references still produce every stored output (the regression net for the references)."""
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from kdbench import _kdtr, kdtr
from kdbench.check import compare
from kdbench.config import Tolerance

GOLDEN = Path(__file__).resolve().parent / "golden"
_spec = importlib.util.spec_from_file_location("make_golden", GOLDEN / "make_golden.py")
mg = sys.modules.setdefault("make_golden", importlib.util.module_from_spec(_spec))  # dataclasses need it there
_spec.loader.exec_module(mg)

FAMILIES = list(mg.CASES)
SIZE_LIMIT = 2 * 1024 * 1024  # bytes, all files together (they are committed)


def _load(path: Path):
    return kdtr.load_with_dtypes(path, mmap=False)


def _cases():
    for family in FAMILIES:
        tensors, tags = _load(GOLDEN / f"{family}.kdtr")
        for name, case in mg.split_cases(tensors, tags).items():
            yield pytest.param(family, case, id=f"{family}-{name}")


CASES = list(_cases())


def assert_output(name: str, got, want: np.ndarray, tol) -> None:
    """Bit-exact (dtype, shape, bytes) unless a tolerance (atol, rtol) is declared for this output."""
    got = np.asarray(got)
    assert (got.dtype, got.shape) == (want.dtype, want.shape), f"{name}: {got.dtype} {got.shape} vs stored"
    if got.tobytes() == want.tobytes():
        return
    res = compare(got, want, Tolerance(atol=tol[0], rtol=tol[1]) if tol else Tolerance())
    assert tol is not None and res.passed, f"{name}: differs from the stored output: {res}"


# ------------------------------------------------------------------------------ generator: determinism

def test_regeneration_is_byte_identical(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    for pa, pb in zip(mg.write_all(a), mg.write_all(b)):
        assert pa.read_bytes() == pb.read_bytes(), f"{pa.name}: two runs of make_golden.py differ"


@pytest.mark.parametrize("family", FAMILIES)
def test_committed_inputs_and_meta_are_current(tmp_path, family):
    """The committed file has the regenerated file's tensors (names, order, dtypes, shapes); its meta and
    inputs are byte-identical (outputs are the references' job: test_references_reproduce_outputs)."""
    new, new_tags = _load(mg.write_family(family, tmp_path))
    old, old_tags = _load(GOLDEN / f"{family}.kdtr")
    assert list(old) == list(new) and old_tags == new_tags, f"{family}: stale file, rerun make_golden.py"
    for name, arr in old.items():
        assert arr.shape == new[name].shape, name
        if ".out." not in name:
            assert arr.tobytes() == new[name].tobytes(), f"{name}: stale input or meta"


def test_total_size_stays_small():
    total = sum(p.stat().st_size for p in GOLDEN.glob("*.kdtr"))
    assert sorted(p.stem for p in GOLDEN.glob("*.kdtr")) == sorted(FAMILIES)
    assert total <= SIZE_LIMIT, f"golden files total {total} bytes > {SIZE_LIMIT}"


# ----------------------------------------------------------------------------------- C++ vs Python KDTR

@pytest.mark.parametrize("family", FAMILIES)
def test_cpp_reader_returns_the_python_bytes(family):
    path = GOLDEN / f"{family}.kdtr"
    tensors, tags = _load(path)
    cpp = _kdtr.read(str(path))
    assert list(cpp) == list(tensors)
    for name, arr in tensors.items():
        dtype, shape, raw = cpp[name]
        assert (dtype, tuple(shape)) == (tags[name], arr.shape), name
        assert raw == arr.tobytes(), f"{name}: C++ bytes differ from numpy's"


@pytest.mark.parametrize("family", FAMILIES)
def test_cpp_roundtrip_is_byte_identical(tmp_path, family):
    src = GOLDEN / f"{family}.kdtr"
    _kdtr.roundtrip(str(src), str(tmp_path / "rt.kdtr"))
    assert (tmp_path / "rt.kdtr").read_bytes() == src.read_bytes()


# --------------------------------------------------------------------------- references vs stored outputs

@pytest.mark.parametrize("family, case", CASES)
def test_references_reproduce_outputs(family, case):
    meta = case["meta"]
    assert (meta["family"], sorted(meta)) == (family, ["case", "family", "note", "params", "seed", "tolerance"])
    tolerance = meta["tolerance"]
    assert set(tolerance) <= set(case["out"]), f"tolerance for unknown outputs {set(tolerance) - set(case['out'])}"
    assert all(case["out"][k].dtype.kind == "f" for k in tolerance), "a tolerance is declared on an integer output"
    got = mg.COMPUTE[family](case["in"], case["in_tags"], meta["params"])
    assert list(got) == list(case["out"])
    for name, want in case["out"].items():
        assert_output(f"{meta['case']}.out.{name}", got[name], want, tolerance.get(name))


def _case(family: str, name: str) -> dict:
    tensors, tags = _load(GOLDEN / f"{family}.kdtr")
    return mg.split_cases(tensors, tags)[name]


def test_anchors_from_the_notes():
    """Values written in ddtree.md §2.6 (and by hand in make_golden.py), not taken from the references."""
    out = _case("tree_build", "worked_example")["out"]
    assert out["tokens"].tolist() == [7, 10, 20, 11, 30, 20, 31]
    assert out["parents"].tolist() == [-1, 0, 1, 0, 2, 3, 2]
    assert out["first_child"].tolist() == [1, 2, 4, 5, -1, -1, -1]
    assert out["next_sibling"].tolist() == [-1, 3, -1, -1, 6, -1, -1]
    np.testing.assert_allclose(np.exp(out["scores"]), [1, .6, .42, .3, .231, .21, .147], rtol=1e-6)
    greedy = _case("tree_accept", "greedy_worked")["out"]
    assert (greedy["accepted"].tolist(), int(greedy["bonus"])) == ([0, 1, 2, 6], 99)
    boundary = _case("tree_accept", "sampled_boundary")["out"]
    assert (boundary["accepted"].tolist(), int(boundary["bonus"])) == ([0, 3], 21)
    assert boundary["sampled"][:4].tolist() == [11, 21, 30, 21]  # strict t < c[j]; zero-prob 20 skipped
    kv = _case("kv_compact", "worked_keep")
    cache, past = kv["in"]["cache"], int(kv["in"]["past_len"])
    np.testing.assert_array_equal(kv["out"]["cache"][:, past:past + 4], cache[:, past + np.array([0, 1, 2, 6])])
    tie = _case("tree_build", "tie_heavy")["out"]
    assert tie["scores"][1:5].tolist() == [0.0] * 4 and set(tie["scores"][5:31]) <= {-1e4, -10001.0, -10002.0}


def test_meta_is_sorted_json():
    tensors, _ = _load(GOLDEN / "tree_build.kdtr")
    text = bytes(tensors["worked_example.meta"]).decode()
    assert text == json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
