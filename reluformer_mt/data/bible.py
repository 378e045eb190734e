"""The Greek New Testament (SBLGNT) with the English Berean Standard Bible and its manual word
alignment, from the PyPI package ``bible-alignments`` (0.4.2, Clear-Bible / Biblica; alignments
CC BY 4.0) -- a document-level corpus with gold word links.

Chapters are documents, verses are sentences. A verse's source words are the SBLGNT tokens of
that verse; its target words are the BSB tokens whose ``source_verse`` is that verse (BSB
sometimes moves words across verse boundaries; the alignment follows ``source_verse``).
Sentences are the words joined by single spaces (English punctuation stays a separate token),
so the whitespace tokens of a sentence are exactly the words the gold links index.

Gold links are 0-based ``i-j`` pairs, source word first; an alignment record with m source and n
target tokens gives its m*n links (the usual expansion of many-to-many groups).

We use the package's own ``AlignmentSet`` to locate its data files. Its ``Manager`` reads the
same files into per-token pydantic objects (11 s here) and drops verses that have no alignment
record; reading the three files directly keeps every verse and takes about a second.
"""
import csv
import json
import unicodedata
from collections import OrderedDict
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from reluformer_mt.data.readers import Document, Report

SOURCE_LANG, TARGET_LANG = "grc", "en"


def bible_files(root: Optional[str] = None) -> Dict[str, Path]:
    """Paths of the SBLGNT source, BSB target and manual alignment files.

    ``root``: a folder holding the package's ``data/`` tree (for a downloaded and unpacked wheel);
    by default the installed package's own files.
    """
    if root is None:
        from bible_alignments.burrito import DATAPATH, AlignmentSet

        alset = AlignmentSet(sourceid="SBLGNT", targetid="BSB", targetlanguage="eng", langdatapath=DATAPATH / "eng")
        files = {"source": alset.sourcepath, "target": alset.targetpath, "alignment": alset.alignmentpath}
    else:
        data = Path(root) / "data" if (Path(root) / "data").is_dir() else Path(root)
        files = {"source": data / "sources/SBLGNT.tsv", "target": data / "eng/targets/BSB/nt_BSB.tsv",
                 "alignment": data / "eng/alignments/BSB/SBLGNT-BSB-manual.json"}
    for what, path in files.items():
        if not Path(path).is_file():
            raise FileNotFoundError(f"{path}: bible {what} file not found (is bible-alignments==0.4.2 installed?)")
    return {k: Path(v) for k, v in files.items()}


def _read_tsv(path) -> List[dict]:
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


Verses = "OrderedDict[str, List[Tuple[str, str]]]"  # verse id (BBCCCVVV) -> ordered (word id, word)


def read_bible(report: Report, root: Optional[str] = None, books: Optional[Sequence[int]] = None) -> List[Document]:
    """Chapters of the New Testament as documents, with verse ids and gold links per verse.

    ``books``: keep only these book numbers (40 = Matthew ... 66 = Revelation).
    """
    files = bible_files(root)
    src_verses, tgt_verses = _read_verses(files)
    with open(files["alignment"], encoding="utf-8") as f:
        records = json.load(f)["records"]
    keep_book = (lambda v: True) if not books else (lambda v: int(v[:2]) in set(int(b) for b in books))
    kept, src_pos, tgt_pos = _kept_verses(report, files, src_verses, tgt_verses, keep_book)
    links = _gold_links(report, records, kept, src_pos, tgt_pos, keep_book)
    docs, by_chapter = [], OrderedDict()
    for v in kept:
        by_chapter.setdefault(v[:5], []).append(v)
    for chapter, vs in by_chapter.items():
        docs.append(Document(
            doc_id=chapter,
            src=[" ".join(w for _, w in src_verses[v]) for v in vs],
            tgt=[" ".join(w for _, w in tgt_verses[v]) for v in vs],
            sentence_ids=list(vs),
            links=[sorted(links[v]) for v in vs],
        ))
    report.counts["bible verses"] = len(kept)
    report.counts["bible chapters"] = len(docs)
    report.counts["bible gold links"] = sum(len(links[v]) for v in kept)
    report.counts["bible verses without links"] = sum(1 for v in kept if not links[v])
    return docs


def _read_verses(files: Dict[str, Path]) -> Tuple[Verses, Verses]:
    """The source (Greek) and target (English) words of each verse, in order."""
    src_verses: Verses = OrderedDict()
    for row in _read_tsv(files["source"]):
        wid = row["id"]  # n + BBCCCVVVWWWP
        # NFKC as the package's SourceReader does, so Greek accents compare equal
        src_verses.setdefault(wid[1:9], []).append((wid, unicodedata.normalize("NFKC", row["text"]).strip()))
    tgt_verses: Verses = OrderedDict()
    for row in _read_tsv(files["target"]):
        tgt_verses.setdefault(row["source_verse"], []).append((row["id"], row["text"].strip()))
    return src_verses, tgt_verses


def _kept_verses(report: Report, files: Dict[str, Path], src_verses: Verses, tgt_verses: Verses, keep_book):
    """The verses of the kept books with words on both sides (the others reported), and each word
    id's (verse, position) on either side."""
    verses = [v for v in src_verses if keep_book(v)]
    for v in tgt_verses:
        if v not in src_verses and keep_book(v):
            report.skip("bible verse with target words only", v)
    src_pos, tgt_pos = {}, {}
    kept = []
    for v in verses:
        if v not in tgt_verses:
            report.skip("bible verse with source words only", v)
            continue
        for side, words, pos in (("source", src_verses[v], src_pos), ("target", tgt_verses[v], tgt_pos)):
            for k, (wid, w) in enumerate(words):
                if not w or any(ch.isspace() for ch in w):
                    raise ValueError(f"{files[side]}: word {wid} is empty or contains whitespace: {w!r}")
                pos[wid] = (v, k)
        kept.append(v)
    return kept, src_pos, tgt_pos


def _gold_links(report: Report, records: List[dict], kept: List[str], src_pos: dict, tgt_pos: dict, keep_book):
    """Verse id -> its gold links (source position, target position); links outside the kept verses
    or across verses are reported and left out."""
    links: Dict[str, set] = {v: set() for v in kept}
    for rec in records:
        rid = rec.get("meta", {}).get("id")
        for s in rec["source"]:
            for t in rec["target"]:
                t = t[:11]  # the package drops a 12th "word part" digit the same way
                if s not in src_pos or t not in tgt_pos:
                    if keep_book(s[1:9]):
                        report.skip("bible link to a word outside the kept verses", f"record {rid}")
                    continue
                (sv, i), (tv, j) = src_pos[s], tgt_pos[t]
                if sv != tv:
                    report.skip("bible link crossing verses", f"record {rid}")
                    continue
                links[sv].add((i, j))
    return links



def split_by_chapter(docs: List[Document], valid_every: int = 20, valid_offset: int = 9,
                     test_offset: int = 19) -> Dict[str, List[Document]]:
    """Deterministic held-out chapters: the chapter at position p (canonical order) goes to valid
    when p % valid_every == valid_offset, to test when p % valid_every == test_offset, else train.
    Spreads held-out chapters over all books (13 + 13 of the 260)."""
    splits = {"train": [], "valid": [], "test": []}
    for p, doc in enumerate(docs):
        r = p % valid_every
        splits["valid" if r == valid_offset else "test" if r == test_offset else "train"].append(doc)
    return splits


def write_gold(docs: List[Document], out_dir, split: str, src: str, tgt: str) -> int:
    """``{split}.words.{src,tgt}`` (the words, one verse a line), ``{split}.gold.align`` (0-based
    ``i-j`` links, source first, one verse a line) and ``{split}.verses.tsv`` (verse id, document
    id, sentence index) in the sentence order of the split. Returns the number of links."""
    out_dir = Path(out_dir)
    n_links = 0
    with open(out_dir / f"{split}.words.{src}", "w", encoding="utf-8") as fs, \
            open(out_dir / f"{split}.words.{tgt}", "w", encoding="utf-8") as ft, \
            open(out_dir / f"{split}.gold.align", "w", encoding="utf-8") as fa, \
            open(out_dir / f"{split}.verses.tsv", "w", encoding="utf-8") as fv:
        for doc in docs:
            for k, (s, t, vid, links) in enumerate(zip(doc.src, doc.tgt, doc.sentence_ids, doc.links)):
                ns, nt = len(s.split()), len(t.split())
                for i, j in links:
                    if not (0 <= i < ns and 0 <= j < nt):
                        raise ValueError(f"verse {vid}: link {i}-{j} outside {ns} source / {nt} target words")
                fs.write(s + "\n")
                ft.write(t + "\n")
                fa.write(" ".join(f"{i}-{j}" for i, j in links) + "\n")
                fv.write(f"{vid}\t{doc.doc_id}\t{k}\n")
                n_links += len(links)
    return n_links
