"""Translating whole documents with a trained checkpoint (``reluformer-translate``).

- :mod:`reluformer_mt.inference.inputs`: the input formats (sentence lines with blank lines
  between documents, ``<d>`` documents, sentences + document ids, raw paragraphs split into
  sentences with pysbd), reading from files or stdin, and writers that keep the input's layout;
- :mod:`reluformer_mt.inference.translator`: :class:`DocumentTranslator`, which finds the
  checkpoint's resources, cuts documents into segments of the trained length, translates them
  with fairseq's beam search and splits them back into exactly one sentence per input sentence.
"""
from reluformer_mt.inference.inputs import FORMATS, InputDocument, ParsedInput, parse_input, read_input, read_text, write_output

# the translator imports torch and fairseq: loaded on first use, so that importing the light
# input readers (reluformer-translate's option and input checks) does not wait for them
_TRANSLATOR_NAMES = ("DocumentTranslator", "SentenceResult", "TranslationError")


def __getattr__(name):
    if name in _TRANSLATOR_NAMES:
        from reluformer_mt.inference import translator

        return getattr(translator, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["FORMATS", "InputDocument", "ParsedInput", "parse_input", "read_input", "read_text", "write_output",
           "DocumentTranslator", "SentenceResult", "TranslationError"]
