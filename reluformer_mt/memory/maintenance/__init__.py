"""The translation memory's and the FFN memories' upkeep, next to the memory they work on (issue 35):
``rekey`` (rewrite a prepared directory's neighbours with a checkpoint's learned keys), ``stats``
(the key-value memories' diagnostics of a checkpoint: top-score ratio, anisotropy, zeros) and
``bands`` (s-BLEU by the best match's fuzzy band). They load checkpoints and score BLEU, so
``memory/`` sits above the checkpoint loader and the evaluation's metrics and below the models
that read the memories (tests/test_import_graph.py). Nothing is imported here."""
