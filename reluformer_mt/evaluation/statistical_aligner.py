"""A statistical word aligner as an informed reference for attention AER: eflomal (Östling &
Tiedemann 2017, "Efficient word alignment with Markov Chain Monte Carlo", PBML 106), an IBM-model
aligner with fertility and HMM distortion, run in both directions and symmetrised with
grow-diag-final-and (Koehn et al. 2005).

Unsupervised, as is usual: the test sentences are aligned together with the training sentences
(no gold links are seen), then scored against the gold. eflomal samples with its own random seed,
so its AER differs slightly from run to run (by about 0.001-0.005 on the bible test verses).
"""
import tempfile
from pathlib import Path
from typing import List, Sequence, Set, Tuple

from reluformer_mt.evaluation import aer as aer_lib

Link = Tuple[int, int]
# one sampler instead of eflomal's default 3: a third of the time (~10 s for the bible on 2 cores)
SAMPLERS = 1
NEIGHBOURS = ((-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))


def available() -> bool:
    try:
        import eflomal  # noqa: F401
    except ImportError:
        return False
    return True


def grow_diag_final_and(forward: Set[Link], reverse: Set[Link]) -> Set[Link]:
    """Symmetrise two directional alignments (both as (source, target) links): start from their
    intersection, add neighbouring (also diagonal) links of the union that align a word not yet
    aligned, then links of the union whose source and target words are both still unaligned
    (Koehn et al. 2005; Moses' grow-diag-final-and)."""
    union, links = forward | reverse, set(forward & reverse)
    src_done, tgt_done = {i for i, _ in links}, {j for _, j in links}
    grown = True
    while grown:
        grown = False
        for i, j in sorted(links):
            for di, dj in NEIGHBOURS:
                p = (i + di, j + dj)
                if p in union and p not in links and (p[0] not in src_done or p[1] not in tgt_done):
                    links.add(p)
                    src_done.add(p[0])
                    tgt_done.add(p[1])
                    grown = True
    for direction in (forward, reverse):  # final-and: both words unaligned
        for i, j in sorted(direction):
            if (i, j) not in links and i not in src_done and j not in tgt_done:
                links.add((i, j))
                src_done.add(i)
                tgt_done.add(j)
    return links


def eflomal_alignments(src_lines: Sequence[str], tgt_lines: Sequence[str]) -> List[Set[Link]]:
    """grow-diag-final-and links of eflomal's two directions for every (tokenised) sentence pair."""
    try:
        import eflomal
    except ImportError as e:
        raise ValueError("the statistical aligner needs eflomal (pip install eflomal)") from e
    if len(src_lines) != len(tgt_lines):
        raise ValueError(f"{len(src_lines)} source but {len(tgt_lines)} target sentences")
    with tempfile.TemporaryDirectory() as tmp:
        fwd, rev = Path(tmp) / "fwd", Path(tmp) / "rev"
        eflomal.Aligner(n_samplers=SAMPLERS).align(list(src_lines), list(tgt_lines), links_filename_fwd=str(fwd),
                                links_filename_rev=str(rev), quiet=True)
        forward = aer_lib.read_predictions(fwd, 0)
        reverse = aer_lib.read_predictions(rev, 0)
    return [grow_diag_final_and(f, r) for f, r in zip(forward, reverse)]


def eflomal_aer(data_dir: Path, split: str = "test") -> dict:
    """AER of eflomal on ``{split}`` of a prepared bible directory, aligned together with its
    training verses: {"aer", "precision", "recall", "sentences", "method"}."""
    data_dir = Path(data_dir)
    read = lambda name: (data_dir / name).read_text(encoding="utf-8").splitlines()  # noqa: E731
    train_src, train_tgt = read("train.words.grc"), read("train.words.en")
    test_src, test_tgt = read(f"{split}.words.grc"), read(f"{split}.words.en")
    links = eflomal_alignments(train_src + test_src, train_tgt + test_tgt)[len(train_src):]
    result = aer_lib.corpus_aer(links, aer_lib.read_gold(data_dir / f"{split}.gold.align", base=0))
    return {"aer": result.aer, "precision": result.precision, "recall": result.recall, "sentences": len(test_src),
            "method": f"eflomal (Östling & Tiedemann 2017) on the {len(train_src)} training and {len(test_src)} "
                      f"{split} verses, both directions, grow-diag-final-and"}


__all__ = ["available", "eflomal_aer", "eflomal_alignments", "grow_diag_final_and"]
