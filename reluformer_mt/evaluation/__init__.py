"""Evaluation: s-BLEU / d-BLEU (bleu), alignment error rate (aer), attention statistics and
alignments from attention (stats), reports, and plots (imported on demand: ``evaluation.plots``,
so that importing the package does not load matplotlib)."""
from reluformer_mt.evaluation.aer import AERResult, corpus_aer, read_gold, read_predictions  # noqa: F401
from reluformer_mt.evaluation.bleu import (BleuResult, bleu_from_files, corpus_dbleu, corpus_sbleu,  # noqa: F401
                                           pair_documents, read_fairseq_generate, sentences_from_segments)
from reluformer_mt.evaluation.stats import (AttentionStats, alignment_from_attention, sentencepiece_word_map,  # noqa: F401
                                            shift_rows)
