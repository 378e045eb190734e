"""Decoding guidance: the parts that act on every beam step's scores.

- :mod:`~reluformer_mt.inference.guidance.base`: the part interface (:class:`Guidance`), the step it
  sees (:class:`BeamStep`), the registry of kinds, the one builder (:func:`build_guidance`) and the
  beam search that applies the parts (:class:`GuidedBeamSearch`);
- :mod:`~reluformer_mt.inference.guidance.knn`: kNN-MT's mixture (stage "mixture");
- :mod:`~reluformer_mt.inference.guidance.pieces`: the translation pieces' bonus (stage "bonus"), over
  :mod:`~reluformer_mt.inference.guidance.piece_table`;
- :mod:`~reluformer_mt.inference.guidance.separators`: the separator constraint (stage "constraint").

A new kind is one file with its options dataclass, its :class:`Guidance` part and one
:func:`register_guidance` call, imported below. It sits below the task and the translator, which
both build their decoder's guidance here.
"""
from reluformer_mt.inference.guidance.base import (STAGES, BeamStep, Guidance, GuidanceContext, GuidedBeamSearch,
                                                   SourceBatch, TranslationError, build_guidance, install_guidance,
                                                   parse_guidance, register_guidance)
from reluformer_mt.inference.guidance import knn, pieces, separators  # noqa: F401,E402  (each registers its kind)

__all__ = ["STAGES", "BeamStep", "Guidance", "GuidanceContext", "GuidedBeamSearch", "SourceBatch", "TranslationError",
           "build_guidance", "install_guidance", "parse_guidance", "register_guidance"]
