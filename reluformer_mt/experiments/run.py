"""One description of a training run (issue 35): what the demo, the quality study, the FFN sweep
and the memory studies train, as one dataclass (:class:`TrainingRun`, its phases :class:`Phase`),
and the one function that spells it as fairseq-train arguments (:func:`train_args`). Their command
lines declare its options once (:func:`reluformer_mt.cli.run_options.add_run_options`).

A run is the model (an architecture, optionally resized), its data phases (sentence-level, then
document segments fine-tuned from the sentence-level weights), Adam with the inverse square root
schedule, a budget (updates per phase or wall-clock minutes), the seed, threads and device,
validation and checkpoints, and the memory options (translation-memory fusion and matches, the FFN
as a memory). Where the data lies and where the checkpoints go are given to :func:`train_args`.
"""
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

PACKAGE_DIR = Path(__file__).resolve().parents[1]
TM_POSITIONS = 1024  # positions of a concat model: the source followed by its matches
NO_LIMIT = 1_000_000  # fairseq reads --max-update 0 as "no limit"; a large number says it


@dataclass(frozen=True)
class Phase:
    """One fairseq-train call of a run. A phase after the first starts from the weights of the one
    before, with a fresh optimizer and schedule (G-Transformer's recipe, Bao et al. 2021)."""

    name: str = "document"  # its checkpoint folder and log
    level: str = "sentence"  # "sentence", or the document segments' length in subword tokens
    updates: int = 0  # 0: no limit but the run's budget_minutes
    lr: Optional[float] = None  # peak learning rate (None: the run's)
    max_tokens: Optional[int] = None  # tokens per batch (None: the run's)


@dataclass(frozen=True)
class TrainingRun:
    """One training run. The four dimensions are the same for encoder and decoder; None keeps the
    architecture's."""

    # model
    arch: str = "softmax_tiny"
    embed_dim: Optional[int] = None
    ffn_dim: Optional[int] = None
    layers: Optional[int] = None
    heads: Optional[int] = None
    # data: the phases in order, read by the package's document task (or fairseq's translation task
    # with ``langs``: word-level sentence pairs)
    phases: Tuple[Phase, ...] = (Phase(),)
    task: str = "document_translation"
    langs: Tuple[str, ...] = ()
    share_embeddings: bool = True
    # optimiser and schedule: Adam (0.9, 0.98), clip 1.0, inverse square root with warm-up
    lr: float = 5e-3
    warmup_updates: int = 200
    max_tokens: int = 4096
    dropout: float = 0.1
    label_smoothing: float = 0.1
    # budget (wall-clock minutes instead of, or with, each phase's updates), seed and machine
    budget_minutes: float = 0.0
    seed: int = 1
    threads: Optional[int] = None  # threads of the training process (None: the process's own)
    device: str = "cpu"  # "cpu" adds --cpu; otherwise fairseq's choice (CUDA when it is there)
    # validation and checkpoints: every validate_every updates, else `validations` times per phase
    validate_every: Optional[int] = None
    validations: int = 3
    eval_bleu: bool = True  # greedy s-BLEU / d-BLEU at each validation
    save_at_validation: bool = True  # a checkpoint at each validation
    only_at_intervals: bool = False  # none at epoch ends, and only the newest interval checkpoint kept
    log_interval: int = 20
    progress_bar: bool = True
    # memory: translation-memory fusion (None: none) and matches per sentence; the FFN as a memory
    tm_fusion: Optional[str] = None
    tm_k: int = 2
    ffn_variant: Optional[str] = None
    ffn_slots: Optional[int] = None
    # further fairseq-train options, last (so they override)
    extra: Tuple[str, ...] = ()

    @property
    def family(self) -> str:
        """The attention family of the package's architectures ({family}_{size})."""
        return self.arch.split("_")[0]

    def validation_interval(self, phase: Phase) -> int:
        return self.validate_every or max(1, phase.updates // max(1, self.validations))


def size_args(embed: int, ffn: int, layers: int, heads: int) -> List[str]:
    """The same width, FFN width, depth and heads for encoder and decoder."""
    args = []
    for side in ("encoder", "decoder"):
        args += [f"--{side}-embed-dim", str(embed), f"--{side}-ffn-embed-dim", str(ffn),
                 f"--{side}-layers", str(layers), f"--{side}-attention-heads", str(heads)]
    return args


def train_args(run: TrainingRun, phase: Phase, data: Path, save_dir: Path, log_file: Optional[Path] = None,
               positions: Optional[int] = None, init_from: Optional[Path] = None) -> List[str]:
    """The fairseq-train arguments of one phase of ``run``: ``data`` the phase's binarised folder,
    ``positions`` its longest segment (None: the architecture's), ``init_from`` the previous
    phase's checkpoint."""
    argv = [str(data), "--user-dir", str(PACKAGE_DIR), "--task", run.task]
    if run.langs:
        argv += ["--source-lang", run.langs[0], "--target-lang", run.langs[1]]
    argv += ["--arch", run.arch]
    if run.ffn_variant:
        argv += ["--ffn-variant", run.ffn_variant, "--ffn-slots", str(run.ffn_slots)]
    if run.share_embeddings:
        argv.append("--share-all-embeddings")
    argv += ["--dropout", str(run.dropout)]
    if positions is not None:
        if run.tm_fusion == "concat":
            positions = max(positions, TM_POSITIONS)
        argv += ["--max-source-positions", str(positions), "--max-target-positions", str(positions)]
    argv += ["--criterion", "reluformer_cross_entropy", "--label-smoothing", str(run.label_smoothing),
             "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "1.0",
             "--lr", str(phase.lr or run.lr), "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(run.warmup_updates),
             "--max-tokens", str(phase.max_tokens or run.max_tokens), "--seed", str(run.seed), "--num-workers", "0",
             "--save-dir", str(save_dir), "--no-epoch-checkpoints"]
    if run.eval_bleu:
        argv += ["--eval-bleu", "--eval-bleu-args", '{"beam": 1}']
    argv += ["--log-format", "json", "--log-interval", str(run.log_interval)]
    if log_file is not None:
        argv += ["--log-file", str(log_file)]
    if not run.progress_bar:
        argv.append("--no-progress-bar")
    if run.embed_dim is not None:
        argv += size_args(run.embed_dim, run.ffn_dim, run.layers, run.heads)
    interval = str(run.validation_interval(phase))
    if run.only_at_intervals:  # fairseq validates and saves at every epoch end by default as well
        argv += ["--validate-interval", str(NO_LIMIT), "--save-interval", str(NO_LIMIT)]
    argv += ["--validate-interval-updates", interval]
    if run.save_at_validation:
        argv += ["--save-interval-updates", interval]
    if run.only_at_intervals:
        argv += ["--keep-interval-updates", "1"]
    if run.budget_minutes:
        argv += ["--stop-time-hours", str(run.budget_minutes / 60)]
    argv += ["--max-update", str(phase.updates or NO_LIMIT)]
    if init_from is not None:
        argv += ["--finetune-from-model", str(init_from)]
    if run.device == "cpu":
        argv.append("--cpu")
    if run.tm_fusion:
        argv += ["--tm-fusion", run.tm_fusion, "--tm-k", str(run.tm_k)]
    return argv + list(run.extra)


__all__ = ["PACKAGE_DIR", "Phase", "TM_POSITIONS", "TrainingRun", "train_args"]
