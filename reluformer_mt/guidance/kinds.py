"""The registry of guidance kinds with the built-in ones registered: kNN-MT, the translation
pieces, the separator constraint, TM-first and memory reading, in the order their parts are built (within a stage). Their
options modules register them; a new kind registers itself the same way
(:func:`~reluformer_mt.guidance.declared.register_guidance`) in its own file.
Neither torch nor fairseq."""
from reluformer_mt.guidance import (knn_options, memory_reading_options, pieces_options,  # noqa: F401  (register)
                                   separator_options, tm_first_options)
from reluformer_mt.guidance.declared import (Group, group_of, groups, kind_named, parse_guidance,  # noqa: F401
                                                       register_group, register_guidance)


def guidance_kinds() -> list:
    """Every registered kind of guidance (built-in first)."""
    return [g for g in groups() if g.guidance]
