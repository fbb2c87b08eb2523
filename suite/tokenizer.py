"""The trained pair's tokenizer: byte-level BPE (HF `tokenizers`) trained on the corpus's train split and
shipped as suite/data/pair_tokenizer.json. Id 0 is <|endoftext|>; the last id is <|mask|>, the drafter's
mask token, which never occurs in text (plans/0007).
"""
from __future__ import annotations

from pathlib import Path

from kdbench.errors import UserError

TOKENIZER = Path(__file__).parent / "data" / "pair_tokenizer.json"
VOCAB = 4096
EOT, MASK = "<|endoftext|>", "<|mask|>"


def train(texts, vocab: int = VOCAB):
    """A byte-level BPE of `vocab` ids over the texts; <|mask|> is added last so it gets id vocab - 1."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab - 1, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_special_tokens([MASK])
    if tok.get_vocab_size() != vocab or tok.token_to_id(MASK) != vocab - 1:
        raise RuntimeError(f"tokenizer: got {tok.get_vocab_size()} ids, mask at {tok.token_to_id(MASK)}; "
                           f"expected {vocab} with the mask last (too little text for the merges?)")
    return tok


def load(path: Path = TOKENIZER):
    """The shipped tokenizer; a missing or unreadable file is a UserError naming it."""
    from tokenizers import Tokenizer
    if not Path(path).exists():
        raise UserError(f"{path}: tokenizer file missing; the trained pair ships it in the package (kdbench train)")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises its own Exception type for any parse error
        raise UserError(f"{path}: not a tokenizers JSON file ({str(exc).splitlines()[0]})") from None


def encode(tok, text: str) -> list[int]:
    return tok.encode(text).ids


def decode(tok, ids) -> str:
    return tok.decode(list(ids), skip_special_tokens=False)
