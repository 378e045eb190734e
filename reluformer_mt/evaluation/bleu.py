"""s-BLEU and d-BLEU with sacreBLEU (Post, 2018), and the readers that feed them.

Definitions (docs/METHODS.md section 4):
- s-BLEU: corpus BLEU over sentences. Document-level output is split back into sentences with
  the segment metadata (``reluformer_mt.data.segments``); hypothesis and reference must have the
  same number of sentences in every document, otherwise it is an error naming the document.
- d-BLEU: corpus BLEU over whole documents (each document's sentences joined by a space), or
  over segments when asked (``level="segment"``). The report always names the level.
- s-chrF and d-chrF: sacreBLEU's chrF over the same sentences and whole documents; chrF++ (chrF
  with word unigrams and bigrams, Popović, WMT 2017) and TER (Snover et al. 2006) likewise.
- Detokenisation: references that are tokenised text (the bible's "vineyard .") make sacreBLEU
  warn and give scores that other work cannot compare with; ``detokenize="moses"`` runs
  sacremoses' Moses detokeniser over hypotheses and references before every score.

Scores are sacreBLEU's (its own tokenizer, 13a by default, on the text as given) and equal the ``sacrebleu`` command line
on the same sentence (or document-per-line) files. Files are read the way that command reads them
(split on ``\\n`` only, trailing whitespace stripped), so CRLF files give the same score; ``-``
is standard input, and a pipe (``/dev/stdin``, a FIFO, ``<(...)``) is read once, as sacreBLEU does.
"""
import os
import re
import shutil
import stat
import sys
import tempfile
from collections import OrderedDict
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from sacrebleu.metrics import BLEU, CHRF, TER

from reluformer_mt.data import textfiles
from reluformer_mt.data.documents import DOC_MARKER, FORMAT as DOCMT, read_documents, starts_with_marker
from reluformer_mt.data.segments import SEPARATOR, SegmentInfo, read_segment_metadata, segments_to_documents, split_segment
from reluformer_mt.data.wording import counted

SPM_SPACE = "\u2581"  # SentencePiece's word-start mark '▁'

Docs = Dict[str, List[str]]  # doc id -> sentences, in document order (dicts keep insertion order)


@dataclass
class BleuResult:
    """One sacreBLEU score with what it was computed over."""
    score: float
    signature: str
    level: str  # "sentence" (s-BLEU), "document" or "segment" (d-BLEU)
    n_items: int  # sentences, documents or segments scored
    precisions: List[float] = field(default_factory=list)
    bp: float = 0.0
    sys_len: int = 0
    ref_len: int = 0
    verbose: str = ""

    @property
    def name(self) -> str:
        return "s-BLEU" if self.level == "sentence" else f"d-BLEU ({self.level}s)"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["name"] = self.name
        return d

    def __str__(self) -> str:
        return f"{self.name} = {self.score:.2f} {self.verbose} over {self.n_items} {self.level}s | BLEU|{self.signature}"


def _bleu(hyps: Sequence[str], refs: Sequence[str], level: str, tokenize: str = "13a", lowercase: bool = False,
          more_refs: Sequence[Sequence[str]] = ()) -> BleuResult:
    for other in [refs, *more_refs]:
        if len(hyps) != len(other):
            raise ValueError(f"{len(hyps)} hypotheses but {len(other)} references")
    metric = BLEU(tokenize=tokenize, lowercase=lowercase)
    r = metric.corpus_score(list(hyps), [list(refs)] + [list(x) for x in more_refs])
    verbose = " ".join(f"{p:.1f}" for p in r.precisions).replace(" ", "/")
    verbose += f" (BP = {r.bp:.3f} ratio = {r.sys_len / max(r.ref_len, 1):.3f} hyp_len = {r.sys_len} ref_len = {r.ref_len})"
    return BleuResult(score=r.score, signature=str(metric.get_signature()), level=level, n_items=len(hyps),
                      precisions=list(r.precisions), bp=r.bp, sys_len=r.sys_len, ref_len=r.ref_len, verbose=verbose)


def corpus_sbleu(hyps: Sequence[str], refs: Sequence[str], tokenize: str = "13a", lowercase: bool = False,
                 more_refs: Sequence[Sequence[str]] = ()) -> BleuResult:
    """s-BLEU: corpus BLEU over aligned sentence lists (``more_refs``: further references, as sacreBLEU's)."""
    return _bleu(hyps, refs, "sentence", tokenize, lowercase, more_refs)


def _join(doc: Union[str, Sequence[str]]) -> str:
    return doc if isinstance(doc, str) else " ".join(s.strip() for s in doc)


def corpus_dbleu(hyp_docs: Sequence[Union[str, Sequence[str]]], ref_docs: Sequence[Union[str, Sequence[str]]],
                 tokenize: str = "13a", lowercase: bool = False, level: str = "document",
                 more_refs: Sequence[Sequence[Union[str, Sequence[str]]]] = ()) -> BleuResult:
    """d-BLEU: corpus BLEU where each item is a whole document (or segment, ``level="segment"``).

    An item is either a string or a list of sentences, joined with single spaces.
    """
    if level not in ("document", "segment"):
        raise ValueError(f"level must be 'document' or 'segment', got {level!r}")
    return _bleu([_join(d) for d in hyp_docs], [_join(d) for d in ref_docs], level, tokenize, lowercase,
                 [[_join(d) for d in other] for other in more_refs])


@dataclass
class ChrfResult:
    """sacreBLEU's chrF (Popović, WMT 2015; defaults: character 6-grams, beta 2, no word n-grams),
    or chrF++ with ``word_order=2`` (word unigrams and bigrams too; Popović, WMT 2017)."""
    score: float
    signature: str
    level: str  # "sentence" (s-chrF) or "document" (d-chrF)
    n_items: int
    word_order: int = 0

    @property
    def name(self) -> str:
        return ("s-" if self.level == "sentence" else "d-") + ("chrF++" if self.word_order else "chrF")

    def to_dict(self) -> dict:
        return {**asdict(self), "name": self.name}


def corpus_chrf(hyps: Sequence[Union[str, Sequence[str]]], refs: Sequence[Union[str, Sequence[str]]],
                level: str = "document", lowercase: bool = False, word_order: int = 0, more_refs=()) -> ChrfResult:
    """Corpus chrF over items: sentences, or whole documents (lists of sentences joined by a
    space, as for d-BLEU); equal to ``sacrebleu REF -i HYP -m chrf`` on one item a line
    (``--chrf-word-order 2`` for chrF++)."""
    for other in [refs, *more_refs]:
        if len(hyps) != len(other):
            raise ValueError(f"{len(hyps)} hypotheses but {len(other)} references")
    metric = CHRF(lowercase=lowercase, word_order=word_order)
    r = metric.corpus_score([_join(h) for h in hyps], [[_join(x) for x in other] for other in [refs, *more_refs]])
    return ChrfResult(score=r.score, signature=str(metric.get_signature()), level=level, n_items=len(hyps),
                      word_order=word_order)


def chrf_scores(pairs, levels=("sentence", "document"), mismatched: bool = False,
                lowercase: bool = False, word_order: int = 0, more_pairs=()) -> Dict[str, ChrfResult]:
    """s-chrF and d-chrF (chrF++ with ``word_order=2``) of paired documents (``pair_documents``;
    ``more_pairs``: the same documents paired with further references)."""
    out: Dict[str, ChrfResult] = {}
    if "sentence" in levels and not mismatched:
        out["sentence"] = corpus_chrf([s for _, hs, _ in pairs for s in hs], [s for _, _, rs in pairs for s in rs],
                                      "sentence", lowercase, word_order,
                                      [[s for _, _, rs in more for s in rs] for more in more_pairs])
    if "document" in levels:
        out["document"] = corpus_chrf([hs for _, hs, _ in pairs], [rs for _, _, rs in pairs], "document", lowercase,
                                      word_order, [[rs for _, _, rs in more] for more in more_pairs])
    return out


@dataclass
class TerResult:
    """sacreBLEU's TER (Snover et al. 2006): edits per reference word, in %; lower is better."""
    score: float
    signature: str
    level: str
    n_items: int
    unshifted: int = 0  # items longer than max_words, scored without the shift search
    max_words: int = 0

    @property
    def name(self) -> str:
        return "s-TER" if self.level == "sentence" else "d-TER"

    def to_dict(self) -> dict:
        return {**asdict(self), "name": self.name}


# TER's shift search costs seconds per line of a few hundred words and minutes for a whole talk on
# a line (a 3,000-word line: 134 s, its edit distance alone 0.35 s); sentences stay far below this
TER_MAX_WORDS = 300


class BoundedTER(TER):
    """sacreBLEU's TER, except that an item longer than ``max_words`` words (hypothesis or a
    reference) is scored without the shift search: its edits are TER's beam edit distance
    alone, an upper bound of TER's edits (a shift can only save edits). ``unshifted`` counts
    those items; ``max_words`` 0 searches shifts everywhere (sacreBLEU's TER exactly)."""

    def __init__(self, max_words: int = TER_MAX_WORDS, **kwargs):
        super().__init__(**kwargs)
        self.max_words, self.unshifted = int(max_words), 0

    def _compute_segment_statistics(self, hypothesis: str, ref_kwargs: dict) -> list:
        words_hyp, refs = hypothesis.split(), ref_kwargs["ref_words"]
        if not self.max_words or max([len(words_hyp)] + [len(r) for r in refs]) <= self.max_words:
            return super()._compute_segment_statistics(hypothesis, ref_kwargs)
        from sacrebleu.metrics.lib_ter import BeamEditDistance

        self.unshifted += 1
        edits = [BeamEditDistance(r)(words_hyp)[0] if r else len(words_hyp) for r in refs]
        return [min(edits), sum(len(r) for r in refs) / len(refs)]


def corpus_ter(hyps: Sequence[Union[str, Sequence[str]]], refs: Sequence[Union[str, Sequence[str]]],
               level: str = "document", lowercase: bool = False, more_refs=(), max_words: int = TER_MAX_WORDS) -> TerResult:
    """Corpus TER over sentences or whole documents; equal to ``sacrebleu REF -i HYP -m ter``
    (which, unlike BLEU and chrF, ignores case unless told otherwise: ``lowercase`` changes nothing)
    where no item has more than ``max_words`` words (:class:`BoundedTER`; 0: no bound)."""
    for other in [refs, *more_refs]:
        if len(hyps) != len(other):
            raise ValueError(f"{len(hyps)} hypotheses but {len(other)} references")
    metric = BoundedTER(max_words)
    r = metric.corpus_score([_join(h) for h in hyps], [[_join(x) for x in other] for other in [refs, *more_refs]])
    return TerResult(score=r.score, signature=str(metric.get_signature()), level=level, n_items=len(hyps),
                     unshifted=metric.unshifted, max_words=metric.max_words)


def ter_note(result: TerResult) -> Optional[str]:
    """The line that says which items were scored without TER's shift search, if any."""
    if not result.unshifted:
        return None
    return (f"{result.name}: {result.unshifted} of {result.n_items} {result.level}s have more than {result.max_words} "
            "words: scored without TER's shift search (its edit distance alone, an upper bound of their edits; "
            "--ter-max-words 0 searches shifts on every line, minutes for a whole talk)")


def ter_scores(pairs, levels=("sentence",), mismatched: bool = False, lowercase: bool = False,
               more_pairs=(), max_words: int = TER_MAX_WORDS) -> Dict[str, TerResult]:
    """s-TER of paired documents (``pair_documents``). Never over whole documents: TER's shift
    search grows faster than quadratically with the item's length (a TED talk of 2,000 words took
    minutes), and d-TER is not what other work reports; lines longer than ``max_words`` words
    (whole talks on a line) skip the shift search (:class:`BoundedTER`)."""
    out: Dict[str, TerResult] = {}
    if "sentence" in levels and not mismatched:
        out["sentence"] = corpus_ter([s for _, hs, _ in pairs for s in hs], [s for _, _, rs in pairs for s in rs],
                                     "sentence", lowercase, [[s for _, _, rs in more for s in rs] for more in more_pairs],
                                     max_words)
    return out


# ----------------------------------------------------------------------------------------------
# detokenisation

DETOKENIZERS = ("none", "moses")


def moses_detokenize(lines: Sequence[str], lang: str = "en") -> List[str]:
    """Tokenised text ("the vineyard .") -> plain text ("the vineyard.") with sacremoses' port of
    the Moses detokeniser (Koehn et al. 2007), so that BLEU's own 13a tokenisation sees text as
    other work feeds it."""
    try:
        from sacremoses import MosesDetokenizer
    except ImportError as e:  # a requirement; say which one when it is missing
        raise ValueError("detokenising needs sacremoses (pip install sacremoses)") from e
    detok = MosesDetokenizer(lang=lang)
    return [detok.detokenize(line.split()) for line in lines]


def detokenize_pairs(pairs, lang: str = "en"):
    """``pair_documents`` pairs with hypothesis and reference sentences detokenised."""
    return [(d, moses_detokenize(hs, lang), moses_detokenize(rs, lang)) for d, hs, rs in pairs]


# ----------------------------------------------------------------------------------------------
# readers

def read_lines(path) -> List[str]:
    """Lines as the sacrebleu CLI reads them: split on '\\n' only, trailing whitespace removed, a BOM kept."""
    return [line.rstrip() for line in textfiles.read_lines(path, strip_bom=False)]


def read_docmt(path) -> Docs:
    """A ``docmt`` file (a line ``<d>`` starts each document) through the one reader of
    :mod:`reluformer_mt.data.documents`; lines as sacrebleu reads them (:func:`read_lines`).

    Documents get the ids "0", "1", ... in file order.
    """
    found = read_documents(read_lines(path), str(path))
    if not found.documents:
        raise ValueError(f"{path}: empty file, expected documents starting with {DOC_MARKER!r}")
    return OrderedDict((str(i), [line for _, line in doc]) for i, doc in enumerate(found.documents))


LINES = "lines"  # reluformer-translate's layout: a sentence a line, a blank line between documents


def read_blank_line_documents(path) -> Docs:
    """A file of the ``lines`` layout (what ``reluformer-translate`` writes for a ``lines`` input):
    every blank line ends a document (the rule of its reader, so two blank lines hold an empty
    document). Documents get the ids "0", "1", ... in file order, as :func:`read_docmt`'s."""
    docs, current = [], []
    for line in read_lines(path):
        if line.strip():
            current.append(line)
        else:
            docs.append(current)
            current = []
    docs.append(current)
    return OrderedDict((str(i), doc) for i, doc in enumerate(docs))


def has_blank_line(path) -> bool:
    return any(not line.strip() for line in read_lines(path))


def group_by_doc_ids(lines: Sequence[str], doc_ids: Sequence[str], where: str = "") -> Docs:
    """Group line-aligned sentences by their doc id, keeping first-appearance order.

    A document's lines must be contiguous; an id that comes back after another one is an error.
    """
    if len(lines) != len(doc_ids):
        raise ValueError(f"{where}: {len(lines)} sentences but {len(doc_ids)} doc ids")
    docs: Docs = OrderedDict()
    last = None
    for i, (line, doc) in enumerate(zip(lines, doc_ids), 1):
        if doc != last and doc in docs:
            raise ValueError(f"{where}:{i}: document {doc!r} appears again after other documents (lines of a document must be contiguous)")
        docs.setdefault(doc, []).append(line)
        last = doc
    return docs


def split_like(lines: Sequence[str], template: Docs, where: str = "") -> Docs:
    """Cut a flat sentence list into documents with the sizes of ``template``."""
    total = sum(len(v) for v in template.values())
    if len(lines) != total:
        raise ValueError(f"{where}: {len(lines)} sentences, but the other side's documents hold {total}")
    docs: Docs = OrderedDict()
    pos = 0
    for doc, sents in template.items():
        docs[doc] = list(lines[pos:pos + len(sents)])
        pos += len(sents)
    return docs


# ----------------------------------------------------------------------------------------------
# fairseq-generate output

@dataclass
class GeneratedSample:
    source: Optional[str] = None
    target: Optional[str] = None
    hypothesis: Optional[str] = None  # the best hypothesis (first H line); D line if present


_GEN_LINE = re.compile(r"^([STHD])-(\d+)\t(.*)$")


def spm_detokenize(text: str) -> str:
    """SentencePiece pieces -> text, as fairseq's ``--post-process sentencepiece`` does."""
    return text.replace(" ", "").replace(SPM_SPACE, " ").strip()


def read_fairseq_generate(path, pieces: str = "auto") -> Dict[int, GeneratedSample]:
    """Parse ``fairseq-generate`` output into {sample id: GeneratedSample}.

    S-/T- lines are ``X-id<TAB>text``; H-/D- lines are ``X-id<TAB>score<TAB>text``. With
    several hypotheses per sample (--nbest), the first one is kept. The D (detokenised) line is
    preferred over H when present. ``pieces``: "yes" = texts are SentencePiece pieces and are
    detokenised; "no" = already text (generated with ``--post-process sentencepiece``);
    "auto" = decided for H/D, T and S lines separately: pieces when any line of that kind
    contains '▁'. Other lines (logs, P- lines) are ignored.
    """
    if pieces not in ("auto", "yes", "no"):
        raise ValueError(f"pieces must be auto, yes or no, got {pieces!r}")
    samples: Dict[int, GeneratedSample] = {}
    best_h: Dict[int, str] = {}
    best_d: Dict[int, str] = {}
    with open(path, encoding="utf-8", newline="\n") as f:
        for line in f:
            m = _GEN_LINE.match(line.rstrip("\r\n"))
            if not m:
                continue
            kind, sid, rest = m.group(1), int(m.group(2)), m.group(3)
            s = samples.setdefault(sid, GeneratedSample())
            if kind in "HD":
                fields = rest.split("\t", 1)  # score, text
                text = fields[1] if len(fields) == 2 else ""
                (best_h if kind == "H" else best_d).setdefault(sid, text)  # first = best of the n-best
            elif kind == "S":
                s.source = rest
            else:
                s.target = rest
    for sid, s in samples.items():
        s.hypothesis = best_d.get(sid, best_h.get(sid))
    if not samples:
        raise ValueError(f"{path}: no S-/T-/H- lines of fairseq-generate output found")
    missing_h = sorted(i for i, s in samples.items() if s.hypothesis is None)
    if missing_h:
        raise ValueError(f"{path}: no H- line for sample id(s) {missing_h[:10]}")
    for name in ("hypothesis", "target", "source"):  # decided per kind of line, for the whole file
        texts = [getattr(s, name) for s in samples.values() if getattr(s, name) is not None]
        if pieces == "yes" or (pieces == "auto" and any(SPM_SPACE in t for t in texts)):
            for s in samples.values():
                if getattr(s, name) is not None:
                    setattr(s, name, spm_detokenize(getattr(s, name)))
    return samples


def _texts_by_id(texts: Union[Mapping[int, str], Sequence[str]], n: int, what: str) -> List[str]:
    if isinstance(texts, Mapping):
        missing = [i for i in range(n) if i not in texts]
        if missing:
            raise ValueError(f"{what}: no text for sample id(s) {missing[:10]} (segment metadata has {n} examples)")
        extra = sorted(i for i in texts if not 0 <= i < n)
        if extra:
            raise ValueError(f"{what}: sample id(s) {extra[:10]} beyond the {n} examples of the segment metadata")
        return [texts[i] for i in range(n)]
    if len(texts) != n:
        raise ValueError(f"{what}: {len(texts)} texts but the segment metadata has {n} examples")
    return list(texts)


def sentences_from_segments(texts: Union[Mapping[int, str], Sequence[str]], segments: Sequence[SegmentInfo],
                            separator: str = SEPARATOR, strict: bool = True) -> Docs:
    """Split translated segments (indexed by sample id; ``segments[i]`` describes sample id i)
    back into the sentences of each document (``segments_to_documents``). A segment that splits
    into a different number of sentences than its metadata says is an error naming the document,
    the segment and both counts; with ``strict=False`` its pieces are kept as they are, so that
    document's sentence count differs from the reference (reported by ``pair_documents``) while
    its text still serves d-BLEU."""
    texts = _texts_by_id(texts, len(segments), "segments")
    return segments_to_documents(texts, segments, separator, "error" if strict else "keep")


def segment_texts(texts: Union[Mapping[int, str], Sequence[str]], segments: Sequence[SegmentInfo],
                  separator: str = SEPARATOR) -> List[Tuple[SegmentInfo, str]]:
    """(segment, text without separators) per sample id, for d-BLEU over segments."""
    texts = _texts_by_id(texts, len(segments), "segments")
    return [(seg, " ".join(split_segment(t, separator))) for t, seg in zip(texts, segments)]


# ----------------------------------------------------------------------------------------------
# pairing hypothesis and reference documents

def pair_documents(hyp_docs: Docs, ref_docs: Docs, match: str = "id", allow_mismatch: bool = False
                   ) -> Tuple[List[Tuple[str, List[str], List[str]]], List[Tuple[str, int, int]]]:
    """Pair documents by id (or by order) and check their sentence counts.

    Returns (pairs, mismatches) with pairs = [(doc id, hyp sentences, ref sentences)] in the
    hypothesis order and mismatches = [(doc id, hyp count, ref count)]. A mismatch raises
    ValueError unless ``allow_mismatch``; nothing is ever padded.
    """
    if match == "order":
        if len(hyp_docs) != len(ref_docs):
            raise ValueError(f"hypothesis has {len(hyp_docs)} documents but reference has {len(ref_docs)}")
        pairs = [(h, hs, rs) for (h, hs), rs in zip(hyp_docs.items(), ref_docs.values())]
    elif match == "id":
        missing = [d for d in hyp_docs if d not in ref_docs]
        if missing:
            raise ValueError(f"document(s) {missing[:5]} of the hypothesis are not in the reference "
                             f"(reference ids look like {list(ref_docs)[:3]}; --match-docs-by order pairs them by position)")
        extra = [d for d in ref_docs if d not in hyp_docs]
        if extra:
            raise ValueError(f"document(s) {extra[:5]} of the reference have no hypothesis")
        pairs = [(d, hs, ref_docs[d]) for d, hs in hyp_docs.items()]
    else:
        raise ValueError(f"match must be 'id' or 'order', got {match!r}")
    mismatches = [(d, len(hs), len(rs)) for d, hs, rs in pairs if len(hs) != len(rs)]
    if mismatches and not allow_mismatch:
        d, nh, nr = mismatches[0]
        more = f" (and {len(mismatches) - 1} more documents)" if len(mismatches) > 1 else ""
        raise ValueError(f"document {d!r}: hypothesis has {nh} sentences, reference has {nr}{more}")
    return pairs, mismatches


def score_documents(pairs, levels=("sentence", "document"), segments: Optional[Sequence[SegmentInfo]] = None,
                    hyp_segment_texts: Optional[List[Tuple[SegmentInfo, str]]] = None, mismatched: bool = False,
                    tokenize: str = "13a", lowercase: bool = False, more_pairs=()) -> Dict[str, BleuResult]:
    """Score paired documents at the asked levels ("sentence", "document", "segment").

    With ``mismatched`` (some documents differ in sentence count) only document-level d-BLEU
    is computed. Segment level needs ``segments``; its hypothesis side is ``hyp_segment_texts``
    when given (fairseq-generate output), else the hypothesis sentences of the segment.
    """
    out: Dict[str, BleuResult] = {}
    if "sentence" in levels and not mismatched:
        out["sentence"] = corpus_sbleu([s for _, hs, _ in pairs for s in hs], [s for _, _, rs in pairs for s in rs],
                                       tokenize, lowercase, [[s for _, _, rs in more for s in rs] for more in more_pairs])
    if "document" in levels:
        out["document"] = corpus_dbleu([hs for _, hs, _ in pairs], [rs for _, _, rs in pairs], tokenize, lowercase,
                                       more_refs=[[rs for _, _, rs in more] for more in more_pairs])
    if "segment" in levels and segments is not None:
        if more_pairs:
            raise ValueError("segment-level d-BLEU takes one reference")
        refs = {d: rs for d, _, rs in pairs}
        hyps = {d: hs for d, hs, _ in pairs}
        if hyp_segment_texts is None:
            if mismatched:
                return out
            hyp_segment_texts = [(seg, _join(hyps[seg.doc_id][seg.first_sentence:seg.first_sentence + seg.n_sentences]))
                                 for seg in segments]
        seg_refs = []
        for seg, _ in hyp_segment_texts:
            rs = refs[seg.doc_id]
            if seg.first_sentence + seg.n_sentences > len(rs):
                raise ValueError(f"document {seg.doc_id!r}: segment of sentences {seg.first_sentence}.."
                                 f"{seg.first_sentence + seg.n_sentences - 1} but the reference has {len(rs)} sentences")
            seg_refs.append(rs[seg.first_sentence:seg.first_sentence + seg.n_sentences])
        out["segment"] = corpus_dbleu([t for _, t in hyp_segment_texts], seg_refs, tokenize, lowercase, level="segment")
    return out


# ----------------------------------------------------------------------------------------------
# from files: what ``reluformer-eval bleu`` runs

def detect_format(path) -> str:
    """'docmt' if the first non-blank line is ``<d>`` (:func:`reluformer_mt.data.documents.starts_with_marker`),
    'generate' if fairseq-generate lines appear early, else 'plain'."""
    with open(path, encoding="utf-8", newline="\n") as f:
        head = [line for _, line in zip(range(500), f)]
    if starts_with_marker(head):
        return DOCMT
    if any(_GEN_LINE.match(line.rstrip("\r\n")) for line in head):
        return "generate"
    return "plain"


def definition_line(scores: Dict[str, BleuResult], n_sentences: int, n_documents: int, tokenize: str = "13a",
                    lowercase: bool = False) -> str:
    """What the scores are computed over; names only the levels that were scored (without
    document boundaries there is no d-BLEU to define)."""
    parts = [f"sacreBLEU ({tokenize}{', lowercased' if lowercase else ''})"]
    if "sentence" in scores:
        parts.append(f"s-BLEU = corpus BLEU over {n_sentences} reference sentences")
    if "document" in scores:
        parts.append(f"d-BLEU = corpus BLEU over {n_documents} whole documents (sentences joined by a space)")
    if "segment" in scores:
        parts.append("segment d-BLEU over the segments of the metadata")
    return "; ".join(parts)


def resolve_layouts(hyp, refs, hyp_format: str, ref_format: str, notes: List[str]) -> Tuple[str, str]:
    """``auto`` for a plain file with blank lines: the ``lines`` layout (documents between blank
    lines, reluformer-translate's output) when the other side has documents too (``<d>`` lines or
    blank lines), or when the hypothesis's lines less its blank lines are the reference's sentences;
    else plain (a blank line an empty sentence, as sacreBLEU reads it)."""
    def detected(path, fmt):
        if fmt != "auto":
            return fmt, False
        found = detect_format(path)
        return found, found == "plain" and has_blank_line(path)

    (hyp_fmt, hyp_blank), (ref_fmt, ref_blank) = detected(hyp, hyp_format), detected(refs[0], ref_format)
    ref_blank = ref_blank and all(has_blank_line(r) for r in refs[1:])
    hyp_docs, ref_docs = hyp_blank or hyp_fmt in (DOCMT, LINES), ref_blank or ref_fmt in (DOCMT, LINES)
    chosen = []
    if hyp_blank and (ref_docs or (ref_fmt == "plain" and _sentences_without_blanks(hyp) == len(read_lines(refs[0]))
                                   != len(read_lines(hyp)))):
        hyp_fmt = LINES
        chosen.append("the hypothesis")
    if ref_blank and hyp_docs:
        ref_fmt = LINES
        chosen.append("the reference" + ("s" if len(refs) > 1 else ""))
    if chosen:
        notes.append(f"{' and '.join(chosen)} read as documents separated by blank lines (reluformer-translate's "
                     f"lines layout; --hyp-format/--ref-format plain reads a blank line as an empty sentence)")
    return hyp_fmt, ref_fmt


def _sentences_without_blanks(path) -> int:
    return sum(1 for line in read_lines(path) if line.strip())


def check_not_empty(hyp, ref) -> None:
    """An empty (0-byte) hypothesis or reference is an error naming both files, never a score."""
    n_hyp, n_ref = (len(read_lines(p)) if os.path.getsize(p) else 0 for p in (hyp, ref))
    if not n_hyp and not n_ref:
        raise ValueError(f"nothing to score: hypothesis {hyp} and reference {ref} are both empty")
    if not n_hyp or not n_ref:
        raise ValueError(f"hypothesis {hyp} has {n_hyp} lines but reference {ref} has {n_ref}: "
                         f"the {'hypothesis' if not n_hyp else 'reference'} file is empty")


def _load_side(path, fmt, doc_ids, segments, separator, pieces, strict, use_target=False):
    """-> (docs or flat list of sentences, segment texts or None)."""
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt == DOCMT:
        return read_docmt(path), None
    if fmt == LINES:
        return read_blank_line_documents(path), None
    if fmt == "plain":
        lines = read_lines(path)
        if doc_ids:
            ids = [x.strip() for x in read_lines(doc_ids)]
            if len(lines) != len(ids):
                raise ValueError(f"{path} has {len(lines)} lines but {doc_ids} has {len(ids)} doc ids")
            return group_by_doc_ids(lines, ids, where=str(doc_ids)), None
        return lines, None
    if fmt != "generate":
        raise ValueError(f"unknown input format {fmt!r} (auto, {DOCMT}, {LINES}, plain, generate)")
    samples = read_fairseq_generate(path, pieces)
    what = "T" if use_target else "H"
    texts = {i: (s.target if use_target else s.hypothesis) for i, s in samples.items()}
    missing = sorted(i for i, t in texts.items() if t is None)
    if missing:
        raise ValueError(f"{path}: no {what}- line for sample id(s) {missing[:10]}")
    if segments is not None:
        return sentences_from_segments(texts, segments, separator, strict), segment_texts(texts, segments, separator)
    return _texts_by_id(texts, len(texts), str(path)), None


STDIN = "-"


def input_label(path) -> str:
    """How an input is named in reports: ``<stdin>`` for ``-``."""
    return "<stdin>" if str(path) == STDIN else str(path)


def is_stream(path) -> bool:
    """Standard input (``-``) or a file that can be read only once (a pipe, ``/dev/stdin``)."""
    if path is None:
        return False
    if str(path) == STDIN:
        return True
    try:
        return not stat.S_ISREG(os.stat(path).st_mode) and not stat.S_ISDIR(os.stat(path).st_mode)
    except OSError:
        return False  # a missing file: the reader names it


@contextmanager
def read_once(paths: Dict[str, Optional[str]]):
    """Copy each input that is a stream into a temporary file, so the format detection and the
    reader can both read it (sacreBLEU reads standard input once, too).

    ``paths``: option name -> path. Yields (option -> readable path, temporary path -> display
    name); at most one option may be standard input."""
    stdin_options = [o for o, p in paths.items() if p is not None and str(p) == STDIN]
    if len(stdin_options) > 1:
        raise ValueError(f"{' and '.join(stdin_options)} are both '-': only one input can be standard input")
    readable, names = dict(paths), {}
    with tempfile.TemporaryDirectory(prefix="reluformer-bleu-") as folder:
        for option, path in paths.items():
            if not is_stream(path):
                continue
            copy = os.path.join(folder, option.strip("-"))
            with open(copy, "wb") as out:
                if str(path) == STDIN:
                    shutil.copyfileobj(sys.stdin.buffer, out)
                else:
                    with open(path, "rb") as stream:
                        shutil.copyfileobj(stream, out)
            readable[option] = copy
            names[copy] = "<stdin>" if str(path) == STDIN else str(path)
        yield readable, names


METRICS = ("bleu", "chrf", "chrf++", "ter")  # chrf++: sacreBLEU's -m chrf --chrf-word-order 2


@dataclass(frozen=True)
class BleuRequest:
    """What :func:`bleu_from_files` scores and how: its keywords, held together while the inputs are
    read, paired and scored."""
    hyp: str
    ref: Optional[str] = None
    hyp_format: str = "auto"
    ref_format: str = "auto"
    hyp_doc_ids: Optional[str] = None
    ref_doc_ids: Optional[str] = None
    segments: object = None
    separator: str = SEPARATOR
    pieces: str = "auto"
    ref_from_generate: bool = False
    levels: Sequence[str] = ("sentence", "document")
    match: str = "id"
    allow_mismatch: bool = False
    tokenize: str = "13a"
    lowercase: bool = False
    detokenize: str = "none"
    detokenize_lang: str = "en"
    more_refs: Sequence = ()
    metrics: Sequence[str] = METRICS
    ter_max_words: int = TER_MAX_WORDS

    @property
    def ref_names(self) -> List[str]:
        return [str(r) for r in ([self.hyp] if self.ref_from_generate else [self.ref, *self.more_refs])]


def bleu_from_files(hyp, ref=None, hyp_format: str = "auto", ref_format: str = "auto", hyp_doc_ids=None,
                    ref_doc_ids=None, segments=None, separator: str = SEPARATOR, pieces: str = "auto",
                    ref_from_generate: bool = False, levels=("sentence", "document"), match: str = "id",
                    allow_mismatch: bool = False, tokenize: str = "13a", lowercase: bool = False,
                    detokenize: str = "none", detokenize_lang: str = "en", more_refs: Sequence = (),
                    metrics: Sequence[str] = METRICS, ter_max_words: int = TER_MAX_WORDS) -> dict:
    """Load hypothesis and reference (``<d>`` files, plain files with doc-id files, or
    fairseq-generate output split with ``segments`` = a ``{split}.segments.tsv`` path or list),
    check the sentence counts per document and score. Any input may be ``-`` (standard input) or
    a pipe. ``more_refs``: further references in the reference's format (sacreBLEU's several
    references; the same documents and sentence counts as the first, ``--ref-doc-ids`` applies to
    each). ``metrics``: some of bleu, chrf, chrf++, ter. Returns a report dict with ``scores``
    ({level: BleuResult}), ``chrf``, ``chrf++`` and ``ter`` (likewise), ``mismatches``, ``notes``,
    a ``definition`` line and ``items`` ({level: (hypothesis items, [reference items, ...])}, what
    was scored, for paired tests; not part of the JSON report).
    ``detokenize="moses"``: both sides go through the Moses detokeniser first.
    """
    if detokenize not in DETOKENIZERS:
        raise ValueError(f"detokenize must be one of {', '.join(DETOKENIZERS)}, got {detokenize!r}")
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise ValueError(f"-m/--metrics: unknown {', '.join(unknown)}; expected some of {', '.join(METRICS)}")
    paths = {"--hyp": hyp, "--ref": ref, "--hyp-doc-ids": hyp_doc_ids, "--ref-doc-ids": ref_doc_ids}
    paths.update({f"reference {k + 2}": r for k, r in enumerate(more_refs)})
    with read_once(paths) as (files, names):
        try:
            request = BleuRequest(
                files["--hyp"], files["--ref"], hyp_format, ref_format, files["--hyp-doc-ids"], files["--ref-doc-ids"],
                segments, separator, pieces, ref_from_generate, levels, match, allow_mismatch, tokenize, lowercase,
                detokenize, detokenize_lang, [files[f"reference {k + 2}"] for k in range(len(more_refs))], metrics,
                ter_max_words)
            report = _bleu_from_paths(request)
            report["references"] = [names.get(r, r) for r in report["references"]]
            report["hypothesis"] = names.get(report["hypothesis"], report["hypothesis"])
            return report
        except (ValueError, FileNotFoundError) as e:  # name the stream, not its temporary copy
            message = str(e)
            for copy, name in names.items():
                message = message.replace(copy, name)
            raise type(e)(message) from None


def _bleu_from_paths(r: BleuRequest) -> dict:
    """:func:`bleu_from_files` once every input is a regular file."""
    if isinstance(r.segments, (str, bytes)) or hasattr(r.segments, "__fspath__"):
        r = replace(r, segments=read_segment_metadata(r.segments))
    notes = []
    hyp_side, hyp_seg, ref_sides = _read_sides(r, notes)
    hyp_docs, ref_docs_list, levels = _as_documents(r, hyp_side, ref_sides, notes)
    pairs, mismatches, more_pairs = _pair_with_references(r, hyp_docs, ref_docs_list)
    if mismatches:
        notes.append(f"{counted(len(mismatches), 'document')} {'differs' if len(mismatches) == 1 else 'differ'} "
                     "in sentence count: s-BLEU not computed, d-BLEU only")
    if "segment" in levels and r.segments is None:
        notes.append("segment-level d-BLEU needs --segments: skipped")
    if r.detokenize == "moses":
        pairs = detokenize_pairs(pairs, r.detokenize_lang)
        more_pairs = [detokenize_pairs(p, r.detokenize_lang) for p in more_pairs]
        if hyp_seg is not None:
            hyp_seg = [(seg, moses_detokenize([text], r.detokenize_lang)[0]) for seg, text in hyp_seg]
    return _score_pairs(r, pairs, more_pairs, levels, hyp_seg, mismatches, notes)


def _read_sides(r: BleuRequest, notes: List[str]):
    """(the hypothesis's side, its segments or None, each reference's side); a side is a list of
    sentences or documents by id."""
    for path in [r.ref, *r.more_refs] if not r.ref_from_generate else []:
        if path is not None:
            check_not_empty(r.hyp, path)
    hyp_format, ref_format = r.hyp_format, r.ref_format
    if not r.ref_from_generate and r.ref is not None and not r.hyp_doc_ids and not r.ref_doc_ids:
        hyp_format, ref_format = resolve_layouts(r.hyp, [r.ref, *r.more_refs], hyp_format, ref_format, notes)
    hyp_side, hyp_seg = _load_side(r.hyp, hyp_format, r.hyp_doc_ids, r.segments, r.separator, r.pieces,
                                   not r.allow_mismatch)
    if r.ref_from_generate:
        if r.more_refs:
            raise ValueError("--ref-from-generate takes no other reference")
        ref_sides = [_load_side(r.hyp, "generate", None, r.segments, r.separator, r.pieces, True, use_target=True)[0]]
    elif r.ref is None:
        raise ValueError("give a reference file (--ref) or --ref-from-generate")
    else:
        ref_sides = [_load_side(ref, ref_format, r.ref_doc_ids, r.segments if ref_format == "generate" else None,
                                r.separator, r.pieces, True)[0] for ref in [r.ref, *r.more_refs]]
    return hyp_side, hyp_seg, ref_sides


def _as_documents(r: BleuRequest, hyp_side, ref_sides, notes: List[str]):
    """Both sides as documents by id, and the levels that can be scored: sides without documents are
    each one document, scored by sentence only."""
    levels, ref_names = r.levels, r.ref_names
    flat = [isinstance(side, list) for side in [hyp_side] + ref_sides]
    if all(flat):
        _check_sentence_counts(r.hyp, hyp_side, ref_names, ref_sides)
        if "document" in levels:
            notes.append("no document boundaries on either side: d-BLEU skipped")
        return (OrderedDict([("all", hyp_side)]), [OrderedDict([("all", side)]) for side in ref_sides],
                [lv for lv in levels if lv == "sentence"])
    if any(flat) and [lv for lv in levels if lv != "sentence"]:
        # one side's documents are not evidence of the other's: cutting by them would score a guess
        names = [name for name, is_flat in zip([str(r.hyp)] + ref_names, flat) if is_flat]
        raise ValueError(f"{', '.join(names)} {'has' if len(names) == 1 else 'have'} no document boundaries but the "
                         f"other side has: give both sides '<d>' lines, a blank line between documents or doc ids "
                         f"(--hyp-doc-ids/--ref-doc-ids), or score sentences only (--levels s)")
    if any(flat):  # sentences only: documents do not matter, every side is read as one
        hyp, refs = _flatten(hyp_side), [_flatten(side) for side in ref_sides]
        _check_sentence_counts(r.hyp, hyp, ref_names, refs)
        return OrderedDict([("all", hyp)]), [OrderedDict([("all", ref)]) for ref in refs], levels
    return hyp_side, ref_sides, levels


def _check_sentence_counts(hyp, hyp_sentences: list, ref_names: List[str], refs: List[list]) -> None:
    for name, ref in zip(ref_names, refs):
        if len(hyp_sentences) != len(ref):
            raise ValueError(f"hypothesis {hyp} has {len(hyp_sentences)} sentences, reference {name} has {len(ref)}")


def _pair_with_references(r: BleuRequest, hyp_docs, ref_docs_list):
    """(the hypothesis's documents paired with the first reference's, the documents whose sentence
    counts differ, the pairs of the further references), which must be parallel to the first's."""
    all_pairs, ref_names = [], r.ref_names
    for name, ref_docs in zip(ref_names, ref_docs_list):
        try:
            all_pairs.append(pair_documents(hyp_docs, ref_docs, r.match, r.allow_mismatch))
        except ValueError as e:
            raise ValueError(f"{r.hyp} and {name}: {e}" if len(ref_names) > 1 else str(e)) from None
    pairs, mismatches = all_pairs[0]
    more_pairs = [p for p, _ in all_pairs[1:]]
    if any(m for _, m in all_pairs[1:]) or any([len(rs) for _, _, rs in p] != [len(rs) for _, _, rs in pairs]
                                               for p in more_pairs):
        raise ValueError(f"the references {', '.join(ref_names)} differ in documents or sentence counts; "
                         "several references must be parallel")
    if not any(hs or rs for _, hs, rs in pairs):
        raise ValueError(f"nothing to score: {r.hyp} and {r.ref or r.hyp} hold no sentences")
    return pairs, mismatches, more_pairs


def _score_pairs(r: BleuRequest, pairs, more_pairs, levels, hyp_seg, mismatches, notes: List[str]) -> dict:
    """Every metric asked for on the paired documents, with what was scored and its definition line
    (documents whose sentence counts differ: d-BLEU only)."""
    lowercase, metrics, mism = r.lowercase, r.metrics, bool(mismatches)
    scores = score_documents(pairs, levels, r.segments, hyp_seg, mism, r.tokenize, lowercase, more_pairs) \
        if "bleu" in metrics else {}
    chrf = chrf_scores(pairs, levels, mism, lowercase, more_pairs=more_pairs) if "chrf" in metrics else {}
    chrf_pp = chrf_scores(pairs, levels, mism, lowercase, word_order=2, more_pairs=more_pairs) if "chrf++" in metrics else {}
    ter = ter_scores(pairs, levels, mism, lowercase, more_pairs, r.ter_max_words) if "ter" in metrics else {}
    notes += [n for n in map(ter_note, ter.values()) if n]
    items = {}
    if "sentence" in levels and not mism:
        items["sentence"] = ([s for _, hs, _ in pairs for s in hs], [[s for _, _, rs in p for s in rs] for p in [pairs, *more_pairs]])
    if "document" in levels:
        items["document"] = ([_join(hs) for _, hs, _ in pairs], [[_join(rs) for _, _, rs in p] for p in [pairs, *more_pairs]])
    n_sent = sum(len(rs) for _, _, rs in pairs)
    prefix = ("hypotheses and references detokenised with sacremoses' Moses detokeniser "
              f"({r.detokenize_lang}), then " if r.detokenize == "moses" else "")
    defined = scores or {level: None for level in items}
    definition = prefix + definition_line(defined, n_sent, len(pairs), r.tokenize, lowercase)
    if r.more_refs:
        definition += f"; {1 + len(r.more_refs)} references"
    return {"definition": definition, "scores": scores, "n_documents": len(pairs), "n_sentences": n_sent,
            "mismatches": [{"doc_id": d, "hyp_sentences": h, "ref_sentences": n} for d, h, n in mismatches],
            "notes": notes, "chrf": chrf, "chrf++": chrf_pp, "ter": ter,
            "detokenize": r.detokenize, "items": items, "references": r.ref_names, "hypothesis": str(r.hyp)}


def _flatten(side) -> List[str]:
    return side if isinstance(side, list) else [s for sents in side.values() for s in sents]
