"""Corpus readers, document segmentation, SentencePiece and binarisation helpers."""
