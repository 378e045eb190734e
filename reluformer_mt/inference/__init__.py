"""Translating whole documents with a trained checkpoint (``reluformer-translate``).

- :mod:`reluformer_mt.inference.inputs`: the input formats (sentence lines with blank lines
  between documents, ``<d>`` documents, sentences + document ids, raw paragraphs split into
  sentences with pysbd), reading from files or stdin, and writers that keep the input's layout;
- :mod:`reluformer_mt.inference.translator`: :class:`DocumentTranslator`, which finds the
  checkpoint's resources, cuts documents into segments of the trained length, translates them
  with fairseq's beam search and splits them back into exactly one sentence per input sentence;
- :mod:`reluformer_mt.inference.options`: the translator's options in groups, each declared once;
- :mod:`reluformer_mt.guidance`: the parts that act on every beam step's scores
  (separators, translation pieces, kNN-MT), below the task and the translator, which both use them.

The names below are loaded when first used, so that the task's generator can import the guidance
without the translator.
"""
from reluformer_mt.guidance.lazy import lazy_attributes

_HOMES = {"FORMATS": "inputs", "InputDocument": "inputs", "ParsedInput": "inputs", "parse_input": "inputs",
          "read_input": "inputs", "read_text": "inputs", "write_output": "inputs",
          "DocumentTranslator": "translator", "SentenceResult": "translator", "TranslationError": "translator",
          "TranslatorOptions": "options", "ResourceOptions": "options", "SearchOptions": "options",
          "PrecisionOptions": "options", "MemoryOptions": "options", "TmFirstOptions": "options",
          "PiecesOptions": "guidance.pieces_options", "KnnMtOptions": "guidance.knn_options",
          "Separators": "guidance.separator_options"}

__all__ = sorted(_HOMES)


__getattr__ = lazy_attributes(__name__, _HOMES)
