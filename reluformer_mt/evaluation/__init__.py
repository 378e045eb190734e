"""Evaluation. Light modules (no torch): ``bleu`` (s-/d-BLEU, chrF), ``aer`` (alignment error
rate), ``baselines``, ``reports``. On tensors: ``stats`` (attention statistics and word
alignments from attention), ``extract`` (force-decoded attention of a checkpoint), ``align``,
``attn_stats``, ``contrastive``, ``cxmi``; ``plots`` loads matplotlib.
Nothing is imported here, so ``import reluformer_mt.evaluation.aer`` stays light."""
