"""The prepared data directory's description, ``prepared.json``: its one reader and writer.

``reluformer-prepare`` writes it (:meth:`Prepared.write`); the task, the translator, the
evaluation tools and the experiments read it (:meth:`Prepared.load`). It names the languages,
the separator, the segment length (None = sentence level), the SentencePiece model(s), the
positions a model needs and per-split counts. The JSON keeps the keys it always had
(``segment_tokens`` 0 for sentence level, ``spm_model`` for a joint model), so directories
prepared before this module load unchanged and older readers keep working.

Standard library only (SentencePiece is imported when :meth:`Prepared.sentencepiece` is called).
"""
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

from reluformer_mt.data.segments import SEPARATOR
from reluformer_mt.data.textfiles import read_json_object

PREPARED_NAME = "prepared.json"
SPM_MODEL_SYNTAX = "MODEL (joint) or SRC_MODEL,TGT_MODEL"


class PreparedError(ValueError):
    """``prepared.json`` is unreadable or lacks a field: a one-line message naming file and field."""


def parse_spm_models(value, option: str = "--spm-model") -> Tuple[str, ...]:
    """The one ``--spm-model`` syntax: ``MODEL`` (joint) or ``SRC_MODEL,TGT_MODEL`` -> a tuple of
    one or two paths; None or empty -> (). A list of one or two paths (the Python API, the old
    space-separated form) is accepted too."""
    if not value:
        return ()
    parts = str(value).split(",") if isinstance(value, (str, Path)) else [p for v in value for p in str(v).split(",")]
    paths = tuple(p.strip() for p in parts)
    if len(paths) not in (1, 2) or not all(paths):
        raise ValueError(f"{option}: expected {SPM_MODEL_SYNTAX}, got {','.join(paths)!r}")
    return paths


def load_sentencepiece(paths: Sequence[Path], separator: Optional[str] = None):
    """(source, target) SentencePiece processors of one or two model files (one object for a
    joint model); with ``separator``, each model must encode it as one piece."""
    from reluformer_mt.data.spm import load_spm

    paths = [Path(p) for p in paths]
    if len(paths) not in (1, 2):
        raise ValueError(f"--spm-model: expected {SPM_MODEL_SYNTAX}, got {len(paths)} paths")
    if separator is None:
        from reluformer_mt.data.spm import open_spm

        processors = [open_spm(p) for p in paths]
    else:
        processors = [load_spm(p, separator) for p in paths]
    return (processors[0], processors[-1])


@dataclass(frozen=True)
class SplitInfo:
    """Counts of one prepared split (``prepared.json`` ``splits.NAME``)."""
    documents: int
    sentences: int
    segments: int
    source_tokens: int = 0
    target_tokens: int = 0
    longest_source: int = 0
    longest_target: int = 0
    overlong_sentences: int = 0
    overlong_examples: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Prepared:
    """What ``reluformer-prepare`` wrote into ``directory``."""
    src_lang: str
    tgt_lang: str
    segment_tokens: Optional[int]               # None: sentence level (one sentence per example)
    spm_src: str                                # SentencePiece model file names, relative to ``directory``
    spm_tgt: str
    separator: str = SEPARATOR
    joined_dictionary: bool = False
    max_source_positions: Optional[int] = None  # longest example + 1 (</s>)
    max_target_positions: Optional[int] = None
    splits: Dict[str, SplitInfo] = field(default_factory=dict)
    format: str = ""
    extras: Tuple[str, ...] = ()                # other files written (e.g. the bible's gold links)
    report: Dict[str, Dict[str, int]] = field(default_factory=dict)  # counts, repaired, skipped, warnings
    options: Dict[str, object] = field(default_factory=dict)         # the PrepareConfig it was made with
    # the translation memory's neighbours (reluformer_mt.memory.neighbours): {} when none were computed
    memory: Dict[str, object] = field(default_factory=dict)
    created_by: str = "reluformer-prepare"
    directory: Optional[Path] = field(default=None, compare=False)

    @property
    def level(self) -> str:
        return "sentence" if self.segment_tokens is None else "document"

    @property
    def joint_spm(self) -> bool:
        return self.spm_src == self.spm_tgt

    @property
    def positions(self) -> int:
        """One position budget that fits both sides (what the demo and study train with)."""
        return max(self.max_source_positions or 0, self.max_target_positions or 0)

    def spm_paths(self) -> Tuple[Path, Path]:
        base = self.directory or Path(".")
        return base / self.spm_src, base / self.spm_tgt

    def sentencepiece(self, check_separator: bool = True):
        """The loaded (source, target) SentencePiece processors (one object for a joint model)."""
        src, tgt = self.spm_paths()
        return load_sentencepiece([src] if self.joint_spm else [src, tgt], self.separator if check_separator else None)

    # ------------------------------------------------------------ reading and writing

    @staticmethod
    def path(directory) -> Path:
        return Path(directory) / PREPARED_NAME

    @classmethod
    def exists(cls, directory) -> bool:
        return cls.path(directory).is_file()

    @classmethod
    def load(cls, directory) -> "Prepared":
        """Read ``directory/prepared.json``; one-line errors name the file and the field."""
        path = cls.path(directory)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: not found; prepare the directory with reluformer-prepare")
        return _from_json(read_json_object(path, PreparedError), path)

    @classmethod
    def load_if_present(cls, directory) -> Optional["Prepared"]:
        return cls.load(directory) if cls.exists(directory) else None

    def to_json(self) -> dict:
        """The JSON object, with the keys (and their order) prepared.json has always had."""
        return {
            "created_by": self.created_by,
            "format": self.format,
            "src_lang": self.src_lang,
            "tgt_lang": self.tgt_lang,
            "segment_tokens": self.segment_tokens or 0,
            "level": self.level,
            "separator": self.separator,
            "spm_model": self.spm_src if self.joint_spm else None,
            "spm_model_src": self.spm_src,
            "spm_model_tgt": self.spm_tgt,
            "joined_dictionary": self.joined_dictionary,
            "max_source_positions": self.max_source_positions,
            "max_target_positions": self.max_target_positions,
            "splits": {name: {f.name: (list(getattr(s, f.name)) if f.name == "overlong_examples" else getattr(s, f.name))
                              for f in fields(SplitInfo)} for name, s in self.splits.items()},
            "extras": list(self.extras),
            **{key: dict(self.report.get(key, {})) for key in REPORT_KEYS},
            "options": self.options,
            **({"memory": self.memory} if self.memory else {}),
        }

    def write(self, directory) -> Path:
        path = self.path(directory)
        # written whole, then renamed: a reader (another run preparing the same folder) never sees half a file
        from reluformer_mt.data.textfiles import write_text_atomically

        return write_text_atomically(path, json.dumps(self.to_json(), indent=1, ensure_ascii=False))


REPORT_KEYS = ("counts", "repaired", "skipped", "warnings")


# ---------------------------------------------------------------- validation of the JSON

def _field(data: dict, path: Path, key: str, kind, required: bool = True, default=None):
    if key not in data or data[key] is None:
        if required:
            raise PreparedError(f"{path}: field {key!r} is missing; re-prepare the directory with reluformer-prepare")
        return default
    value = data[key]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise PreparedError(f"{path}: field {key!r}: expected a positive integer, got {value!r}")
    if kind is not int and not isinstance(value, kind):
        raise PreparedError(f"{path}: field {key!r}: expected {getattr(kind, '__name__', kind)}, got {value!r}")
    if kind is str and required and not value:
        raise PreparedError(f"{path}: field {key!r}: expected a non-empty string")
    return value


def _segment_tokens(data: dict, path: Path) -> Optional[int]:
    """0 (what prepare writes for sentence level) and null -> None; a manifest without the field
    is sentence level only when its ``level`` says so."""
    if "segment_tokens" not in data:
        if data.get("level") == "sentence":
            return None
        raise PreparedError(f"{path}: field 'segment_tokens' is missing; re-prepare the directory with reluformer-prepare")
    value = data["segment_tokens"]
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value or None
    raise PreparedError(f"{path}: field 'segment_tokens': expected an integer >= 0 (0 = sentence level), got {value!r}")


def _spm_names(data: dict, path: Path) -> Tuple[str, str]:
    joint = _field(data, path, "spm_model", str, required=False)
    src = _field(data, path, "spm_model_src", str, required=False) or joint
    tgt = _field(data, path, "spm_model_tgt", str, required=False) or joint
    if not (src and tgt):
        raise PreparedError(f"{path}: field 'spm_model_src'/'spm_model_tgt' (or 'spm_model') is missing: "
                            "no SentencePiece model named; re-prepare the directory with reluformer-prepare")
    return src, tgt


def _splits(data: dict, path: Path) -> Dict[str, SplitInfo]:
    raw = _field(data, path, "splits", dict, required=False, default={})
    names = {f.name for f in fields(SplitInfo)}
    out = {}
    for split, counts in raw.items():
        where = f"splits.{split}"
        if not isinstance(counts, dict):
            raise PreparedError(f"{path}: field {where!r}: expected an object of counts, got {counts!r}")
        for key in ("documents", "sentences", "segments"):
            if not isinstance(counts.get(key), int):
                raise PreparedError(f"{path}: field '{where}.{key}': expected an integer, got {counts.get(key)!r}")
        known = {k: v for k, v in counts.items() if k in names}
        known["overlong_examples"] = tuple(known.get("overlong_examples", ()))
        out[split] = SplitInfo(**known)
    return out


def _from_json(data: dict, path: Path) -> Prepared:
    src_spm, tgt_spm = _spm_names(data, path)
    return Prepared(
        src_lang=_field(data, path, "src_lang", str),
        tgt_lang=_field(data, path, "tgt_lang", str),
        segment_tokens=_segment_tokens(data, path),
        spm_src=src_spm,
        spm_tgt=tgt_spm,
        separator=_field(data, path, "separator", str, required=False, default=SEPARATOR),
        joined_dictionary=_field(data, path, "joined_dictionary", bool, required=False, default=False),
        max_source_positions=_field(data, path, "max_source_positions", int, required=False),
        max_target_positions=_field(data, path, "max_target_positions", int, required=False),
        splits=_splits(data, path),
        format=_field(data, path, "format", str, required=False, default=""),
        extras=tuple(_field(data, path, "extras", list, required=False, default=[])),
        report={key: _field(data, path, key, dict, required=False, default={}) for key in REPORT_KEYS},
        options=_field(data, path, "options", dict, required=False, default={}),
        memory=_field(data, path, "memory", dict, required=False, default={}),
        created_by=_field(data, path, "created_by", str, required=False, default="reluformer-prepare"),
        directory=path.parent,
    )
