"""Binarise tokenised text with fairseq-preprocess, in-process (no subprocess, same Python)."""
import logging
from pathlib import Path
from typing import List


def preprocess_argv(src: str, tgt: str, text_dir, dest_dir, splits: List[str], src_dict, tgt_dict,
                    joined_dictionary: bool = False, workers: int = 1) -> List[str]:
    """The fairseq-preprocess command line for ``{text_dir}/{split}.{lang}`` files."""
    prefixes = {"train": "--trainpref", "valid": "--validpref", "test": "--testpref"}
    argv = ["--source-lang", src, "--target-lang", tgt, "--destdir", str(dest_dir),
            "--workers", str(max(1, workers)), "--dataset-impl", "mmap"]
    for split in splits:
        if split not in prefixes:
            raise ValueError(f"split {split!r}: fairseq-preprocess knows train, valid and test")
        argv += [prefixes[split], str(Path(text_dir) / split)]
    if joined_dictionary:
        argv += ["--joined-dictionary", "--srcdict", str(src_dict)]
    else:
        argv += ["--srcdict", str(src_dict), "--tgtdict", str(tgt_dict)]
    return argv


def _no_namespace_dump(record: logging.LogRecord) -> bool:
    return not (record.name == "fairseq_cli.preprocess" and record.getMessage().startswith("Namespace("))


def run_preprocess(argv: List[str]) -> None:
    """Parse ``argv`` with fairseq's preprocessing parser and run it."""
    from fairseq import options
    from fairseq_cli import preprocess

    parser = options.get_preprocessing_parser()
    args = parser.parse_args(argv)
    root = logging.getLogger()
    handlers = list(root.handlers)
    # fairseq-preprocess logs its whole Namespace(...) at INFO: kept out of the console (our summary
    # says what matters), still written to its log file
    consoles = [h for h in root.handlers if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
    for h in consoles:
        h.addFilter(_no_namespace_dump)
    try:
        preprocess.main(args)
    finally:
        for h in consoles:
            h.removeFilter(_no_namespace_dump)
        # fairseq-preprocess adds a file handler on the root logger (preprocess.log); drop it
        for h in list(root.handlers):
            if h not in handlers:
                root.removeHandler(h)
                h.close()
