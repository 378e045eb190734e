"""What ``reluformer-demo`` runs: its families, presets and options (:class:`DemoOptions`).

Plain data, importing neither torch nor fairseq, so that the command line checks every option
before the stages (:mod:`reluformer_mt.experiments.demo`) load them."""
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

# reluformer+tm (the ReLU read-out of the memory) is in the read-out study (docs/history/TRANSLATION_MEMORY.md):
# at the demo's 2,500 updates it gained less than softmax+tm and took the longest, so the default
# demo keeps one memory-attention family and guides every family by translation pieces.
# ``make demo`` trains two families so that it fits 30 minutes on 2 cores (each family trains 2,500
# updates, the tuning budget of docs/FAMILIES.md, on one core); ``make demo-full`` adds the other two
# (reluformer, rela, softmax, softmax+tm) to the same folder, reusing the finished ones
DEFAULT_FAMILIES = ("reluformer", "softmax")
# a family with a translation memory: "softmax+concat", "reluformer+attention"; "+tm" = ``tm_fusion``
MEMORY_SUFFIXES = ("tm", "concat", "attention")
NEIGHBOURS_K = 16  # neighbours computed per sentence at preparation (the study reads up to 16)

# Options a preset fills when the command line does not give them. ``quick`` (``make demo``) comes
# from the quality study (docs/QUALITY_STUDY.md): on 2 CPU cores the 64-dim 2+2 model on a
# 2,000-piece vocabulary, trained on sentences first with lr 5e-3, learns most per minute; a short
# document phase then teaches it the separators. ``long`` (the reference run, docs/REFERENCE_RUN.md)
# trains the same model longer and fine-tunes it on 512-token segments, the length at which the
# ReLUFormer paper compares; a 128-dim 3+3 model (lr 4e-3) was tried first and learned slower per
# update and per minute (greedy valid s-BLEU 0.7-1.3 after 1,250 updates, against 3.2 for this one).
PRESETS: Dict[str, dict] = {
    "quick": dict(embed_dim=64, ffn_dim=128, layers=2, heads=4, segment_tokens="128", vocab_size=2000,
                  sentence_updates=1500, max_update=1000, lr=5e-3, warmup_updates=200, dropout=0.1, max_tokens=4096,
                  beam=4, validations=3),
    "long": dict(embed_dim=64, ffn_dim=128, layers=2, heads=4, segment_tokens="512", vocab_size=2000,
                 sentence_updates=3300, max_update=500, lr=5e-3, warmup_updates=200, dropout=0.1, max_tokens=4096,
                 beam=5, validations=3),
    # the reference run of the low-resource recipe (issue 62): each family's settings from the recipe
    # search (tuned_presets.json) trained 4x the search's 4,500 updates, the same share on sentences,
    # then on documents of every length; about 1.5-3 hours per family and core at the search's sizes
    "reference": dict(embed_dim=64, ffn_dim=128, layers=2, heads=4, segment_tokens="512", vocab_size=2000,
                      sentence_updates=10800, max_update=7200, lr=5e-3, warmup_updates=200, dropout=0.1,
                      max_tokens=4096, beam=5, validations=6),
}
# the data a preset trains on when the command line does not say (the recipe's: both English
# translations, and documents cut at every length for the document phase)
PRESET_DATA: Dict[str, dict] = {
    "reference": dict(extra_target="web", train_lengths=["sentence", "128", "512", "document"]),
}
# presets that take each family's tuned settings (the quick one, which the search ran at; the
# reference run, which scales the tuned phase split to its own budget)
TUNED_PRESET_NAMES = ("quick", "reference")


@dataclass
class DemoOptions:
    out: Path
    families: List[str]
    preset: str = "quick"
    size: Optional[str] = None  # an architecture size instead of the preset's dimensions
    embed_dim: int = 64
    ffn_dim: int = 128
    layers: int = 2
    heads: int = 4
    segment_tokens: str = "128"
    vocab_size: int = 2000
    sentence_updates: int = 1500
    max_update: int = 1000
    budget_minutes: float = 0.0
    max_tokens: int = 4096
    lr: float = 5e-3
    warmup_updates: int = 200
    # the document phase's peak learning rate (None: ``lr``, a fresh schedule). Continuing the
    # sentence phase's decay instead (lr 1.67e-3 for the quick preset) was measured worse on
    # the test chapters (docs/QUALITY_STUDY.md), as was 5e-4 for the long preset's 512-token phase
    document_lr: Optional[float] = None
    dropout: float = 0.1
    beam: int = 4
    validations: int = 3
    eval_chapters: int = 0
    seed: int = 1
    bible_root: Optional[str] = None
    force: bool = False
    device: str = "cpu"
    # further fairseq-train options for every family, e.g. ["--relu-no-length-scale"] (ablations)
    train_args: List[str] = field(default_factory=list)
    # translation memory of the "+tm" families: fusion and matches per sentence
    tm_fusion: str = "attention"
    tm_k: int = 2
    # translation pieces (Zhang et al. 2018): every family also translated with beam search guided by the
    # n-grams of the top ``pieces_k`` memory matches of the verse it is writing, bonus weight x fuzzy
    # score for matches above a fuzzy floor. None: weight and floor tuned on the validation chapters by
    # ``reluformer-memory tune`` (the default); a number: used as given (0: not run)
    pieces_weight: Optional[float] = None
    pieces_floor: float = 0.0
    pieces_k: int = 8
    # kNN-MT (docs/KNN_MT.md): a datastore of every family's training chapters, the search values tuned on
    # the validation chapters, and the test chapters translated with it (full and per-input datastores)
    knn: bool = True
    knn_memory_k: int = 8
    # validation chapters the tuner decodes (its teacher-forced grid reads all of them; 0: all)
    tune_chapters: int = 7
    # no progress within the training stage (a bar on a terminal, else a line every 30 s)
    no_progress: bool = False
    # families trained at once on a CPU, one thread each (see training_jobs)
    jobs: int = 2
    # the low-resource recipe's data (reluformer-prepare's options of the same names, docs/USAGE.md): a
    # second English translation joined by verse ("web" or a file), and the document phase's training
    # split cut at several lengths (e.g. ["sentence", "128", "512", "document"]); valid and test stay
    # at segment_tokens
    extra_target: Optional[str] = None
    train_lengths: List[str] = field(default_factory=list)
    # each family's tuned settings over the ones above ({family: {lr, warmup_updates, dropout,
    # sentence_updates, max_update, train_args}}: reluformer-study --tune, tuned_presets.json)
    family_settings: Dict[str, dict] = field(default_factory=dict)


def split_family(spec: str, default_fusion: str = "concat") -> tuple:
    """'softmax' -> ('softmax', None); 'softmax+tm' -> ('softmax', default_fusion);
    'softmax+attention' -> ('softmax', 'attention')."""
    family, _, suffix = spec.partition("+")
    if not suffix:
        return family, None
    if suffix not in MEMORY_SUFFIXES:
        raise ValueError(f"--families: {spec!r}: expected FAMILY or FAMILY+{'|'.join(MEMORY_SUFFIXES)}")
    return family, default_fusion if suffix == "tm" else suffix


def uses_memory(o: "DemoOptions") -> bool:
    return any(split_family(f)[1] for f in o.families)
