"""What a model's token ids mean, compared by content: the one "same vocabulary" check of every
command that combines a model with data, a datastore, a memory or another model.

Two dictionaries of the same size can hold other symbols (another corpus, another SentencePiece
model): a model fed the other's ids reads other pieces without a word. So a vocabulary is the
sha256 of each dictionary's symbols in order (their counts are left out: the same vocabulary
counted over other text is the same vocabulary) and of each SentencePiece model's bytes.
"""
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional


class VocabularyError(ValueError):
    """Another vocabulary than the model's, or one that cannot be checked: one line."""


@dataclass(frozen=True)
class Vocabulary:
    directory: str
    source: str                     # sha256 of the source dictionary's symbols
    target: str
    sizes: tuple                    # (source, target) entries, for the message
    spm_source: Optional[str] = None  # sha256 of the SentencePiece model's bytes; None: none recorded
    spm_target: Optional[str] = None

    def differences(self, other: "Vocabulary") -> list:
        """The parts of ``other`` that differ from this one (a SentencePiece model that only one of
        the two records is not compared: word-level data has none)."""
        parts = [("source dictionary", self.source, other.source), ("target dictionary", self.target, other.target),
                 ("source SentencePiece model", self.spm_source, other.spm_source),
                 ("target SentencePiece model", self.spm_target, other.spm_target)]
        return [name for name, a, b in parts if a is not None and b is not None and a != b]


def _symbols_digest(path: Path) -> tuple:
    from fairseq.data import Dictionary

    symbols = Dictionary.load(str(path)).symbols  # the ids as fairseq gives them, special symbols first
    return hashlib.sha256("\n".join(symbols).encode("utf-8")).hexdigest(), len(symbols)


def _bytes_digest(path: Path) -> Optional[str]:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def vocabulary_of(directory, src_lang: str, tgt_lang: str) -> Vocabulary:
    """The vocabulary of a data directory: ``dict.{lang}.txt`` and, when it has a prepared.json,
    the SentencePiece models it names."""
    from reluformer_mt.data.prepared import Prepared

    directory = Path(directory)
    (source, n_src), (target, n_tgt) = (_symbols_digest(directory / f"dict.{lang}.txt") for lang in (src_lang, tgt_lang))
    prepared = Prepared.load_if_present(directory)
    spm = [_bytes_digest(p) for p in prepared.spm_paths()] if prepared is not None else [None, None]
    return Vocabulary(str(directory), source, target, (n_src, n_tgt), *spm)


DATA_REMEDY = "use data prepared with the model's dictionaries and SentencePiece model"


def check_same_vocabulary(reference: Vocabulary, other: Vocabulary, what: str, whose: str,
                          remedy: str = DATA_REMEDY) -> None:
    """One line when ``other`` (``what``: the option and path it came from) is not ``reference``
    (the vocabulary of ``whose``, e.g. 'the checkpoint X'); ``remedy`` says what to do instead."""
    differ = reference.differences(other)
    if differ:
        sizes = "" if other.sizes == reference.sizes else f" ({other.sizes[1]:,} target entries, not {reference.sizes[1]:,})"
        verb = "differs" if len(differ) == 1 else "differ"
        parts = " and ".join([", ".join(differ[:-1]), differ[-1]] if len(differ) > 1 else differ)
        raise VocabularyError(f"{what}: its {parts} {verb} from {whose}'s ({reference.directory}){sizes}, "
                              f"compared by content: its token ids would mean other pieces to the model; {remedy}")


__all__ = ["Vocabulary", "VocabularyError", "check_same_vocabulary", "vocabulary_of"]
