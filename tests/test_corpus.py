"""The corpus is fixed by its manifest (sha256 per file, checked on build and on load), the shipped prompt sets
are held out from training, and the scenario schema keeps the trained drafter and text prompts to kdbench-pair."""
from __future__ import annotations

import json
import lzma

import pytest

from kdbench import corpus, prompts, tokenizer
from kdbench.errors import UserError
from kdbench.shapes import GenerationShape


@pytest.fixture
def fake_root(tmp_path, monkeypatch):
    """A two-file stdlib-like root and a manifest over it."""
    root = tmp_path / "lib"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text('"""Doc."""\nx = 1\n')
    (root / "pydoc_data").mkdir()
    (root / "pydoc_data" / "topics.py").write_text("# header\ntopics = {'if': 'The if statement ...', 'for': 'Loops.'}\n")
    monkeypatch.setattr(corpus, "roots", lambda: {"stdlib": root})
    files = [{"root": "stdlib", "path": p, "category": c, "sha256": corpus._sha((root / p).read_bytes()), "bytes": 0}
             for p, c in (("pkg/a.py", "code"), ("pydoc_data/topics.py", "prose"))]
    man = tmp_path / "manifest.json"
    man.write_text(json.dumps({"python": corpus.PYTHON, "files": files}))
    return root, man


def test_build_and_load_round_trip(fake_root, tmp_path):
    root, man = fake_root
    out = corpus.build(tmp_path / "c.jsonl.xz", man)
    docs = corpus.load(out, man)
    assert [d.id for d in docs] == ["stdlib:pkg/a.py", "stdlib:pydoc_data/topics.py#for", "stdlib:pydoc_data/topics.py#if"]
    assert docs[0].text == '"""Doc."""\nx = 1\n' and docs[2].text == "The if statement ..."
    assert {d.split for d in docs} <= {"train", "heldout"}


def test_changed_source_file_is_named_on_build(fake_root, tmp_path):
    root, man = fake_root
    (root / "pkg" / "a.py").write_text("x = 2\n")
    with pytest.raises(UserError, match=r"a\.py: sha256 differs"):
        corpus.build(tmp_path / "c.jsonl.xz", man)


def test_tampered_corpus_is_named_on_load(fake_root, tmp_path):
    root, man = fake_root
    out = corpus.build(tmp_path / "c.jsonl.xz", man)
    with lzma.open(out, "rt") as f:
        rows = [json.loads(line) for line in f]
    rows[0]["text"] += " "
    with lzma.open(out, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with pytest.raises(UserError, match=r"stdlib:pkg/a\.py does not match"):
        corpus.load(out, man)
    out.write_bytes(b"not xz")
    with pytest.raises(UserError, match="cannot read the built corpus"):
        corpus.load(out, man)


def test_shipped_manifest_pins_the_interpreter():
    man = corpus.load_manifest()
    assert man["python"] == "3.11.7"
    cats = {f["category"] for f in man["files"]}
    assert cats == set(corpus.CATEGORIES)
    assert len({(f["root"], f["path"]) for f in man["files"]}) == len(man["files"]) > 500
    assert all(len(f["sha256"]) == 64 for f in man["files"])


@pytest.mark.parametrize("category", corpus.CATEGORIES)
def test_prompt_sets_are_held_out_and_long_enough(category):
    rows = prompts.load(category)
    assert len(rows) >= 20 and len({r["id"] for r in rows}) == len(rows)
    files = {f"{f['root']}:{f['path']}": f for f in corpus.load_manifest()["files"]}
    for r in rows:
        assert r["category"] == category
        assert files[r["source"].split("#")[0]]["category"] == category
        assert corpus._split(r["source"], category) == "heldout"     # never in the training stream
    ids = prompts.token_prompts(category, len(rows), 256, tokenizer.load())
    assert all(len(x) == 256 for x in ids)


@pytest.mark.parametrize("kw, key", [({"model": "tiny", "drafter": "trained"}, "drafter"),
                                     ({"model": "tiny", "category": "code"}, "category"),
                                     ({"model": "kdbench-pair", "drafter": "trained", "draft_len": 7}, "draft_len"),
                                     ({"model": "kdbench-pair", "category": "prose", "prompts": 33}, "prompts"),
                                     ({"model": "kdbench-pair", "category": "mixed", "prompt_len": 300}, "prompt_len")])
def test_schema_keeps_the_trained_pair_options_to_its_model(kw, key):
    bad = GenerationShape(**kw).validate()
    assert bad and bad[0] == key
    assert GenerationShape(model="kdbench-pair", drafter="trained", category="mixed").validate() is None
