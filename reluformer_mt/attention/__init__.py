"""Attention: weight functions (``functions``), options (``config``), the one module (``multihead``)
and what it records for one with-block (``recording``: ``record_attention``, ``capture_attention``).

This subpackage imports nothing else of reluformer_mt.
"""
from reluformer_mt.attention.config import AttentionConfig, AttentionOptionError
from reluformer_mt.attention.functions import ATTENTION_FUNCTIONS, FUNCTIONS, POINTWISE_ACTIVATIONS, WeightFunction
from reluformer_mt.attention.multihead import ReluformerAttention
from reluformer_mt.attention.recording import AttentionRecording, capture_attention, record_attention

__all__ = ["AttentionConfig", "AttentionOptionError", "AttentionRecording", "ATTENTION_FUNCTIONS", "FUNCTIONS",
           "POINTWISE_ACTIVATIONS", "ReluformerAttention", "WeightFunction", "capture_attention", "record_attention"]
