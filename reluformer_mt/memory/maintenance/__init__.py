"""The translation memory's and the FFN memories' upkeep, next to the memory they work on (issue 35):
``rekey`` (rewrite a prepared directory's neighbours with a checkpoint's learned keys), ``stats``
(the key-value memories' diagnostics of a checkpoint: top-score ratio, anisotropy, zeros) and
``bands`` (s-BLEU by the best match's fuzzy band). They load checkpoints and score BLEU, so they sit
above the models and the evaluation's metrics (tests/test_import_graph.py), while the rest of
``memory/`` sits below the models that use it. Nothing is imported here."""
