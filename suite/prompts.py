"""Prompt sets by category (code, prose, structured) for the trained pair, cut from the corpus's held-out
documents (never trained on) and shipped as kdbench/data/prompts_<category>.jsonl with their source."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from kdbench.corpus import CATEGORIES
from kdbench.errors import UserError

DATA = Path(__file__).parent / "data"
PER_CATEGORY = 32
PROMPT_CHARS = 1200      # a prompt starts at a line start at least this far before its document ends
TEXT_CHARS = 2400        # the text kept from there (~700 tokens; prompt_len takes the first tokens)


def path_of(category: str) -> Path:
    return DATA / f"prompts_{category}.jsonl"


def cut(docs, category: str, n: int = PER_CATEGORY, seed: int = 0) -> list[dict]:
    """n prompts from the held-out documents of a category, round-robin over documents long enough; each starts
    at a line start chosen by a seeded rng, up to TEXT_CHARS long."""
    pool = sorted((d for d in docs if d.category == category and d.split == "heldout" and len(d.text) > 2 * PROMPT_CHARS),
                  key=lambda d: d.id)
    if not pool:
        raise UserError(f"corpus: no held-out {category} document longer than {2 * PROMPT_CHARS} characters")
    rng, out, used = np.random.default_rng(seed), [], set()
    while len(out) < n:
        d = pool[len(out) % len(pool)]
        starts = [0] + [i + 1 for i, ch in enumerate(d.text[:-PROMPT_CHARS]) if ch == "\n"]
        off = int(starts[int(rng.integers(len(starts)))])
        if (d.id, off) in used:
            continue
        used.add((d.id, off))
        out.append({"id": f"{category}-{len(out):02d}", "category": category, "source": d.id, "offset": off,
                    "text": d.text[off:off + TEXT_CHARS]})
    return out


def write_all(docs) -> list[Path]:
    paths = []
    for cat in CATEGORIES:
        rows = cut(docs, cat)
        path_of(cat).write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths.append(path_of(cat))
    return paths


def load(category: str) -> list[dict]:
    """The shipped prompts of a category (rows with id, category, source, offset, text)."""
    path = path_of(category)
    if not path.exists():
        raise UserError(f"{path}: prompt set missing (kdbench corpus --prompts writes it)")
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not JSON lines ({exc})") from None


def token_prompts(category: str, n: int, prompt_len: int, tok=None) -> list[list[int]]:
    """The first n prompts of a category as the first prompt_len token ids of their text."""
    from kdbench import tokenizer
    tok = tok or tokenizer.load()
    rows = load(category)
    if n > len(rows):
        raise UserError(f"{path_of(category)}: {len(rows)} prompts, {n} asked for")
    ids = [tokenizer.encode(tok, r["text"])[:prompt_len] for r in rows[:n]]
    short = [r["id"] for r, x in zip(rows, ids) if len(x) < prompt_len]
    if short:
        raise UserError(f"{path_of(category)}: prompt {short[0]} has fewer than {prompt_len} tokens")
    return ids
