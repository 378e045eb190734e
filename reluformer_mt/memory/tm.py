"""A translation memory (TM): source/target sentence pairs outside the model, searched by
maximum inner product (MIPS) over dense keys, reranked by the TM industry's fuzzy-match score.

This is the external key-value memory of EMAT (Wu et al. 2022, arXiv:2210.16773) for MT: keys
are vectors of source sentences, values are their translations, and a query retrieves its
top-k entries by MIPS (faiss, :class:`reluformer_mt.memory.mips.MipsIndex`). The model reads
the values either concatenated to its source (Neural Fuzzy Repair, Bulté & Tezcan ACL 2019;
Xu et al. ACL 2020) or through a memory-attention sublayer (:mod:`reluformer_mt.memory.tm_attention`).

Sources of entries: the training split of a prepared directory, a TMX 1.4b file (streamed with
``xml.etree.ElementTree.iterparse`` in constant memory; the formatting codes ``<bpt> <ept> <it>``
dropped, the placeholders ``<ph> <ut>`` a space, or their text with ``placeholders="text"``; the
text inside ``<hi>`` kept; ``xml:lang`` matched on its primary subtag, so ``en-US`` = ``en``), or
a two-column TSV file (UTF-8, or UTF-16 / UTF-8 with a byte-order mark). Files (not prepared
directories, whose entry ids are training sentences) keep each (source, target) pair once, with
its count, and one target per source: the most frequent, ties to the last in the file (the most
recent, as CAT tools keep); merged pairs and sources with conflicting targets are counted.

Match scores (:data:`MATCH_SCORES`, model-free, usable before any training): by default BM25 over
character 3-5-grams, over the whole memory (:mod:`reluformer_mt.memory.sparse_scores`: TF-IDF and
BM25 over words, character n-grams or pieces), or an edit similarity over MIPS candidates.
Keys for those: TF-IDF over character 2-4-grams of the
lower-cased source (sublinear tf), reduced to ``dim`` dimensions by a truncated SVD (fixed seed,
so refitting on the same entries gives the same keys) and L2-normalised, so inner product =
cosine. The top ``candidates`` by MIPS are reranked by the fuzzy-match score
1 - (word edit distance) / (length of the longer sentence) (rapidfuzz), what a CAT tool shows
a translator; ties keep the MIPS order.
"""
import codecs
import logging
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Tuple

import numpy as np

from reluformer_mt.memory.score_names import DEFAULT_MATCH_SCORE, EDIT_SCORES, LEGACY_MATCH_SCORE, MATCH_SCORES

logger = logging.getLogger(__name__)

XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
FORMATTING_CODES = {"bpt", "ept", "it"}  # the original format's markup (bold on/off, ...): dropped
PLACEHOLDER_CODES = {"ph", "ut"}  # stand for content (a variable, an image): a space, or their text
INLINE_CODES = FORMATTING_CODES | PLACEHOLDER_CODES
PLACEHOLDER_MODES = ("space", "text")
FUZZY_BANDS = ((0.0, 0.5, "<50"), (0.5, 0.7, "50-70"), (0.7, 0.9, "70-90"), (0.9, 1.01, ">=90"))
# scores are stored as float32, where 0.7 and 0.9 round below themselves: a score within this of a
# band's lower bound belongs to the band (fuzzy scores are ratios of word counts, far apart at this scale)
BAND_TOLERANCE = 1e-6


class TranslationMemoryError(ValueError):
    """A bad memory file or option: a one-line message naming the file/line or the option."""


@dataclass
class MemoryEntries:
    """Sentence pairs of a translation memory, in file order (the entry id is the index)."""
    sources: List[str]
    targets: List[str]
    origin: str
    skipped: Counter = field(default_factory=Counter)
    # how often each entry's (source, target) pair occurs in the file (None: once each)
    counts: Optional[List[int]] = None
    merged: Counter = field(default_factory=Counter)  # duplicates merged, conflicts resolved

    def __len__(self) -> int:
        return len(self.sources)

    def summary(self) -> str:
        skipped = ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items())) or "none"
        merged = "".join(f"; {n} {why}" for why, n in sorted(self.merged.items()))
        return f"{self.origin}: {len(self)} entries; skipped: {skipped}{merged}"

    def deduplicate(self) -> "MemoryEntries":
        """Each (source, target) pair once with its count; a source with several targets keeps the
        most frequent one, ties to the last in the file (the most recent, as CAT tools do), at the
        position of the source's first entry. Both repairs are counted in ``merged``."""
        pair_counts: Counter = Counter()
        last_seen = {}
        for i, pair in enumerate(zip(self.sources, self.targets)):
            pair_counts[pair] += 1
            last_seen[pair] = i
        best = {}  # source -> its chosen pair
        for pair, n in pair_counts.items():
            chosen = best.get(pair[0])
            if chosen is None or (n, last_seen[pair]) > (pair_counts[chosen], last_seen[chosen]):
                best[pair[0]] = pair
        targets_per_source = Counter(src for src, _ in pair_counts)
        sources, targets, counts, placed = [], [], [], set()
        for src in self.sources:
            if src not in placed:
                placed.add(src)
                sources.append(src)
                targets.append(best[src][1])
                counts.append(pair_counts[best[src]])
        merged = Counter(self.merged)
        duplicates = sum(n - 1 for n in pair_counts.values())
        if duplicates:
            merged["repeated pairs merged (counted)"] += duplicates
        conflicts = sum(1 for n in targets_per_source.values() if n > 1)
        if conflicts:
            dropped = sum(pair_counts[p] for p in pair_counts if best[p[0]] != p)
            merged["sources with conflicting targets (kept the most frequent, ties the last; "
                   f"{dropped} entries with another target left out)"] += conflicts
        return MemoryEntries(sources, targets, self.origin, Counter(self.skipped), counts, merged)


# ---------------------------------------------------------------- reading memories

def primary_language(code: Optional[str]) -> str:
    """'en-US', 'EN_us', 'en' -> 'en'."""
    return (code or "").replace("_", "-").split("-")[0].strip().lower()


def segment_text(seg: ET.Element, placeholders: str = "space") -> str:
    """Plain text of a TMX ``<seg>``: formatting codes dropped, each placeholder a space (it stood
    for something between the words: ``Value<ph>{0}</ph>here`` is two words) or, with
    ``placeholders="text"``, its text; the text around them kept."""
    parts = [seg.text or ""]
    for child in seg:
        tag = child.tag.rsplit("}", 1)[-1]
        if tag in PLACEHOLDER_CODES:
            parts.append(" " + ("".join(child.itertext()) if placeholders == "text" else "") + " ")
        elif tag not in FORMATTING_CODES:
            parts.append(segment_text(child, placeholders))
        parts.append(child.tail or "")
    return " ".join("".join(parts).split())


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def read_tmx(path, src_lang: str, tgt_lang: str, placeholders: str = "space") -> MemoryEntries:
    """Stream the translation units of a TMX file in constant memory; units lacking either
    language, with a ``<tuv>`` of either language without ``<seg>`` or with an empty segment are
    skipped and counted; a second variant of one language is counted (the first kept); repeated
    pairs are merged (:meth:`MemoryEntries.deduplicate`). Malformed XML stops with file and line."""
    path = Path(path)
    if placeholders not in PLACEHOLDER_MODES:
        raise TranslationMemoryError(f"--tmx-placeholders: got {placeholders!r}, expected one of "
                                     f"{', '.join(PLACEHOLDER_MODES)}")
    if not path.is_file():
        raise TranslationMemoryError(f"{path}: translation memory not found")
    want_src, want_tgt = primary_language(src_lang), primary_language(tgt_lang)
    entries = MemoryEntries([], [], str(path))
    seen_langs: Counter = Counter()
    try:
        context = ET.iterparse(str(path), events=("start", "end"))
        _, root = next(context)
        if _local(root.tag) != "tmx":
            raise TranslationMemoryError(f"{path}: line 1: expected a <tmx> document, got <{root.tag}>")
        open_elements = [root]  # the path from the root to the element being parsed
        for event, elem in context:
            if event == "start":
                open_elements.append(elem)
                continue
            open_elements.pop()
            if _local(elem.tag) != "tu":
                continue
            _read_unit(elem, want_src, want_tgt, entries, seen_langs, placeholders)
            # constant memory: the parser appends every unit to its parent, so the finished unit is
            # cleared and taken out of the parent, which then never holds more than one
            elem.clear()
            open_elements[-1].remove(elem)
    except ET.ParseError as e:
        line = e.position[0] if getattr(e, "position", None) else "?"
        raise TranslationMemoryError(f"{path}: line {line}: malformed TMX ({str(e).split(':')[0]})") from None
    if not entries.sources:
        found = ", ".join(sorted(seen_langs)) or "none"
        raise TranslationMemoryError(f"{path}: no translation unit with both {want_src} and {want_tgt} segments "
                           f"(languages found: {found})")
    return entries.deduplicate()


def _read_unit(tu: ET.Element, want_src: str, want_tgt: str, entries: MemoryEntries, seen_langs: Counter,
               placeholders: str) -> None:
    texts, without_seg, repeated = {}, False, False
    for tuv in tu:
        if _local(tuv.tag) != "tuv":
            continue
        lang = primary_language(tuv.get(XML_LANG) or tuv.get("lang"))
        seen_langs[lang] += 1
        seg = next((c for c in tuv if _local(c.tag) == "seg"), None)
        if lang not in (want_src, want_tgt):
            continue
        if lang in texts:
            repeated = True  # the first variant is kept
        elif seg is None:
            texts[lang], without_seg = "", True
        else:
            texts[lang] = segment_text(seg, placeholders)
    if want_src not in texts or want_tgt not in texts:
        entries.skipped[f"units without both {want_src} and {want_tgt}"] += 1
    elif without_seg:
        entries.skipped[f"units with a {want_src} or {want_tgt} <tuv> without <seg>"] += 1
    elif not texts[want_src] or not texts[want_tgt]:
        entries.skipped["units with an empty segment"] += 1
    else:
        if repeated:
            entries.merged["units with a second variant of one language (the first kept)"] += 1
        entries.sources.append(texts[want_src])
        entries.targets.append(texts[want_tgt])


_BOMS = ((codecs.BOM_UTF8, "utf-8-sig", "UTF-8"), (codecs.BOM_UTF16_LE, "utf-16", "UTF-16"),
         (codecs.BOM_UTF16_BE, "utf-16", "UTF-16"))
# a lone surrogate: what no strict decoder ever returns, so it marks the bytes that did not decode
_BAD = "\udcff"
codecs.register_error("reluformer-mark", lambda e: (_BAD, e.end))


def text_encoding(path: Path) -> tuple:
    """(codec, name) of a text file: a UTF-8 or UTF-16 byte-order mark, UTF-16 without one when
    its first character has a zero byte (what spreadsheet tools write as "Unicode text"), else UTF-8."""
    with open(path, "rb") as f:
        head = f.read(4)
    for bom, codec, name in _BOMS:
        if head.startswith(bom):
            return codec, name
    if len(head) >= 2 and head[0] == 0 and head[1] != 0:
        return "utf-16-be", "UTF-16"
    if len(head) >= 2 and head[1] == 0 and head[0] != 0:
        return "utf-16-le", "UTF-16"
    return "utf-8", "UTF-8"


def read_tsv(path) -> MemoryEntries:
    """``source <TAB> target`` a line (UTF-8, or UTF-16 / UTF-8 with a byte-order mark, which is
    not kept); a line with another number of columns or bytes that do not decode stops with file
    and line, a line with an empty side is skipped and counted; repeated pairs are merged
    (:meth:`MemoryEntries.deduplicate`)."""
    path = Path(path)
    if not path.is_file():
        raise TranslationMemoryError(f"{path}: translation memory not found")
    codec, name = text_encoding(path)
    entries = MemoryEntries([], [], str(path))
    # undecodable bytes become a marker and are reported with the line they are on (a strict
    # decoder fails on the chunk it reads ahead, thousands of lines past the last one returned)
    with open(path, encoding=codec, errors="reluformer-mark", newline="\n") as f:
        for n, line in enumerate(f, 1):
            if _BAD in line:
                raise TranslationMemoryError(f"{path}: line {n}: not {name} (bytes that do not decode)")
            line = line.rstrip("\r\n")
            if not line.strip():
                entries.skipped["blank lines"] += 1
                continue
            columns = line.split("\t")
            if len(columns) != 2:
                raise TranslationMemoryError(f"{path}: line {n}: expected 2 tab-separated columns (source, target), "
                                             f"got {len(columns)}")
            src, tgt = (" ".join(c.split()) for c in columns)
            if not src or not tgt:
                entries.skipped["lines with an empty side"] += 1
                continue
            entries.sources.append(src)
            entries.targets.append(tgt)
    if not entries.sources:
        raise TranslationMemoryError(f"{path}: no entry (expected lines 'source<TAB>target')")
    return entries.deduplicate()


def split_sentences_of(lines: Iterable[str], separator: str) -> List[str]:
    """Sentences of prepared text lines (segments joined by the separator), in order."""
    return [s.strip() for line in lines for s in line.rstrip("\n").split(separator)]


def read_prepared(directory, split: str = "train") -> MemoryEntries:
    """The sentence pairs of a prepared split, decoded from SentencePiece pieces to text; entry
    ``i`` is the split's ``i``-th sentence (segments are cut at the separator)."""
    from reluformer_mt.data.prepared import Prepared

    prepared = Prepared.load(directory)
    sp_src, sp_tgt = prepared.sentencepiece(check_separator=False)
    text = Path(directory) / "text"
    sides = []
    for lang, sp in ((prepared.src_lang, sp_src), (prepared.tgt_lang, sp_tgt)):
        path = text / f"{split}.{lang}"
        if not path.is_file():
            raise TranslationMemoryError(f"{path}: missing; re-prepare {directory} with reluformer-prepare")
        pieces = split_sentences_of(path.read_text(encoding="utf-8").splitlines(), prepared.separator)
        sides.append([sp.decode_pieces(p.split()) for p in pieces])
    if len(sides[0]) != len(sides[1]):
        raise TranslationMemoryError(f"{text}: {split} has {len(sides[0])} source but {len(sides[1])} target sentences")
    return MemoryEntries(sides[0], sides[1], f"{directory} ({split})")


def read_memory(spec, src_lang: str, tgt_lang: str, placeholders: str = "space") -> MemoryEntries:
    """A memory given on the command line: a prepared directory (its training split), a .tmx or
    a .tsv file."""
    path = Path(spec)
    if path.is_dir():
        return read_prepared(path)
    suffix = path.suffix.lower()
    if suffix == ".tmx":
        return read_tmx(path, src_lang, tgt_lang, placeholders)
    if suffix in (".tsv", ".txt"):
        return read_tsv(path)
    if not path.exists():
        raise TranslationMemoryError(f"--memory: {path} not found (expected a prepared directory, a .tmx or a .tsv file)")
    raise TranslationMemoryError(f"--memory: {path}: expected a prepared directory, a .tmx or a .tsv file")


# ---------------------------------------------------------------- keys and search

def fuzzy_words(text: str) -> List[str]:
    return text.lower().split()


def match_units(text: str, score: str = "words"):
    """What an edit score compares: the word list ("words") or the lower-cased string ("chars")."""
    return fuzzy_words(text) if score == "words" else text.lower()


def check_match_score(score: str, option: str = "match score") -> str:
    if score not in MATCH_SCORES:
        raise TranslationMemoryError(f"{option} {score!r}: expected one of {', '.join(MATCH_SCORES)}")
    return score


def score_parts(score: str) -> Tuple[Optional[str], Optional[str]]:
    """(the sparse score that finds the candidates or None = MIPS, the edit score that reranks or None)."""
    sparse, _, edit = score.partition(">")
    if sparse in EDIT_SCORES:
        return None, sparse
    return sparse, edit or None


def fuzzy_score(a: Sequence[str], b: Sequence[str]) -> float:
    """1 - word edit distance / length of the longer sentence (1.0 = identical)."""
    from rapidfuzz.distance import Levenshtein

    if not a and not b:
        return 1.0
    return 1.0 - Levenshtein.distance(a, b) / max(len(a), len(b))


def _scorer(score: str):
    from rapidfuzz.distance import Indel, Levenshtein

    return Levenshtein.normalized_similarity if score == "words" else Indel.normalized_similarity


def fuzzy_scores(a, choices: Sequence, score: str = "words") -> np.ndarray:
    """The match score (:data:`MATCH_SCORES`; "words" = :func:`fuzzy_score`, the same values) of
    ``a`` against each of ``choices`` (their :func:`match_units`), float64, in one call: a
    retrieval reranks 128 candidates per sentence, and a Python call per pair cost more than the
    edit distances."""
    from rapidfuzz.process import cdist

    if not choices:
        return np.zeros(0)
    return cdist([a], choices, scorer=_scorer(score), dtype=np.float64, workers=1)[0]


class TfidfKeys:
    """Model-free sentence keys: char 2-4-gram TF-IDF -> truncated SVD -> L2 norm.

    A large memory is fitted on a fixed-seed sample of ``fit_sample`` sentences and encoded in
    chunks: the whole memory's sparse n-gram matrix (about 300 n-grams a sentence) would cost
    hundreds of MiB for a 100,000-unit TMX, while the n-gram statistics of 20,000 sentences already
    fix the idf weights and the SVD's directions. Memories up to that size are fitted whole, as before."""

    def __init__(self, dim: int = 256, seed: int = 0, fit_sample: int = 20_000, chunk: int = 4096):
        self.dim, self.seed, self.fit_sample, self.chunk = dim, seed, fit_sample, chunk

    def fit(self, sentences: Sequence[str]) -> "TfidfKeys":
        from sklearn.decomposition import TruncatedSVD
        from sklearn.feature_extraction.text import TfidfVectorizer

        if len(sentences) > self.fit_sample:
            rows = np.sort(np.random.default_rng(self.seed).choice(len(sentences), self.fit_sample, replace=False))
            sentences = [sentences[i] for i in rows]
        self.vectorizer = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 4), sublinear_tf=True, lowercase=True,
                                          dtype=np.float32)
        matrix = self.vectorizer.fit_transform(sentences)
        dim = max(1, min(self.dim, matrix.shape[1] - 1, matrix.shape[0] - 1))
        self.svd = TruncatedSVD(dim, random_state=self.seed, algorithm="randomized", n_iter=4)
        self.svd.fit(matrix)
        return self

    def encode(self, sentences: Sequence[str]) -> np.ndarray:
        """Unit-norm float32 keys, ``chunk`` sentences at a time (the sparse matrix of one chunk at once)."""
        out = np.empty((len(sentences), self.svd.n_components), dtype=np.float32)
        for start in range(0, len(sentences), self.chunk):
            part = list(sentences[start:start + self.chunk])
            out[start:start + len(part)] = self.svd.transform(self.vectorizer.transform(part))
        # in place: the keys of a 60,000-unit memory are 61 MB, and the index takes its own copy of them
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-8)
        return out


class Retriever:
    """Top-k entries of a memory for query sentences by the match score ``score``
    (:data:`MATCH_SCORES`): MIPS over :class:`TfidfKeys`, the top ``candidates`` reranked by an
    edit similarity; or a sparse score over the whole memory, optionally its top ``candidates``
    reranked. ``sentencepiece``: a SentencePiece model (path or processor) for the pieces scores."""

    def __init__(self, entries: MemoryEntries, dim: int = 256, index: str = "exact", candidates: int = 32,
                 score: str = DEFAULT_MATCH_SCORE, sentencepiece=None):
        if len(entries) == 0:
            raise TranslationMemoryError(f"{entries.origin}: the memory is empty")
        self.entries, self.candidates, self.score = entries, candidates, check_match_score(score)
        self.dim, self.index_kind, self.sentencepiece = dim, index, sentencepiece
        # what was fitted (the MIPS keys and index, sparse spaces by name), shared with rescored copies
        self._fitted: dict = {"dense": None, "spaces": {}}
        if "pieces" in score:
            self._pieces()  # no model: one line now, not at the first search

    @property
    def keys(self) -> TfidfKeys:
        return self._dense_keys()[0]

    @property
    def index(self):
        return self._dense_keys()[1]

    def _dense_keys(self):
        """The MIPS keys and index, fitted when an edit score first needs them (the slow part)."""
        from reluformer_mt.memory.mips import MipsIndex

        if self._fitted["dense"] is None:
            keys = TfidfKeys(self.dim).fit(self.entries.sources)
            self._fitted["dense"] = (keys, MipsIndex(self.index_kind).build(keys.encode(self.entries.sources)))
        return self._fitted["dense"]

    def _pieces(self):
        sp = self.sentencepiece
        if sp is None:
            raise TranslationMemoryError(f"match score {self.score!r}: needs a SentencePiece model for its pieces "
                                         "(a prepared directory's spm.model)")
        if isinstance(sp, (str, Path)):
            import sentencepiece

            sp = self.sentencepiece = sentencepiece.SentencePieceProcessor(model_file=str(sp))
        return lambda text: sp.encode(text, out_type=str)

    def space(self, name: str):
        from reluformer_mt.memory.sparse_scores import SparseSpace

        spaces = self._fitted["spaces"]
        if name not in spaces:
            weighting, units = name.split("-")
            pieces = self._pieces() if units == "pieces" else None
            spaces[name] = SparseSpace(weighting, units, pieces).fit(self.entries.sources)
        return spaces[name]

    def rescored(self, score: str) -> "Retriever":
        """The same memory with another score; keys, index and sparse spaces fitted once for both."""
        import copy

        other = copy.copy(self)
        other.score = check_match_score(score)
        if "pieces" in score:
            other._pieces()
        return other

    def _candidates(self, queries: Sequence[str], wanted: int, exclude):
        """(ids, their sparse scores or None) of each query's ``wanted`` candidates."""
        sparse, _ = score_parts(self.score)
        if sparse is not None:
            return self.space(sparse).top(queries, wanted, exclude)
        keys, index = self._dense_keys()
        return index.search(keys.encode(list(queries)), wanted)[1], None

    def search(self, queries: Sequence[str], k: int, exclude: Optional[Sequence[int]] = None,
               batch: int = 4096) -> Tuple[np.ndarray, np.ndarray]:
        """(ids, match scores), each (len(queries), k), best first; id -1 where fewer than k
        entries exist. ``exclude[i]``: an entry query i must not retrieve (itself, in training)."""
        n = len(queries)
        ids = np.full((n, k), -1, dtype=np.int64)
        scores = np.zeros((n, k), dtype=np.float32)
        _, edit = score_parts(self.score)
        wanted = min(len(self.entries), (max(k, self.candidates) if edit else k) + (1 if exclude is not None else 0))
        for start in range(0, n, batch):
            chunk = list(queries[start:start + batch])
            part = None if exclude is None else exclude[start:start + batch]
            found, sparse_scores = self._candidates(chunk, wanted, part)
            for row, (query, candidates) in enumerate(zip(chunk, found)):
                skip = part[row] if part is not None else -1
                kept = [(rank, int(c)) for rank, c in enumerate(candidates) if c >= 0 and c != skip]
                if edit is None:  # the sparse score's own order and values
                    scores_of = [float(sparse_scores[row, rank]) for rank, _ in kept]
                else:
                    # the candidates' units are split here, not kept for the whole memory (a list of
                    # word strings per entry is the largest part of a big memory's footprint)
                    choices = [match_units(self.entries.sources[c], edit) for _, c in kept]
                    scores_of = fuzzy_scores(match_units(query, edit), choices, edit).tolist()
                ranked = sorted(((score, -rank, c) for score, (rank, c) in zip(scores_of, kept)), reverse=True)
                for j, (score, _, c) in enumerate(ranked[:k]):
                    ids[start + row, j], scores[start + row, j] = c, score
        return ids, scores

    def exact_best(self, queries: Sequence[str], exclude: Optional[Sequence[int]] = None) -> np.ndarray:
        """The best match score of each query over the whole memory (scored exhaustively: the
        reference that retrieval recall is measured against)."""
        from rapidfuzz.process import extract

        _, edit = score_parts(self.score)
        if edit is None:  # a sparse score already ranks the whole memory
            return self.search(queries, 1, exclude)[1][:, 0]
        # every entry's units once per call (a processor would split the whole memory per query)
        units = [match_units(s, edit) for s in self.entries.sources]
        best = np.zeros(len(queries), dtype=np.float32)
        for i, query in enumerate(queries):
            skip = exclude[i] if exclude is not None else -1
            found = extract(match_units(query, edit), units, scorer=_scorer(edit), limit=2, processor=None)
            best[i] = next((score for _, score, c in found if c != skip), 0.0)
        return best


def band_of(score: float) -> str:
    """The fuzzy band of a score; a float32 0.7 (0.69999999) is in 70-90, as the exact 0.7 is."""
    for low, high, name in FUZZY_BANDS:
        if low - BAND_TOLERANCE <= score < high - BAND_TOLERANCE:
            return name
    return FUZZY_BANDS[-1][2] if score >= FUZZY_BANDS[-1][0] else FUZZY_BANDS[0][2]


def at_least(score, bound: float):
    """score >= bound for float32 scores (see ``BAND_TOLERANCE``); works on arrays too."""
    return score >= bound - BAND_TOLERANCE


def copyable_target(target: Optional[str], separator: str = "<sep>") -> bool:
    """Whether a match's target can be an output line: no control character but tabs (a NUL, a line
    break), no reserved ``separator``, not a document marker (read back as a document break), not blank."""
    from reluformer_mt.data.documents import is_doc_marker

    if not target or not target.strip():
        return False
    control = any((ord(c) < 32 and c != "\t") or ord(c) == 127 for c in target)
    return not control and separator not in target and not is_doc_marker(target)


def memory_first(outputs: Sequence[str], copies: Sequence[Optional[str]], scores: Sequence[float],
                 threshold: Optional[float]) -> List[str]:
    """TM-first: each output replaced by its best match's target (``copies``; None = no match) where
    the match scores >= ``threshold`` (None: off) and the target can be an output line
    (:func:`copyable_target`), as a CAT tool offers a high match before any MT."""
    if threshold is None:
        return list(outputs)
    return [c if copyable_target(c) and at_least(s, threshold) else o for o, c, s in zip(outputs, copies, scores)]


def recall_at_k(scores: np.ndarray, best: np.ndarray, ks: Sequence[int] = (1, 4, 16)) -> dict:
    """Share of queries whose first k retrieved entries include one with the exact best
    fuzzy-match score (``best``, from :meth:`Retriever.exact_best`; ties count as found)."""
    return {f"recall@{k}": float(np.mean(scores[:, :k].max(1) >= best - 1e-6)) for k in ks if k <= scores.shape[1]}


__all__ = ["DEFAULT_MATCH_SCORE", "LEGACY_MATCH_SCORE", "FUZZY_BANDS", "MATCH_SCORES", "score_parts", "at_least", "match_units", "text_encoding", "MemoryEntries", "TranslationMemoryError", "Retriever", "TfidfKeys", "band_of", "copyable_target", "fuzzy_score", "memory_first", "fuzzy_scores",
           "read_memory", "read_prepared", "read_tmx", "read_tsv", "recall_at_k"]
