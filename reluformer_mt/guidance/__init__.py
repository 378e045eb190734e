"""Decoding guidance: the parts that act on every beam step's scores (and on what the model reads or
writes around the search).

- :mod:`~reluformer_mt.guidance.declared`: the options of every part declared once, the
  registry of kinds (:func:`register_guidance`) and ``--guidance`` specs (:func:`parse_guidance`);
  neither torch nor fairseq;
- :mod:`~reluformer_mt.guidance.base`: the part interface (:class:`Guidance`), the step it
  sees (:class:`BeamStep`), the one builder (:func:`build_guidance`) and the search that applies the
  parts inside the search fairseq built (:class:`GuidedSearch`);
- kNN-MT's mixture (stage "mixture"): options in ``knn_options``, the part in ``knn``;
- the translation pieces' bonus (stage "bonus"): ``pieces_options``, ``pieces`` over ``piece_table``;
- the separator constraint (stage "constraint"): ``separator_options``, ``separators``;
- TM-first (stage "finish", on the finished translations): ``tm_first_options``, ``tm_first``;
- memory reading (stage "input", a memory model's matches as its inputs): ``memory_reading_options``,
  ``memory_reading``.

A new kind is one file with its options dataclass, its :class:`Guidance` part and one
:func:`register_guidance` call: it is then an option of reluformer-translate, a keyword of
``DocumentTranslator`` and a ``--guidance`` kind of fairseq-generate. The names below are loaded
when first used, so that the options (and the command line built from them) load no torch.
"""
from reluformer_mt.guidance.lazy import lazy_attributes

_HOMES = {"TranslationError": "declared", "register_guidance": "kinds", "register_group": "kinds",
          "parse_guidance": "kinds", "STAGES": "base", "BeamStep": "base", "Guidance": "base",
          "GuidanceContext": "base", "GuidedSearch": "base", "SourceBatch": "base", "build_guidance": "base",
          "install_guidance": "base"}

__all__ = sorted(_HOMES)


__getattr__ = lazy_attributes(__name__, _HOMES)
