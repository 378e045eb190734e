"""Document-level translation on segments of whole sentences (doc-to-doc, as in G-Transformer,
Bao et al. ACL 2021; in the spirit of contextual-mt's ``document_translation``).

Reads a directory prepared by ``reluformer-prepare``: the binarised segments, and beside them
``{split}.segments.tsv`` (document id, sentence count, first sentence index per example) and
``prepared.json``. Differences from ``--task translation``:

- a segment longer than the model's positions is an error naming the split, the example, its
  document and its lengths -- never skipped (``--skip-invalid-size-inputs-valid-test``) or cut
  (``--truncate-source``), since a lost segment silently removes sentences from a document;
- every example's source must hold ``n_sentences - 1`` separator tokens, as its metadata says;
- with ``--eval-bleu`` validation reports ``s_bleu`` (hypothesis segments split back into
  sentences at the separator) and ``d_bleu`` (BLEU over whole documents, Liu et al. 2020),
  plus ``sep_mismatch``, the number of hypothesis segments whose sentence count is wrong.
"""
import logging
import os
import time
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Dict, Optional

import numpy as np
import torch
from fairseq import metrics, utils
from fairseq.tasks import register_task
from fairseq.tasks.fairseq_task import FairseqTask
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from reluformer_mt.data.prepared import SPM_MODEL_SYNTAX, Prepared, load_sentencepiece, parse_spm_models
from reluformer_mt.data.segments import SEPARATOR, metadata_path, read_segment_metadata, segments_to_documents, split_segment
from reluformer_mt.evaluation.bleu import corpus_dbleu, corpus_sbleu
from reluformer_mt.guidance.declared import task_name
from reluformer_mt.guidance.kinds import guidance_kinds, parse_guidance
from reluformer_mt.memory.tm_data import TM_FUSIONS, MemoryPairDataset, encode_entries, matches_of_rows

logger = logging.getLogger(__name__)


class DocumentDataError(ValueError):
    """A data directory the document task cannot read (a missing metadata file): one line in
    fairseq's commands too, where a FileNotFoundError without errno was a traceback."""


@dataclass
class _DocumentConfig(TranslationConfig):
    separator: str = field(default=SEPARATOR, metadata={"help": "separator token between the sentences of a segment"})
    eval_bleu_spm: str = field(
        default="auto",
        metadata={"help": "SentencePiece model for decoding hypotheses and references before s-/d-BLEU: "
                          f"'auto' = the target model named in prepared.json, 'none' = score pieces, or {SPM_MODEL_SYNTAX} "
                          "(the target model is used)"},
    )
    tm_fusion: str = field(
        default="none",
        metadata={"help": "translation memory: 'none'; 'concat' = each sentence's retrieved targets follow the source "
                          "(Neural Fuzzy Repair); 'attention' = the model encodes them and reads them through "
                          "memory-attention sublayers (EMAT-style). Needs neighbours in the data directory "
                          "(reluformer-prepare --memory-k K)"},
    )
    tm_k: int = field(default=1, metadata={"help": "retrieved entries per sentence that the model sees (<= the prepared k)"})
    tm_key_loss: float = field(
        default=0.0,
        metadata={"help": "weight of the learned memory keys' in-batch retrieval loss (EMAT; needs --tm-fusion attention; "
                          "0 = off). Builds the model's key projection; single-sentence examples only"})
    tm_key_temperature: float = field(default=0.05, metadata={"help": "temperature of the in-batch retrieval loss"})
    tm_refresh_epochs: int = field(
        default=0,
        metadata={"help": "every N epochs re-key the memory with the current model's keys and replace the matches of the "
                          "loaded splits (needs --tm-fusion attention; 0 = the prepared matches throughout)"})
    tm_refresh_rerank: str = field(
        default="fuzzy", metadata={"help": "re-keying: 'fuzzy' = rerank the top 128 by fuzzy match, 'none' = pure MIPS"})
    # word dropout (Sennrich & Zhang, ACL 2019, "Revisiting Low-Resource Neural Machine Translation";
    # G-Transformer's token masking, Bao et al. 2021): in training, each token of the source / of the
    # decoder's input is replaced by <unk> with this probability (the loss still reads every target)
    source_word_dropout: float = field(default=0.0, metadata={
        "help": "training only: probability of replacing each source token by <unk> (0 = off)"})
    target_word_dropout: float = field(default=0.0, metadata={
        "help": "training only: probability of replacing each token of the decoder's input (the shifted "
                "target) by <unk> (0 = off; Sennrich & Zhang 2019 use 0.1-0.3)"})
    guidance: Optional[str] = field(default=None, metadata={
        "help": "further decoding guidance at generation, by the name its kind is registered under: "
                "'NAME:option=value,...', several joined by ';' (reluformer_mt.guidance)"})


def generation_fields() -> list:
    """The task's generation options for fairseq-generate / fairseq-interactive (``--knn-datastore``,
    ``--knn-k``...; reluformer-translate has ``--knn`` and the rest, docs/KNN_MT.md): the fields of the
    guidance kinds' declarations marked for the task, under their task names, with their defaults and help."""
    out = []
    for group in guidance_kinds():
        for f in fields(group.options):
            name = task_name(group, f)
            if name:
                help = f"{group.name}: {f.metadata['help']}"
                out.append((name, f.type, field(default=f.default, metadata={"help": help})))
    return out


def generation_options(cfg) -> list:
    """The guidance options of the task's config: every kind with fields here (a kind's defaults ask
    for nothing), then ``--guidance``'s."""
    options = []
    for group in guidance_kinds():
        names = {f.name: task_name(group, f) for f in fields(group.options) if task_name(group, f)}
        if names:
            options.append(group.options(**{k: getattr(cfg, name, None) for k, name in names.items()}))
    return options + parse_guidance(getattr(cfg, "guidance", None))


def _device_of(models) -> str:
    """Where fairseq-generate put the models (the guidance parts' tensors go there too)."""
    parameter = next((p for m in models for p in m.parameters()), None)
    return "cpu" if parameter is None else str(parameter.device)


DocumentTranslationConfig = make_dataclass("DocumentTranslationConfig", generation_fields(), bases=(_DocumentConfig,))
DocumentTranslationConfig.__module__ = __name__


def check_word_dropout(cfg) -> None:
    for option, value in (("--source-word-dropout", cfg.source_word_dropout),
                          ("--target-word-dropout", cfg.target_word_dropout)):
        if not 0 <= value < 1:
            raise ValueError(f"{option}: got {value}, expected a probability in [0, 1)")


def drop_words(tokens: torch.Tensor, p: float, unk: int, keep) -> torch.Tensor:
    """``tokens`` with each token not in ``keep`` (padding, </s>, separators) replaced by ``unk``
    with probability ``p``; the global torch generator draws (fairseq seeds it per update)."""
    if p <= 0:
        return tokens
    drop = torch.rand(tokens.shape, device=tokens.device) < p
    for index in keep:
        drop &= tokens != index
    return tokens.masked_fill(drop, unk)


def check_key_options(cfg) -> None:
    """One-line errors for the learned keys' task options."""
    if not 0 <= cfg.tm_key_loss < float("inf"):
        raise ValueError(f"--tm-key-loss: got {cfg.tm_key_loss}, expected a finite weight >= 0")
    if not 0 < cfg.tm_key_temperature < float("inf"):
        raise ValueError(f"--tm-key-temperature: got {cfg.tm_key_temperature}, expected a number > 0")
    if cfg.tm_refresh_epochs < 0:
        raise ValueError(f"--tm-refresh-epochs: got {cfg.tm_refresh_epochs}, expected >= 0")
    if cfg.tm_refresh_rerank not in ("fuzzy", "none"):
        raise ValueError(f"--tm-refresh-rerank: got {cfg.tm_refresh_rerank!r}, expected fuzzy or none")
    for option, value in (("--tm-key-loss", cfg.tm_key_loss), ("--tm-refresh-epochs", cfg.tm_refresh_epochs)):
        if value and cfg.tm_fusion != "attention":
            raise ValueError(f"{option} {value}: needs --tm-fusion attention (got {cfg.tm_fusion!r})")


def sentence_and_document_bleu(hyp_segments: Dict[int, str], ref_segments: Dict[int, str], infos, separator=SEPARATOR):
    """s-BLEU and d-BLEU (sacreBLEU, via :mod:`reluformer_mt.evaluation.bleu`) of detokenised
    segments keyed by example index.

    Returns (s_bleu, d_bleu, n_mismatched_segments). A hypothesis segment that splits into the
    wrong number of sentences is counted (``sep_mismatch``) and fitted for s-BLEU only: extra
    parts merge into its last sentence, missing ones are empty. Documents are rebuilt from the
    segments present, in sentence order.
    """
    ids = sorted(hyp_segments)
    if not ids:
        return 0.0, 0.0, 0
    segments = [infos[i] for i in ids]
    hyp_docs = segments_to_documents([hyp_segments[i] for i in ids], segments, separator, on_mismatch="fit")
    ref_docs = segments_to_documents([ref_segments[i] for i in ids], segments, separator, on_mismatch="keep")
    mismatch = sum(len(split_segment(hyp_segments[i], separator)) != infos[i].n_sentences for i in ids)
    s_bleu = corpus_sbleu([s for d in hyp_docs.values() for s in d], [s for d in ref_docs.values() for s in d])
    # the empty sentences fitted in for s-BLEU are no text of the document
    d_bleu = corpus_dbleu([[s for s in d if s] for d in hyp_docs.values()], [[s for s in d if s] for d in ref_docs.values()])
    return s_bleu.score, d_bleu.score, mismatch


@register_task("document_translation", dataclass=DocumentTranslationConfig)
class DocumentTranslationTask(TranslationTask):
    cfg: DocumentTranslationConfig

    def __init__(self, cfg, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        self.segment_infos = {}       # split -> List[SegmentInfo]
        self._split_of_dataset = {}   # id(dataset) -> split
        self._valid_split = None
        self._valid_outputs = {}      # split -> {example index: (hyp, ref)}
        self.prepared = None          # the data directory's Prepared (prepared.json), if any
        self.spm = None

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        if cfg.truncate_source:
            raise ValueError("--task document_translation refuses --truncate-source: a cut segment loses sentences of its "
                             "document; re-prepare with a smaller --segment-tokens instead")
        task = super().setup_task(cfg, **kwargs)
        data_dir = utils.split_paths(cfg.data)[0]
        task.prepared = Prepared.load_if_present(data_dir)
        if task.prepared is not None and task.prepared.separator != cfg.separator:
            raise ValueError(f"{Prepared.path(data_dir)}: prepared with separator {task.prepared.separator!r} but "
                             f"--separator is {cfg.separator!r}")
        if cfg.tm_fusion not in TM_FUSIONS:
            raise ValueError(f"--tm-fusion: got {cfg.tm_fusion!r}, expected one of {', '.join(TM_FUSIONS)}")
        if cfg.tm_k < 1:
            raise ValueError(f"--tm-k: got {cfg.tm_k}, expected >= 1")
        check_key_options(cfg)
        check_word_dropout(cfg)
        for name, d in (("source", task.src_dict), ("target", task.tgt_dict)):
            if d.index(cfg.separator) == d.unk():
                raise ValueError(f"{data_dir}: the {name} dictionary has no {cfg.separator!r} entry, so segments cannot "
                                 "be split back into sentences; prepare the data with reluformer-prepare")
        return task

    # ------------------------------------------------------------ data

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        dataset = self.datasets[split]
        data_dir = utils.split_paths(self.cfg.data)[0]
        path = metadata_path(data_dir, split)
        if not path.is_file():
            raise DocumentDataError(f"{path}: missing; --task document_translation needs the segment metadata written by "
                                    "reluformer-prepare (use --task translation for plain sentence-level data)")
        infos = read_segment_metadata(path)
        if len(infos) != len(dataset):
            raise ValueError(f"{path}: {len(infos)} segments but the binarised {split} set has {len(dataset)} examples")
        self._check_separators(split, dataset, infos)
        self._check_lengths(split, dataset, infos, (self.cfg.max_source_positions, self.cfg.max_target_positions))
        self.segment_infos[split] = infos
        if self.cfg.tm_fusion != "none":
            dataset = self.datasets[split] = self._with_memory(data_dir, split, dataset, infos)
            self._check_lengths(split, dataset, infos, (self.cfg.max_source_positions, self.cfg.max_target_positions))
        self._split_of_dataset[id(dataset)] = split

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        return super().train_step(self.with_word_dropout(sample), model, criterion, optimizer, update_num, ignore_grad)

    def with_word_dropout(self, sample):
        """The sample with word dropout on its source and decoder input (a copy; the targets kept)."""
        p_src, p_tgt = self.cfg.source_word_dropout, self.cfg.target_word_dropout
        if not (p_src or p_tgt) or sample is None or "net_input" not in sample:
            return sample
        net_input = dict(sample["net_input"])
        for name, p, d in (("src_tokens", p_src, self.src_dict), ("prev_output_tokens", p_tgt, self.tgt_dict)):
            if p and name in net_input:
                keep = (d.pad(), d.eos(), d.bos(), d.index(self.cfg.separator))
                net_input[name] = drop_words(net_input[name], p, d.unk(), keep)
        return {**sample, "net_input": net_input}

    # ------------------------------------------------------------ translation memory

    def memory_entries(self, data_dir):
        """Token ids of the memory's targets: the training split's sentences (loaded once)."""
        if getattr(self, "_memory_entries", None) is None:
            from reluformer_mt.memory.tm import split_sentences_of

            path = os.path.join(data_dir, "text", f"train.{self.cfg.target_lang}")
            if not os.path.isfile(path):
                raise DocumentDataError(f"{path}: missing; --tm-fusion reads the memory's targets from the prepared text")
            with open(path, encoding="utf-8") as f:
                pieces = split_sentences_of(f, self.cfg.separator)
            self._memory_entries = encode_entries(pieces, self.tgt_dict)
        return self._memory_entries

    def _with_memory(self, data_dir, split, dataset, infos):
        from reluformer_mt.memory.neighbours import load_neighbours, sentence_rows

        ids, _ = load_neighbours(data_dir, split, self.cfg.tm_k)
        rows = sentence_rows([info.n_sentences for info in infos])
        if rows and rows[-1].stop != len(ids):
            raise ValueError(f"{data_dir}: {split} has {rows[-1].stop} sentences in its segments but {len(ids)} rows of "
                             "memory neighbours; re-run reluformer-prepare with --memory-k")
        matches = matches_of_rows(self.memory_entries(data_dir), ids, rows, self.src_dict.bos())
        dataset = MemoryPairDataset.wrap(dataset, matches, self.cfg.tm_fusion)
        if self.cfg.tm_key_loss > 0 and split == self.cfg.train_subset:
            from reluformer_mt.memory.learned_keys import positives_of

            positives = positives_of(data_dir)
            # the loss runs on single-sentence examples (a segment has no one sentence key)
            per_example = [int(positives[r.start]) if len(r) == 1 else -1 for r in rows]
            dataset.set_positives(per_example, self.sentence_sources(data_dir, "train"))
        return dataset

    def sentence_sources(self, data_dir, split):
        """Source token ids (with </s>, as the model sees sources) of a split's sentences; the
        training split's are the memory's keys' inputs (loaded once)."""
        cache = self.__dict__.setdefault("_sentence_sources", {})
        if split not in cache:
            from reluformer_mt.memory.tm import split_sentences_of

            path = os.path.join(data_dir, "text", f"{split}.{self.cfg.source_lang}")
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{path}: missing; the learned memory keys read the prepared text")
            with open(path, encoding="utf-8") as f:
                pieces = split_sentences_of(f, self.cfg.separator)
            eos = torch.tensor([self.src_dict.eos()])
            cache[split] = [torch.cat([t, eos]) for t in encode_entries(pieces, self.src_dict)]
        return cache[split]

    def begin_epoch(self, epoch, model):
        """Every ``--tm-refresh-epochs`` epochs: re-key the memory with the current model."""
        every = self.cfg.tm_refresh_epochs
        if every and epoch > 1 and (epoch - 1) % every == 0:
            self.refresh_matches(model)

    def refresh_matches(self, model):
        """Encode the memory and the loaded splits' sentences with the model's keys, search
        (leave-one-out in training, the memory = the training sentences) and give every memory
        dataset its new matches."""
        from reluformer_mt.memory.learned_keys import encode_keys, neighbours_from_keys
        from reluformer_mt.memory.mips import MipsIndex
        from reluformer_mt.memory.neighbours import sentence_rows
        from reluformer_mt.memory.tm import fuzzy_words, read_prepared

        start = time.time()
        data_dir = utils.split_paths(self.cfg.data)[0]
        entries = self.sentence_sources(data_dir, "train")
        index = MipsIndex("exact").build(encode_keys(model, entries))
        entry_words = [fuzzy_words(s) for s in read_prepared(data_dir, "train").sources]
        for split, dataset in self.datasets.items():
            if not isinstance(dataset, MemoryPairDataset):
                continue
            queries = self.sentence_sources(data_dir, split)
            words = entry_words if split == "train" else [fuzzy_words(s) for s in read_prepared(data_dir, split).sources]
            ids, _ = neighbours_from_keys(index, encode_keys(model, queries), words, entry_words, self.cfg.tm_k,
                                          rerank=self.cfg.tm_refresh_rerank == "fuzzy",
                                          exclude=np.arange(len(queries)) if split == "train" else None)
            rows = sentence_rows([info.n_sentences for info in self.segment_infos[split]])
            old = dataset.matches
            dataset.set_matches(matches_of_rows(self.memory_entries(data_dir), ids, rows, self.src_dict.bos()))
            changed = sum(not torch.equal(a, b) for a, b in zip(old, dataset.matches))
            logger.info(f"re-keyed the memory with the model's keys: {split}: {changed} of {len(old)} examples got new "
                        f"matches ({time.time() - start:.1f} s)")

    def dataset_with_matches(self, dataset, matches):
        """An inference dataset (``build_dataset_for_inference``) with the given memory matches
        (one token tensor per source, see :func:`reluformer_mt.memory.tm_data.matches_of_rows`)."""
        if self.cfg.tm_fusion == "none":
            return dataset
        return MemoryPairDataset.wrap(dataset, matches, self.cfg.tm_fusion)

    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None, **kwargs):
        """fairseq's generator with the decoding guidance the options ask for, built as
        reluformer-translate builds its own (:mod:`reluformer_mt.guidance`): with
        ``--knn-datastore`` its beam search mixes in the datastore's neighbours, so fairseq-generate and
        fairseq-interactive get kNN-MT; ``--guidance`` names further registered kinds."""
        from reluformer_mt.guidance.base import GuidanceContext, build_guidance, install_guidance

        generator = super().build_generator(models, args, seq_gen_cls=seq_gen_cls,
                                            extra_gen_cls_kwargs=extra_gen_cls_kwargs, **kwargs)
        parts = build_guidance(generation_options(self.cfg), GuidanceContext(list(models), self, _device_of(models)))
        if install_guidance(generator, parts) is not None:
            for part in parts:
                logger.info(part.describe() or type(part).__name__)
        return generator

    def _check_separators(self, split, dataset, infos):
        sep = self.src_dict.index(self.cfg.separator)
        for i, info in enumerate(infos):
            n = int((dataset.src[i] == sep).sum())
            if n != info.n_sentences - 1:
                raise ValueError(f"{split}: example {i} (document {info.doc_id}) has {n} separators in its source but its "
                                 f"metadata says {info.n_sentences} sentences")

    def _check_lengths(self, split, dataset, infos, max_positions):
        max_src, max_tgt = max_positions
        src_sizes = dataset.src_sizes
        tgt_sizes = dataset.tgt_sizes if dataset.tgt_sizes is not None else np.zeros_like(src_sizes)
        bad = np.nonzero((src_sizes > max_src) | (tgt_sizes > max_tgt))[0]
        if len(bad):
            i = int(bad[0])
            info = infos[i]
            raise ValueError(
                f"{split}: example {i} (document {info.doc_id}, sentences {info.first_sentence}-{info.first_sentence + info.n_sentences - 1}) "
                f"has {src_sizes[i]} source / {tgt_sizes[i]} target tokens with </s>, more than the model's positions "
                f"{max_src} / {max_tgt} ({len(bad)} such examples; longest {int(src_sizes.max())} / {int(tgt_sizes.max())}). "
                f"Raise --max-source-positions/--max-target-positions to at least {int(src_sizes.max())} / {int(tgt_sizes.max())} "
                f"(prepared.json gives them), or re-prepare with a smaller --segment-tokens; segments are never skipped or truncated")

    def filter_indices_by_size(self, indices, dataset, max_positions=None, ignore_invalid_inputs=False):
        """Refuse, never skip: ``max_positions`` here is the smaller of task and model positions
        (and --max-tokens), which load_dataset could not know."""
        kept, ignored = dataset.filter_indices_by_size(indices, max_positions)
        if len(ignored):
            split = self._split_of_dataset.get(id(dataset), "?")
            infos = self.segment_infos.get(split)
            i = int(ignored[0])
            where = f"document {infos[i].doc_id}, " if infos else ""
            src_len = int(dataset.src_sizes[i])
            tgt_len = int(dataset.tgt_sizes[i]) if dataset.tgt_sizes is not None else 0
            raise ValueError(
                f"{split}: example {i} ({where}{src_len} source / {tgt_len} target tokens with </s>) does not fit "
                f"max_positions={max_positions} (the smallest of the task's and model's positions and --max-tokens; "
                f"{len(ignored)} such examples). Raise --max-source-positions/--max-target-positions (and the model's) "
                f"or --max-tokens, or re-prepare with a smaller --segment-tokens; document_translation never skips segments")
        return kept

    def get_batch_iterator(self, dataset, *args, **kwargs):
        split = self._split_of_dataset.get(id(dataset))
        if split is not None and split != self.cfg.train_subset:
            # the trainer asks for a valid iterator at the start of each subset's validation
            self._valid_split = split
            self._valid_outputs[split] = {}
        return super().get_batch_iterator(dataset, *args, **kwargs)

    # ------------------------------------------------------------ validation BLEU

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        if self.cfg.eval_bleu and self.cfg.eval_bleu_spm != "none":
            self.spm = self._load_spm()
        return model

    def _load_spm(self):
        """The target SentencePiece model that detokenises for BLEU (None: score pieces)."""
        if self.cfg.eval_bleu_spm == "auto":
            if self.prepared is None:
                return None
            return self.prepared.sentencepiece(check_separator=False)[1]
        target = parse_spm_models(self.cfg.eval_bleu_spm, "--eval-bleu-spm")[-1]
        if not os.path.isfile(target):
            raise FileNotFoundError(f"--eval-bleu-spm: {target} not found")
        return load_sentencepiece([target])[1]

    def _detok_segment(self, tokens, escape_unk):
        pieces = self.tgt_dict.string(tokens.int().cpu(), unk_string=("UNKNOWNTOKENINREF" if escape_unk else "UNKNOWNTOKENINHYP"))
        sentences = split_segment(pieces, self.cfg.separator)
        if self.spm is not None:
            sentences = [self.spm.decode_pieces(s.split()) for s in sentences]
        elif self.cfg.eval_bleu_remove_bpe:
            sentences = [utils.post_process(s, self.cfg.eval_bleu_remove_bpe) for s in sentences]
        return f" {self.cfg.separator} ".join(sentences)

    def valid_step(self, sample, model, criterion):
        loss, sample_size, logging_output = FairseqTask.valid_step(self, sample, model, criterion)
        if self.cfg.eval_bleu and self._valid_split is not None:
            gen_out = self.inference_step(self.sequence_generator, [model], sample, prefix_tokens=None)
            store = self._valid_outputs.setdefault(self._valid_split, {})
            for i, idx in enumerate(sample["id"].tolist()):
                hyp = self._detok_segment(gen_out[i][0]["tokens"], escape_unk=False)
                ref = self._detok_segment(utils.strip_pad(sample["target"][i], self.tgt_dict.pad()), escape_unk=True)
                store[idx] = (hyp, ref)
            if self.cfg.eval_bleu_print_samples and len(gen_out):
                logger.info("example hypothesis: %s", store[sample["id"][0].item()][0])
                logger.info("example reference: %s", store[sample["id"][0].item()][1])
            logging_output["_doc_bleu_segments"] = len(gen_out)
        return loss, sample_size, logging_output

    def _bleu_of_current_split(self):
        split = self._valid_split
        store = self._valid_outputs.get(split) or {}
        if not store:
            return 0.0, 0.0, 0
        key = (split, id(store), len(store))
        if getattr(self, "_bleu_cache", (None,))[0] != key:  # three meters read the same scores
            scores = sentence_and_document_bleu({k: v[0] for k, v in store.items()}, {k: v[1] for k, v in store.items()},
                                                self.segment_infos[split], self.cfg.separator)
            self._bleu_cache = (key, scores)
        return self._bleu_cache[1]

    def reduce_metrics(self, logging_outputs, criterion):
        FairseqTask.reduce_metrics(self, logging_outputs, criterion)
        if self.cfg.eval_bleu and any("_doc_bleu_segments" in log for log in logging_outputs):
            metrics.log_scalar("_doc_bleu_segments", sum(log.get("_doc_bleu_segments", 0) for log in logging_outputs))
            # documents span batches: the scores come from the segments stored during this
            # subset's validation (on this worker), computed once when the meters are read
            metrics.log_derived("s_bleu", lambda meters: round(self._bleu_of_current_split()[0], 2))
            metrics.log_derived("d_bleu", lambda meters: round(self._bleu_of_current_split()[1], 2))
            metrics.log_derived("sep_mismatch", lambda meters: self._bleu_of_current_split()[2])
