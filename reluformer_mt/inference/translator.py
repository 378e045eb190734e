"""Translate whole documents with a trained checkpoint, one output sentence per input sentence.

Context as in training (doc-to-doc, G-Transformer, Bao et al. ACL 2021): each document is cut
into segments of whole sentences with the segment length N the model was trained with
(:func:`reluformer_mt.data.segmentation.greedy_segments`, here on source lengths), the sentences
of a segment joined by the separator token; segments are translated in batches by fairseq's
``SequenceGenerator`` (beam search) and the hypotheses split back at the separator.

By default (``separators="constrained"``) the beam search itself keeps the separators: a
hypothesis gets exactly the segment's number of separators and no empty sentence
(:mod:`reluformer_mt.guidance.separators`); ``separators="free"`` is plain beam search, which shows
how often the model keeps them by itself. A hypothesis that still does not split into the segment's
number of non-empty sentences (free decoding, or a constrained one cut at the length limit) is
translated again as two halves, and a half that fails again sentence by sentence; a single
sentence always gives one output (stray separators dropped). So the output has exactly one
sentence per input sentence, always; the fallbacks are counted in :attr:`DocumentTranslator.stats`.

A sentence longer than the model's source positions is never truncated: it is cut at
punctuation, else whitespace, near its middle (recursively) into parts that fit, the parts are
translated as consecutive sentences of the document and their translations joined into the
sentence's one output (counted in the summary).

Resources are found beside the checkpoint, in ``data`` (``--data``) or in the data directory the
checkpoint was trained on: the fairseq dictionaries, ``prepared.json`` (languages, segment length,
separator) and the SentencePiece model(s) it names.
"""
import argparse
import dataclasses
import logging
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import torch

from reluformer_mt.checkpoints import (OpenedCheckpoint, check_ensemble_vocabulary, open_checkpoint,  # noqa: F401
                                      pick_device)  # (pick_device re-exported)
from reluformer_mt.data.prepared import PREPARED_NAME, parse_spm_models
from reluformer_mt.data.batching import length_batches
from reluformer_mt.data.segmentation import greedy_segments
from reluformer_mt.data.spm import repair_separator_lookalikes
from reluformer_mt.guidance.base import (Guidance, GuidanceContext, SourceBatch, TranslationError,
                                                   build_guidance, install_guidance)
from reluformer_mt.guidance.separator_options import SEPARATOR_MODES  # noqa: F401  (re-exported)
from reluformer_mt.inference.options import TranslatorOptions
from reluformer_mt.memory.tm_attention import MemoryReader

logger = logging.getLogger(__name__)



@dataclass
class SentenceResult:
    text: str
    score: Optional[float] = None        # mean log-probability (natural log) of the sentence's target tokens
    alignment: Optional[List[Tuple[int, int]]] = None  # 0-based (source word, target word) pairs
    context: int = 0                      # sentences in the segment it was translated in (0 = empty, not translated)
    match: Optional[Tuple[int, float]] = None  # translation memory: best entry id and its fuzzy-match score
    # nbest > 1: the 2nd..Nth best hypotheses of the sentence's segment, split back, each with its score
    alternatives: List["SentenceResult"] = field(default_factory=list)
    tm_copy: bool = False  # TM-first: the text is the memory match's target (no model score), not the model's

    def __str__(self) -> str:  # print(result) shows the translation, as a user expects
        return self.text


@dataclass
class Resources:
    data_dir: Path
    src_lang: str
    tgt_lang: str
    segment_tokens: int
    separator: str
    spm_src: Path
    spm_tgt: Path
    looked_in: List[str] = field(default_factory=list)


# where a sentence too long for the model is cut, best first: after sentence or clause punctuation,
# after a comma, at whitespace (never inside a word unless the text has no whitespace at all)
_CLOSERS = "\"'»«”“’)\\]"
_BREAKS = (re.compile(rf"[.!?;:][{_CLOSERS}]*\s+|[。！？；：][{_CLOSERS}]*\s*"),
           re.compile(rf",[{_CLOSERS}]*\s+|[，、]\s*"),
           re.compile(r"\s+"))


def split_near_middle(text: str) -> Tuple[str, str]:
    """Two non-empty halves of ``text`` (at least 2 characters), cut at the best break near the
    middle: punctuation, else a comma, else whitespace within the middle half of the text; else
    the whitespace nearest the middle; else (no whitespace at all) the middle character."""
    n, mid = len(text), len(text) / 2

    def nearest(cuts):
        cuts = [c for c in cuts if 0 < c < n and text[:c].strip() and text[c:].strip()]
        return min(cuts, key=lambda c: abs(c - mid)) if cuts else None

    for pattern in _BREAKS:
        cut = nearest([m.end() for m in pattern.finditer(text) if n / 4 <= m.end() <= 3 * n / 4])
        if cut is not None:
            return text[:cut].strip(), text[cut:].strip()
    cut = nearest([m.start() for m in _BREAKS[-1].finditer(text)])
    if cut is None:
        cut = max(1, int(mid))
    return text[:cut].strip(), text[cut:].strip()


@dataclass
class _Segment:
    doc: int
    sentences: List[int]   # indices into the document's sentences
    level: str             # "segment", "half" or "sentence"


# ---------------------------------------------------------------- resources

def find_resources(opened: OpenedCheckpoint, spm_model=None, segment_tokens=None) -> Resources:
    """Segment length and SentencePiece model(s) of an opened checkpoint, from its prepared.json
    unless ``spm_model`` (``MODEL`` or ``SRC,TGT``) and ``segment_tokens`` override them; the
    dictionaries' directory is the one :func:`reluformer_mt.checkpoints.find_data_dir` found."""
    data, prepared, missing = opened.data, opened.data.prepared, []
    if segment_tokens is None:
        if prepared is not None:
            segment_tokens = prepared.segment_tokens or 0
        elif opened.cfg.task.get("_name") == "translation":
            segment_tokens = 0  # a sentence-level task has no segments: one sentence per segment
        else:
            missing.append(f"the segment length ({PREPARED_NAME} 'segment_tokens', or --segment-tokens)")
    paths = [Path(p) for p in parse_spm_models(spm_model)]
    if not paths and prepared is not None:
        paths = list(dict.fromkeys(prepared.spm_paths()))
    elif not paths:
        missing.append(f"the SentencePiece model ({PREPARED_NAME} 'spm_model', or --spm-model)")
    missing += [f"the SentencePiece model {p}" for p in paths if not p.is_file()]
    if missing:
        raise TranslationError(f"{opened.path}: resources found in {data.path} but missing {'; '.join(missing)}")
    src_spm, tgt_spm = paths[0], paths[-1]
    return Resources(data.path, data.src_lang, data.tgt_lang, int(segment_tokens), opened.separator, src_spm, tgt_spm,
                     data.looked_in)


# ---------------------------------------------------------------- the translator

def _register_what_it_loads() -> None:
    """The plugin registered with fairseq (its fixes for loading, the task, models and criteria; once),
    so that a Python user's ``DocumentTranslator(...)`` needs no ``reluformer_mt.register()``."""
    from reluformer_mt.plugin import register

    register()


def _in_band_order(key: str):
    """Summary keys alphabetically, but those ending in a fuzzy band (<50, 50-70, ...) in band order."""
    from reluformer_mt.memory.tm import FUZZY_BANDS

    bands = [name for _, _, name in FUZZY_BANDS]
    head, _, last = key.rpartition(" ")
    return (head, bands.index(last)) if last in bands else (key, -1)


class DocumentTranslator:
    """A loaded checkpoint with its resources; :meth:`translate` maps documents (lists of
    sentences) to lists of :class:`SentenceResult`, one per sentence.

    The options come in groups, each declared once (:mod:`reluformer_mt.inference.options`):
    ``resources``, ``search``, ``precision`` (with the device), ``memory``, ``tm_first`` and each
    registered kind of guidance (``knn``, ``pieces``, ``separators``...), given as a group object
    (``search=SearchOptions(beam=5)``), a group's plain value (``knn="DIR"``, ``memory="tm.tmx"``,
    ``separators="free"``) or field by field under the command line's names (``beam=5``,
    ``pieces_weight=0.5``); ``guidance``: options objects of registered kinds."""

    def __init__(self, checkpoint, data=None, guidance: Sequence = (), quiet: bool = True, **options):
        o = self.options = TranslatorOptions.of(guidance, **options)
        self.nbest, self.separators, self.pieces = o.search.nbest, o.separators.mode, o.pieces
        self.batch_size, self.max_tokens = o.search.batch_size, o.search.max_tokens
        self._open(checkpoint, data, o.precision.device, quiet)
        self._open_memory()
        self.guidance = build_guidance(self._guidance_options(), self._guidance_context())
        self.generator, self.search = self._compose()
        self.stats: Counter = Counter()
        self._matches = {}     # (document, unit) -> (ids, scores) during translate()
        self._unit_words = {}  # (document, unit) -> source words, during translate()

    # ------------------------------------------------------------ open, build, compose

    def _open(self, checkpoint, data, device: str, quiet: bool) -> None:
        """The checkpoint(s) with their resources, the models on the device in their precision,
        the segment length and the separator's ids."""
        d = self.options.precision
        checkpoints = [checkpoint] if isinstance(checkpoint, (str, bytes)) or hasattr(checkpoint, "__fspath__") \
            else list(checkpoint)
        if not checkpoints:
            raise TranslationError("--checkpoint: give at least one checkpoint")
        self.checkpoint, self.checkpoints = Path(checkpoints[0]), [Path(c) for c in checkpoints]
        self.device, self.precision = pick_device(device), d.precision
        if self.precision != "fp32" and not self.device.startswith("cuda"):
            raise TranslationError(f"--{self.precision}: half precision is for CUDA only (device {self.device}); "
                                   "on the CPU translate in full precision")
        _register_what_it_loads()
        opened = open_checkpoint(self.checkpoint, data)
        # an ensemble: every checkpoint opened (and checked) before any model is built
        # (each with its own resources unless --data: a member over other dictionaries is refused by name, not built wrong)
        others = [open_checkpoint(c, data) for c in self.checkpoints[1:]]
        check_ensemble_vocabulary([opened] + others, data_given=data is not None)  # before any model is built
        res = self.options.resources
        self.resources = res = find_resources(opened, res.spm_model, res.segment_tokens)
        loaded = opened.load(self.device, spm_models=list(dict.fromkeys([res.spm_src, res.spm_tgt])),
                             check_separator=True, quiet=quiet, decoding={"memory_cache": d.memory_cache})
        self.model, self.cfg, self.task = loaded.model, loaded.cfg, loaded.task
        self.src_dict, self.tgt_dict = loaded.src_dict, loaded.tgt_dict
        self.sp_src, self.sp_tgt = loaded.spm_src, loaded.spm_tgt
        self.models = [self.model] + self._ensemble_members(others, opened, quiet)
        if self.precision != "fp32":
            self.models = [m.half() if d.fp16 else m.to(torch.bfloat16) for m in self.models]
            self.model = self.models[0]
        self.max_src = min(int(m.max_positions()[0]) for m in self.models)
        self._open_segments(res)
        # the model reads its matches (trained with --tm-fusion); any model can be guided by pieces
        self.reads_memory = getattr(self.task.cfg, "tm_fusion", "none") != "none"

    def _open_segments(self, res: Resources) -> None:
        self.segment_tokens = res.segment_tokens
        if self.segment_tokens and self.segment_tokens > self.max_src - 1:
            logger.warning("segment length %d does not fit the model's %d source positions; using %d",
                           self.segment_tokens, self.max_src, self.max_src - 1)
            self.segment_tokens = self.max_src - 1
        self.sep_src = self.src_dict.index(res.separator)
        self.sep_tgt = self.tgt_dict.index(res.separator)
        if self.segment_tokens and (self.sep_src == self.src_dict.unk() or self.sep_tgt == self.tgt_dict.unk()):
            raise TranslationError(f"{res.data_dir}: the dictionaries have no {res.separator!r} entry, so segments "
                                   "cannot be split into sentences; use --segment-tokens 0 (sentence by sentence)")

    def _open_memory(self) -> None:
        """The translation memory, when the model reads its matches or a guidance part does
        (``--memory none`` withholds it)."""
        m, res = self.options.memory, self.resources
        self.memory = None
        if (self.reads_memory or self.options.needs_memory()) and not m.withheld:
            from reluformer_mt.inference.memory import MemoryLookup

            self.memory = MemoryLookup(self.task, m.memory, res.data_dir, res.src_lang, res.tgt_lang, self.sp_tgt,
                                       model=self.model, sp_src=self.sp_src, placeholders=m.tmx_placeholders,
                                       match_score=m.match_score)
        elif m.memory is not None and not m.withheld:
            raise TranslationError(f"--memory: {self.checkpoint} was trained without a translation memory "
                                   "(--tm-fusion none), so it cannot read one; --pieces-weight W > 0 guides it by the "
                                   "memory's translation pieces instead")

    def _guidance_options(self) -> list:
        return self.options.guidance_options()

    def _guidance_context(self) -> GuidanceContext:
        return GuidanceContext(self.models, self.task, self.device, checkpoint=str(self.checkpoint), lookup=self.memory,
                               reads_memory=self.reads_memory, separator=self.resources.separator,
                               segmented=bool(self.segment_tokens), decode_tokens=self.max_tokens, sp_src=self.sp_src,
                               looks_up_matches=True)

    def _compose(self):
        """fairseq's generator (several models: its EnsembleModel averages their log-probabilities)
        with the guidance parts in its beam search."""
        search = dataclasses.asdict(self.options.search)  # fairseq's generation arguments of the same names
        gen_args = argparse.Namespace(**{name: search[name] for name in ("beam", "lenpen", "max_len_a", "max_len_b")},
                                      min_len=1, unkpen=0.0, temperature=1.0, no_repeat_ngram_size=0)
        generator = self.task.build_generator(self.models, gen_args)
        return generator, install_guidance(generator, self.guidance, always=True)

    def part(self, kind: type) -> Optional[Guidance]:
        """The guidance part of a kind (e.g. ``KnnMixture``), None if the decoding has none."""
        return next((p for p in self.guidance if isinstance(p, kind)), None)

    def _ensemble_members(self, others: List[OpenedCheckpoint], first: OpenedCheckpoint, quiet: bool) -> list:
        """The models of the other checkpoints of an ensemble: the same dictionaries (the
        ensemble averages distributions over one vocabulary), none reading a translation memory."""
        if not others:
            return []
        res, models = self.resources, []
        for opened in [first] + others:
            if opened.cfg.task.get("tm_fusion", "none") != "none":
                raise TranslationError(f"--checkpoint {opened.path}: reads a translation memory (--tm-fusion "
                                       f"{opened.cfg.task.tm_fusion}); ensembles take models without one")
        for opened in others:  # one vocabulary: checked when they were opened
            loaded = opened.load(self.device, spm_models=list(dict.fromkeys([res.spm_src, res.spm_tgt])),
                                 check_separator=True, quiet=quiet)
            models.append(loaded.model)
        return models

    def describe(self) -> str:
        r = self.resources
        arch = getattr(self.cfg.model, "arch", None) or getattr(self.cfg.model, "_name", "?")
        level = f"segments of <= {self.segment_tokens} tokens" if self.segment_tokens else "sentence by sentence"
        if self.segment_tokens:
            level += f", {self.separators} separators"
        if self.memory is not None and self.reads_memory:
            level += f"; {self.task.cfg.tm_fusion} fusion with {self.memory.describe()}"
        level += "".join(f"; {part.describe()}" for part in self.guidance if part.describe())
        which = f"checkpoint {self.checkpoint}" if len(self.checkpoints) == 1 else \
            f"ensemble of {len(self.checkpoints)} checkpoints ({', '.join(map(str, self.checkpoints))})"
        precision = "" if self.precision == "fp32" else f" ({self.precision})"
        nbest = f", {self.nbest}-best" if self.nbest > 1 else ""
        return (f"{which} ({arch}, {r.src_lang}->{r.tgt_lang}), resources from {r.data_dir}, "
                f"{level}{nbest}, device {self.device}{precision}")

    # ------------------------------------------------------------ encoding

    def _encode(self, documents: Sequence[Sequence[str]]) -> List[List[Optional[List[List[str]]]]]:
        """Pieces of every sentence (None for an empty sentence) as a list of parts: one part,
        or, for a sentence longer than the model's positions, several that fit (counted).
        Separator tokens are removed from the input (counted)."""
        sep = self.resources.separator
        flat = []
        for doc in documents:
            for s in doc:
                if sep in s:
                    self.stats["separator tokens removed from the input"] += s.count(sep)
                    s = s.replace(sep, " ")
                flat.append(" ".join(s.split()))
        at = [k for k, s in enumerate(flat) if s]  # SentencePiece encodes the non-empty sentences
        texts = [flat[k] for k in at]
        pieces = self.sp_src.encode(texts, out_type=str) if texts else []
        repaired = repair_separator_lookalikes(self.sp_src, texts, pieces, sep)
        if repaired:
            self.stats["separator look-alikes in the input replaced by spaces"] += sum(n for _, n in repaired)
        encoded = dict(zip(at, zip(texts, pieces)))  # the repaired text too: a long one is encoded again in parts
        out, k = [], 0
        for doc in documents:
            enc = []
            for _ in doc:
                text, p = encoded.get(k, ("", None))
                # a sentence SentencePiece normalises away counts as empty
                enc.append(self._fit(text, p) if p else None)
                k += 1
            out.append(enc)
        return out

    def _fit(self, text: str, pieces: List[str]) -> List[List[str]]:
        """``pieces`` as the only part if the model takes them whole (fairseq appends </s>),
        else the parts of ``text`` cut near the middle, recursively, until each fits."""
        limit = self.max_src - 1
        if len(pieces) <= limit:
            return [pieces]
        self.stats["sentences split into parts to fit the model's positions"] += 1
        parts = self._fit_parts(text, limit)
        self.stats["parts of split sentences"] += len(parts)
        return parts

    def _fit_parts(self, text: str, limit: int) -> List[List[str]]:
        pieces = self.sp_src.encode(text, out_type=str)
        if len(pieces) <= limit or len(text) < 2:
            return [pieces[:limit]] if pieces else []  # one character cannot exceed the positions
        left, right = split_near_middle(text)
        return self._fit_parts(left, limit) + self._fit_parts(right, limit)

    @staticmethod
    def _expand(encoded) -> Tuple[List[List[Optional[List[str]]]], List[List[int]]]:
        """Documents of translation units (a sentence, or a part of a split one) and, for each
        unit, the index of the input sentence it belongs to."""
        units, owners = [], []
        for doc in encoded:
            units.append([])
            owners.append([])
            for i, parts in enumerate(doc):
                for p in parts or [None]:
                    units[-1].append(p)
                    owners[-1].append(i)
        return units, owners

    @staticmethod
    def _join_parts(parts: List[SentenceResult], units: List[Optional[List[str]]]) -> SentenceResult:
        """One sentence's result from its parts' results: texts joined by a space, mean score,
        alignments with each part's word indices shifted past the earlier parts' words."""
        from reluformer_mt.evaluation.stats import sentencepiece_word_map

        if len(parts) == 1:
            return parts[0]
        # the k-th alternative of a split sentence joins its parts' k-th alternatives
        alternatives = [DocumentTranslator._join_parts([r.alternatives[k] for r in parts], units)
                        for k in range(min(len(r.alternatives) for r in parts))]
        text = " ".join(r.text for r in parts if r.text)
        scores = [r.score for r in parts if r.score is not None]
        alignment = None
        if any(r.alignment is not None for r in parts):
            alignment, src_offset, tgt_offset = [], 0, 0
            for r, pieces in zip(parts, units):
                alignment += [(i + src_offset, j + tgt_offset) for i, j in (r.alignment or [])]
                src_offset += max(sentencepiece_word_map(pieces or []), default=-1) + 1
                tgt_offset += len(r.text.split())
        return SentenceResult(text, sum(scores) / len(scores) if scores else None, alignment, parts[0].context,
                              parts[0].match, alternatives)

    def _segments(self, encoded) -> List[_Segment]:
        segments = []
        for d, doc in enumerate(encoded):
            real = [i for i, p in enumerate(doc) if p is not None]
            lengths = [len(doc[i]) for i in real]
            if self.segment_tokens:
                self.stats["sentences longer than the segment length"] += sum(1 for n in lengths if n > self.segment_tokens)
            for start, end in greedy_segments(lengths, lengths, self.segment_tokens):
                segments.append(_Segment(d, real[start:end], "segment"))
        return segments

    def _source_ids(self, encoded, seg: _Segment) -> Tuple[torch.Tensor, List[str]]:
        pieces: List[str] = []
        for k, i in enumerate(seg.sentences):
            if k:
                pieces.append(self.resources.separator)
            pieces.extend(encoded[seg.doc][i])
        ids = [self.src_dict.index(p) for p in pieces] + [self.src_dict.eos()]
        return torch.tensor(ids, dtype=torch.long), pieces

    # ------------------------------------------------------------ generation

    def _batches(self, lengths: Sequence[int]) -> List[List[int]]:
        return length_batches(lengths, self.max_tokens, self.batch_size)

    @torch.no_grad()
    def generate(self, sources: Sequence[torch.Tensor], progress=None, matches=None, units=None,
                 on_batch=None) -> List[dict]:
        """Best hypothesis of every source (token ids ending in </s>): dict with ``tokens``
        (target ids without the final </s>), ``positional_scores`` (one per token and the
        final </s>), ``attention`` ((target tokens + 1) x source tokens, or None),
        ``at_length_limit`` (the hypothesis has the most tokens the generator allows) and ``nbest``
        (the other hypotheses). ``matches``: the translation memory's tokens of each source (models
        trained with a memory); ``units``: each source's (document, unit) keys, whose matches the
        guidance parts read (translation pieces, per-input datastores); ``progress``: counts the
        sources as their batches finish; ``on_batch(indices, results)``: called after each batch."""
        from fairseq import utils

        given = SourceBatch(sources, units, self._matches, self._unit_words, memory_tokens=matches)
        dataset = self.task.build_dataset_for_inference(list(sources), [len(s) for s in sources])
        for part in self.guidance:  # what the model reads beside the sources (memory reading)
            dataset = part.inputs(dataset, given)
        limits = [self._length_limit(len(s)) for s in sources]
        if self.search is not None:  # the parts' tables of these sources, indexed by sample["id"]
            self.search.start(given, self.device, limits)
        results: List[Optional[dict]] = [None] * len(sources)
        for batch in self._batches([len(s) for s in sources]):
            sample = dataset.collater([dataset[i] for i in batch])
            if self.device != "cpu":
                sample = utils.move_to_cuda(sample, device=torch.device(self.device))
            hypos = self.task.inference_step(self.generator, self.models, sample)
            src_tokens = sample["net_input"]["src_tokens"]
            for b, idx in enumerate(sample["id"].tolist()):
                found = [self._hypothesis(hypo, src_tokens[b], limits[idx]) for hypo in hypos[b][:self.nbest]]  # best first
                results[idx] = dict(found[0], nbest=found[1:])
            if progress is not None:
                progress.update(len(batch))
            if on_batch is not None:
                on_batch(batch, results)
        return results

    def _length_limit(self, source_length: int) -> int:
        """The most tokens a source's output may have: the generator's rule on the source's own
        length (fairseq's applies it to the batch's padded length; the search applies this one)."""
        g = self.generator
        return min(int(g.max_len_a * source_length + g.max_len_b), g.max_len - 1)

    def _hypothesis(self, hypo: dict, src_tokens: torch.Tensor, limit: int) -> dict:
        tokens = hypo["tokens"].cpu()
        scores = hypo["positional_scores"].float().cpu()
        if len(tokens) and tokens[-1] == self.tgt_dict.eos():
            tokens = tokens[:-1]
        attn = hypo.get("attention")
        if attn is not None and not attn.numel():
            attn = None  # fairseq's empty tensor: not asked for (``search_alignment``)
        if attn is not None:
            real = (src_tokens != self.src_dict.pad()).cpu()
            attn = attn.float().cpu()[real].T  # (target + </s>, source + </s>)
        return {"tokens": tokens, "positional_scores": scores, "attention": attn, "at_length_limit": len(tokens) >= limit}

    # ------------------------------------------------------------ splitting back

    def _split_hypothesis(self, tokens: torch.Tensor) -> List[List[int]]:
        """Token positions of each sentence of a hypothesis (the separator belongs to none)."""
        parts: List[List[int]] = [[]]
        for pos, t in enumerate(tokens.tolist()):
            if t == self.sep_tgt:
                parts.append([])
            else:
                parts[-1].append(pos)
        return parts

    def _sentence_result(self, hyp: dict, positions: List[int], end: int, src_pieces: List[str], src_span: Tuple[int, int],
                         n_context: int, scores: bool, alignments: bool) -> SentenceResult:
        """One sentence from the hypothesis tokens at ``positions``; ``end`` is the position of
        the token closing it (a separator or the final </s>), scored with it."""
        tokens = hyp["tokens"].tolist()
        pieces = [self.tgt_dict[tokens[p]] for p in positions]
        text = self.sp_tgt.decode_pieces(pieces).strip() if pieces else ""
        result = SentenceResult(text, context=n_context)
        if scores:
            pos = positions + [end]
            result.score = float(hyp["positional_scores"][pos].mean())
        if alignments:
            result.alignment = self._alignment(hyp, positions, src_pieces, src_span)
        return result

    def _alignment(self, hyp, positions, src_pieces, src_span) -> List[Tuple[int, int]]:
        from reluformer_mt.evaluation.stats import alignment_from_attention, sentencepiece_word_map

        attn = hyp["attention"]
        if attn is None or not positions:
            return []
        s0, s1 = src_span
        sub = attn[positions][:, s0:s1]
        tgt_pieces = [self.tgt_dict[t] for t in hyp["tokens"][positions].tolist()]
        return alignment_from_attention(sub, sentencepiece_word_map(src_pieces[s0:s1]), sentencepiece_word_map(tgt_pieces))

    @staticmethod
    def _source_spans(src_pieces: List[str], separator: str, n: int) -> List[Tuple[int, int]]:
        spans, start = [], 0
        for k, p in enumerate(src_pieces):
            if p == separator:
                spans.append((start, k))
                start = k + 1
        spans.append((start, len(src_pieces)))
        assert len(spans) == n, (len(spans), n)
        return spans

    def _resolve(self, seg: _Segment, hyp: dict, src_pieces: List[str], scores: bool, alignments: bool):
        """SentenceResults of the segment, or None when the hypothesis does not split right;
        with nbest > 1, each result's ``alternatives`` from the segment's other hypotheses."""
        results = self._split_results(seg, hyp, src_pieces, scores, alignments)
        for alternative in (hyp.get("nbest") or []) if results is not None else []:
            split = self._split_results(seg, alternative, src_pieces, True, False, count=False)
            if split is None:  # counted, not hidden: the sentence then has fewer than N lines
                self.stats["n-best: segment hypotheses that did not split into its sentences (left out)"] += 1
                continue
            for r, a in zip(results, split):
                r.alternatives.append(a)
        return results

    def _splits_back(self, seg: _Segment, tokens: torch.Tensor) -> bool:
        """Whether a hypothesis gives the segment's sentences (one sentence always does)."""
        parts = self._split_hypothesis(tokens)
        return len(seg.sentences) == 1 or (len(parts) == len(seg.sentences) and all(parts))

    def _split_results(self, seg: _Segment, hyp: dict, src_pieces: List[str], scores: bool, alignments: bool,
                       count: bool = True):
        n = len(seg.sentences)
        spans = self._source_spans(src_pieces, self.resources.separator, n)
        end_of_hyp = len(hyp["tokens"])  # the final </s>
        if n == 1:
            # a single sentence always gives one output; stray separators are dropped
            parts = self._split_hypothesis(hyp["tokens"])
            if len(parts) > 1 and count:
                self.stats["stray separators dropped from single-sentence outputs"] += len(parts) - 1
            positions = [p for part in parts for p in part]
            return [self._sentence_result(hyp, positions, end_of_hyp, src_pieces, spans[0], 1, scores, alignments)]
        if not self._splits_back(seg, hyp["tokens"]):
            return None
        parts = self._split_hypothesis(hyp["tokens"])
        results = []
        for k, part in enumerate(parts):
            end = part[-1] + 1  # the separator after the sentence, or the final </s>
            results.append(self._sentence_result(hyp, part, end, src_pieces, spans[k], n, scores, alignments))
        return results

    # ------------------------------------------------------------ public

    def translate_text(self, documents: Sequence[Sequence[str]]) -> List[List[str]]:
        """:meth:`translate` as plain strings: per document, one translation per input sentence."""
        return [[r.text for r in doc] for doc in self.translate(documents)]

    def translate(self, documents: Sequence[Sequence[str]], scores: bool = False, alignments: bool = False,
                  progress: Optional[bool] = None) -> List[List[SentenceResult]]:
        """Translate documents (lists of sentence strings); returns, per document, exactly one
        :class:`SentenceResult` per input sentence (empty sentences give empty results)."""
        from reluformer_mt.console import Progress

        if isinstance(documents, str) or any(isinstance(doc, str) for doc in documents):
            # a list of strings would be read as documents of single characters
            raise TranslationError("translate() takes documents as lists of sentences, e.g. [['Hello.', 'Thanks.']]")
        scores = scores or self.nbest > 1  # an n-best list always carries scores

        t0 = time.time()
        before = Counter(self.stats)
        for model in self.models:  # beam search carries the attention only for alignments
            if hasattr(getattr(model, "decoder", None), "search_alignment"):
                model.decoder.search_alignment = alignments
        encoded, owners = self._expand(self._encode(documents))
        out: List[List[Optional[SentenceResult]]] = [[None] * len(doc) for doc in encoded]
        for d, doc in enumerate(encoded):
            for i, p in enumerate(doc):
                if p is None:
                    out[d][i] = SentenceResult("")
                    self.stats["empty sentences"] += 1
        pending = self._segments(encoded)
        self.stats["documents"] += len(documents)
        self.stats["empty documents"] += sum(1 for doc in documents if not doc)
        self.stats["sentences"] += sum(len(doc) for doc in documents)
        self.stats["segments"] += len(pending)
        self._warn_about_input(self.stats - before)
        # progress None: for long inputs (>= 50 segments) a bar on stderr when it is a terminal, else a
        # line every 30 s. It counts sentences whose translation is final, a total that retranslations
        # do not change (counting segments, each retranslation grew the total and reset the time left)
        bar = Progress(sum(len(seg.sentences) for seg in pending), "translate", "sentences",
                       enabled=progress if progress is not None else len(pending) >= 50)
        self._look_up_matches(documents, encoded, owners)
        retranslated = 0
        while pending:
            pending = self._translate_segments(pending, encoded, out, bar, scores, alignments)
            retranslated += len(pending)
            if pending:
                bar.set_postfix(f"{retranslated:,} segments retranslated as halves or sentence by sentence "
                                "(outputs that did not split into their sentences)")
        bar.close()
        assert all(r is not None for doc in out for r in doc)
        merged = [self._merge(doc_out, doc_units, doc_owners, len(doc))
                  for doc_out, doc_units, doc_owners, doc in zip(out, encoded, owners, documents)]
        for part in self.guidance:  # the parts that act on the finished translations (TM-first)
            merged = part.finish(merged, self.nbest)
        for part in self.guidance:  # the parts' counts join the summary
            self.stats.update(part.stats)
            part.stats.clear()
        self.stats["seconds"] += time.time() - t0
        return merged

    def _warn_about_input(self, new: Counter) -> None:
        if new["sentences longer than the segment length"]:
            logger.warning("%d sentences are longer than the segment length %d and are translated on their own",
                           new["sentences longer than the segment length"], self.segment_tokens)
        if new["sentences split into parts to fit the model's positions"]:
            logger.warning("%d sentences are longer than the model's %d source positions: each is translated in parts "
                           "that fit (%d parts in all), cut at punctuation or spaces, and the parts' translations joined",
                           new["sentences split into parts to fit the model's positions"], self.max_src,
                           new["parts of split sentences"])
        if new["separator look-alikes in the input replaced by spaces"]:
            logger.warning("%d look-alikes of %r in the input (e.g. full-width, which SentencePiece normalises into "
                           "the separator) were replaced by spaces (the separator is reserved)",
                           new["separator look-alikes in the input replaced by spaces"], self.resources.separator)
        if new["separator tokens removed from the input"]:
            logger.warning("%d %r tokens in the input were replaced by spaces (the separator is reserved)",
                           new["separator tokens removed from the input"], self.resources.separator)

    def _translate_segments(self, pending: List[_Segment], encoded, out, bar, scores: bool, alignments: bool):
        """Translate ``pending`` into ``out``; returns the segments to retranslate (as halves, then
        sentence by sentence) whose hypotheses did not split into their sentences."""
        sources = [self._source_ids(encoded, seg) for seg in pending]
        units = [[(seg.doc, i) for i in seg.sentences] for seg in pending]
        def count_final(batch, hyps):  # the sentences of the segments whose output splits back
            bar.update(sum(len(pending[i].sentences) for i in batch if self._splits_back(pending[i], hyps[i]["tokens"])))

        hyps = self.generate([s for s, _ in sources], None, units=units, on_batch=count_final)
        retry = []
        for seg, (_, src_pieces), hyp in zip(pending, sources, hyps):
            results = self._resolve(seg, hyp, src_pieces, scores, alignments)
            if results is not None:
                for i, r in zip(seg.sentences, results):
                    if self.memory is not None:
                        match_ids, match_scores = self._matches[(seg.doc, i)]
                        r.match = (int(match_ids[0]), float(match_scores[0]))
                    out[seg.doc][i] = r
                continue
            if hyp.get("at_length_limit"):
                self.stats["fallbacks whose output reached the length limit"] += 1
            if seg.level == "segment":
                self.stats["fallbacks: segment retranslated as halves"] += 1
                half = len(seg.sentences) // 2
                retry += [_Segment(seg.doc, seg.sentences[:half], "half"), _Segment(seg.doc, seg.sentences[half:], "half")]
            else:
                self.stats["fallbacks: segment retranslated sentence by sentence"] += 1
                retry += [_Segment(seg.doc, [i], "sentence") for i in seg.sentences]
        return retry

    def _look_up_matches(self, documents, encoded, owners) -> None:
        """Memory matches of every translation unit (a part of a split sentence gets its sentence's)."""
        from reluformer_mt.memory.tm import band_of

        self._matches = {}
        if self.memory is None:
            return
        keys = [(d, u) for d, doc in enumerate(encoded) for u, p in enumerate(doc) if p is not None]
        # source words of each unit (SentencePiece marks a word's first piece), for the pieces' length
        # and, with --pieces-aligned, their edit alignment with each match's source
        self._unit_words = {(d, u): "".join(encoded[d][u]).replace("\u2581", " ").split() for d, u in keys}
        k = max([self.memory.k] + [part.memory_k for part in self.guidance])
        ids, scores = self.memory.lookup([documents[d][owners[d][u]] for d, u in keys], k)
        for n, key in enumerate(keys):
            self._matches[key] = (ids[n], scores[n])
            self.stats[f"memory: units whose best match has fuzzy {band_of(float(scores[n, 0]))}"] += 1

    def _merge(self, results, units, owners, n_sentences) -> List[SentenceResult]:
        """One result per input sentence from the results of its units (parts)."""
        grouped: List[List[int]] = [[] for _ in range(n_sentences)]
        for k, owner in enumerate(owners):
            grouped[owner].append(k)
        return [self._join_parts([results[k] for k in ks], [units[k] for k in ks]) for ks in grouped]

    def summary(self) -> str:
        s = self.stats
        fallbacks = s["fallbacks: segment retranslated as halves"] + s["fallbacks: segment retranslated sentence by sentence"]
        rate = s["sentences"] / s["seconds"] if s["seconds"] else 0.0
        from reluformer_mt.data.wording import counted

        lines = [f"translated {counted(s['documents'], 'document')}, {counted(s['sentences'], 'sentence')} in "
                 f"{counted(s['segments'], 'segment')} in {s['seconds']:.1f} s ({rate:.1f} sentences/s); "
                 f"fallbacks: {fallbacks:,}"]
        for key in sorted(s, key=_in_band_order):
            if key not in ("documents", "sentences", "segments", "seconds") and s[key]:
                lines.append(f"  {key}: {s[key]:,}")
        return "\n".join(lines)

    def kernels_used(self) -> list:
        """What ran the memory readers' and the kNN-MT steps: the C++ loops (AVX-512, AVX2 or
        portable) and the memory cache's dtype, or the PyTorch code."""
        from reluformer_mt.knn import fused as knn_fused
        from reluformer_mt.memory import fused as memory_fused

        lines = []
        readers = [r for m in self.models for r in m.modules() if isinstance(r, MemoryReader)]
        memories = sum(r.kernel_memories for r in readers)
        if memories and memory_fused.KERNEL.module is not None:
            wide = sum(r.cache_fallbacks for r in readers)
            cache = str(readers[0].step_cache_dtype).replace("torch.", "")
            kept = f" ({wide:,} of {memories:,} memories kept in float32: beyond float16's range)" if wide else ""
            lines.append(f"memory step: C++ {memory_fused.KERNEL.module.cpu_loops()} loops, cache {cache}{kept}")
        elif readers:
            lines.append("memory step: PyTorch")
        mixers = [part.mixer for part in self.guidance if getattr(part, "mixer", None) is not None]
        if mixers:
            module = knn_fused.KERNEL.module
            in_cpp = module is not None and any(m.cpp_steps for m in mixers)
            lines.append(f"kNN-MT step: C++ {module.cpu_loops()} loops" if in_cpp else "kNN-MT step: PyTorch")
        return lines
