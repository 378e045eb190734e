"""The separator constraint's option, declared once (``--separators``). Imports neither torch nor
fairseq; the part itself is :mod:`reluformer_mt.guidance.separators`."""
from dataclasses import dataclass

from reluformer_mt.guidance.declared import TranslationError, option, register_guidance

SEPARATOR_MODES = ("constrained", "free")


@dataclass(frozen=True)
class Separators:
    """The separator constraint (``--separators``)."""
    mode: str = option("constrained", "constrained (default): beam search gives each segment's translation exactly the "
                       "source's number of sentence separators (no empty sentence), so it splits back without "
                       "retranslation unless it reaches the length limit; free: plain beam search, which shows how "
                       "often the model keeps the separators by itself (the summary counts the fallbacks)",
                       flat="separators", choices=SEPARATOR_MODES)

    def __post_init__(self):
        if self.mode not in SEPARATOR_MODES:
            raise TranslationError(f"--separators: expected one of {', '.join(SEPARATOR_MODES)}, got {self.mode!r}")


register_guidance("separators", Separators, "reluformer_mt.guidance.separators:build_separator_constraint",
                  section="search")
