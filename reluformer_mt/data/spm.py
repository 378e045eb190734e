"""SentencePiece (Kudo & Richardson, EMNLP 2018): train joint or per-language models, reuse a
given model, encode, and write fairseq dictionaries straight from the model's vocabulary.

The separator token is a ``user_defined_symbol`` of every model we train, so it is always one
piece; the fairseq dictionary is written from the SentencePiece vocabulary (not counted from the
data), so the separator is one dictionary entry even in sentence-level data where it never
occurs, and the sentence- and document-level directories prepared with one model share a
dictionary.
"""
import shutil
from pathlib import Path
from typing import Iterable, List, Sequence, Tuple

import sentencepiece as spm

from reluformer_mt.data.segments import SEPARATOR

# fairseq's Dictionary adds these itself; a dictionary file must not repeat them
FAIRSEQ_SPECIALS = {"<s>", "<pad>", "</s>", "<unk>"}


def train_spm(sentences: Iterable[str], model_prefix, vocab_size: int, separator: str = SEPARATOR,
              workers: int = 1, model_type: str = "unigram", character_coverage: float = 1.0,
              max_sentences: int = 2_000_000, seed: int = 1) -> Path:
    """Train a model on ``sentences``; returns the ``.model`` path.

    ``hard_vocab_limit=False`` lets a small corpus end with fewer pieces than asked instead of
    failing. Sampling of at most ``max_sentences`` keeps memory bounded on large corpora.
    """
    model_prefix = Path(model_prefix)
    model_prefix.parent.mkdir(parents=True, exist_ok=True)
    if hasattr(spm, "set_random_generator_seed"):  # reproducible sampling of the input sentences
        spm.set_random_generator_seed(seed)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_prefix=str(model_prefix),
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        user_defined_symbols=[separator],
        hard_vocab_limit=False,
        input_sentence_size=max_sentences,
        shuffle_input_sentence=True,
        num_threads=max(1, workers),
        minloglevel=2,
    )
    return model_prefix.with_suffix(".model")


def open_spm(path) -> spm.SentencePieceProcessor:
    """Load a model file; a missing file or one that is no SentencePiece model (a fairseq
    dictionary, a vocabulary) is one line naming it, not the library's 'could not parse ModelProto'."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: SentencePiece model not found")
    try:
        return spm.SentencePieceProcessor(model_file=str(path))
    except (RuntimeError, OSError):
        raise ValueError(f"{path}: not a SentencePiece model (expected the .model file reluformer-prepare or "
                         f"spm_train writes, e.g. spm.model; not a dictionary or .vocab file)") from None


def load_spm(path, separator: str = SEPARATOR) -> spm.SentencePieceProcessor:
    """Load a model and check the separator encodes to exactly one piece."""
    path = Path(path)
    sp = open_spm(path)
    if sp.piece_to_id(separator) == sp.unk_id():
        raise ValueError(f"{path}: the SentencePiece model has no piece {separator!r}; train it with "
                         f"user_defined_symbols={separator!r} (reluformer-prepare does) or let reluformer-prepare train one")
    return sp


def encode(sp: spm.SentencePieceProcessor, sentences: Sequence[str], workers: int = 1) -> List[List[str]]:
    return sp.encode(list(sentences), out_type=str, num_threads=max(1, workers))


def repair_separator_lookalikes(sp: spm.SentencePieceProcessor, texts: List[str], pieces: List[List[str]],
                                separator: str = SEPARATOR) -> List[Tuple[int, int]]:
    """Remove, in place, separators that SentencePiece's normaliser made from look-alikes.

    The literal separator is refused or removed on the raw text, but NFKC (the models'
    ``nmt_nfkc`` rule) turns e.g. the full-width ``＜sep＞`` or the small form ``﹤sep﹥`` into it,
    so only the pieces show it. Such a sentence's text becomes its normalised form with the
    separator replaced by a space, and is encoded again. Returns (index, separators removed) of
    every repaired sentence."""
    repaired = []
    for i, p in enumerate(pieces):
        n = p.count(separator)
        if not n:
            continue
        text = texts[i]
        while separator in sp.encode(text, out_type=str):  # "<se<sep>p>" needs a second pass
            text = " ".join(sp.normalize(text).replace(separator, " ").replace("\u2581", " ").split())
        texts[i], pieces[i] = text, sp.encode(text, out_type=str)
        repaired.append((i, n))
    return repaired


def spm_vocabulary(sp: spm.SentencePieceProcessor) -> List[str]:
    """Pieces that belong in a fairseq dictionary (no control/unknown symbols)."""
    pieces = []
    for i in range(sp.get_piece_size()):
        if sp.is_control(i) or sp.is_unknown(i):
            continue
        piece = sp.id_to_piece(i)
        if piece in FAIRSEQ_SPECIALS:
            continue
        pieces.append(piece)
    return pieces


def write_fairseq_dict(pieces: Sequence[str], path) -> None:
    """fairseq dictionary file (``piece count``); counts decrease with the piece id so fairseq
    keeps the SentencePiece order."""
    seen = set()
    uniq = [p for p in pieces if not (p in seen or seen.add(p))]
    with open(path, "w", encoding="utf-8") as f:
        for k, piece in enumerate(uniq):
            f.write(f"{piece} {len(uniq) - k}\n")


def copy_model(model_path, out_dir, name: str) -> str:
    """Copy a model into the prepared directory; returns its file name there."""
    dest = Path(out_dir) / name
    if Path(model_path).resolve() != dest.resolve():
        shutil.copyfile(model_path, dest)
    return dest.name
