"""The translation pieces' options, declared once (``--pieces-weight`` etc.; Zhang et al. NAACL
2018). Imports neither torch nor fairseq; the part itself is
:mod:`reluformer_mt.guidance.pieces`."""
import math
from dataclasses import dataclass

from reluformer_mt.guidance.declared import TranslationError, number, option, register_guidance

# beyond this the bonus dwarfs every log-probability a model gives (search copies the memory), and
# near float32's range (1e300 is inf there) beam scores become inf - inf = NaN inside fairseq
MAX_WEIGHT = 1e4


@dataclass(frozen=True)
class PiecesOptions:
    """translation pieces (Zhang et al. NAACL 2018): each sentence's n-grams of its memory matches
    rewarded at every step; any checkpoint, trained with or without a memory"""
    weight: float = option(0.0, "beam search adds W x the fuzzy score of the best match holding each n-gram a next "
                           "token completes (0: off, the default; the demo's tuned value: docs/TRANSLATION_MEMORY.md)",
                           metavar="W", parse=number(float, 0.0, MAX_WEIGHT))
    k: int = option(8, "matches per sentence whose n-grams are pieces", metavar="K")
    max_n: int = option(4, "longest piece, in SentencePiece tokens", metavar="N")
    floor: float = option(0.0, "only matches with a fuzzy score >= F give pieces (the demo's value is tuned with the "
                          "weight)", metavar="F")
    aligned: bool = option(False, "pieces only from target words that the memory's word alignment (eflomal, run once "
                           "per memory) links to source words the sentence shares with the match, as Zhang et al. "
                           "2018 (default: every n-gram of the match)")
    # a length control against hypotheses that follow pieces to the length limit (then the segment is
    # decoded again as halves)
    length_cap: float = option(0.0, "a hypothesis must end the sentence it writes (only the separator or EOS may "
                               "follow) once it is F times the sentence's expected length from its matches: fewer "
                               "hypotheses follow pieces to the length limit (0: off, the default; 'reluformer-memory "
                               "tune' tunes it)", metavar="F")

    def __post_init__(self):
        for name, cast in (("weight", float), ("floor", float), ("length_cap", float), ("aligned", bool)):
            object.__setattr__(self, name, cast(getattr(self, name)))
        if not math.isfinite(self.weight) or self.weight < 0:
            raise TranslationError(f"--pieces-weight: expected a finite number >= 0, got {self.weight:g}")
        if self.weight > MAX_WEIGHT:
            raise TranslationError(f"--pieces-weight: expected a number in [0, {MAX_WEIGHT:g}], got {self.weight:g}")
        if not 0 <= self.floor <= 1:
            raise TranslationError(f"--pieces-floor: expected a fuzzy score between 0 and 1, got {self.floor:g}")
        if not math.isfinite(self.length_cap) or (self.length_cap != 0 and self.length_cap < 1):
            raise TranslationError("--pieces-length-cap: expected 0 (off) or a factor >= 1 of the expected length, "
                                   f"got {self.length_cap:g}")
        for name, value in (("--pieces-length-cap", self.length_cap), ("--pieces-aligned", self.aligned)):
            if value and not self.weight:
                raise TranslationError(f"{name}: only with translation pieces (--pieces-weight W > 0)")
        self._check_counts()
        if self.aligned:
            from reluformer_mt.evaluation.statistical_aligner import available

            if not available():
                raise TranslationError("--pieces-aligned: the word alignment of the memory needs eflomal "
                                       "(pip install eflomal)")

    def _check_counts(self) -> None:
        k, max_n = self.k, self.max_n
        object.__setattr__(self, "k", int(k))
        object.__setattr__(self, "max_n", int(max_n))
        if self.k < 1 or not 1 <= self.max_n <= 8:
            raise TranslationError(f"--pieces-k {k} / --pieces-max-n {max_n}: expected k >= 1 and 1 <= n <= 8")

    def asks_for_matches(self):
        """(the option given, what it reads) when it needs each sentence's memory matches."""
        return (f"--pieces-weight {self.weight:g}", "translation pieces") if self.weight else None

    @property
    def needs_memory(self) -> bool:
        return bool(self.weight)


register_guidance("pieces", PiecesOptions, "reluformer_mt.guidance.pieces:build_pieces", section="memory")
