"""Attention: weight functions (``functions``), options (``config``) and the one module (``multihead``).

This subpackage imports nothing else of reluformer_mt.
"""
from reluformer_mt.attention.config import AttentionConfig, AttentionOptionError
from reluformer_mt.attention.functions import ATTENTION_FUNCTIONS, FUNCTIONS, POINTWISE_ACTIVATIONS, WeightFunction
from reluformer_mt.attention.multihead import ReluformerAttention

__all__ = ["AttentionConfig", "AttentionOptionError", "ATTENTION_FUNCTIONS", "FUNCTIONS", "POINTWISE_ACTIVATIONS",
           "ReluformerAttention", "WeightFunction"]
