"""The names of the translation memory's match scores (no imports: the commands check their
options with them before anything heavy loads)."""

# How a match is scored. Edit similarities rerank the MIPS candidates: "words" = the CAT tools'
# fuzzy-match score, 1 - word edit distance / the longer sentence's words; "chars" = 1 - character
# insertions and deletions / both lengths (the Indel similarity, rapidfuzz's ``ratio``) of the
# lower-cased sentences, which an inflected form (Greek λόγος / λόγου) costs a character or two
# where it costs a whole word in "words". Sparse scores ("tfidf-words", "bm25-pieces", ...;
# :mod:`reluformer_mt.memory.sparse_scores`) rank the whole memory themselves; "SPARSE>EDIT" takes
# the sparse score's top candidates and reranks them by the edit similarity.
EDIT_SCORES = ("words", "chars")
SPARSE_SCORES = tuple(f"{w}-{u}" for w in ("tfidf", "bm25") for u in ("words", "chars", "pieces"))
MATCH_SCORES = EDIT_SCORES + SPARSE_SCORES + tuple(f"{s}>{e}" for s in SPARSE_SCORES for e in EDIT_SCORES)
# chosen on the demo's validation chapters by the chrF of copying the best match's target
# (python -m reluformer_mt.experiments.retrieval_study; docs/TRANSLATION_MEMORY.md)
DEFAULT_MATCH_SCORE = "bm25-chars"
LEGACY_MATCH_SCORE = "words"  # what a memory prepared before the score was recorded was ranked by
