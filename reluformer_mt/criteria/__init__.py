from reluformer_mt.criteria import reluformer_criterion  # noqa: F401
