"""``reluformer-translate``: translate whole documents with a trained checkpoint.

    reluformer-translate --checkpoint ckpt/checkpoint_best.pt < document.txt > out.txt
    reluformer-translate --checkpoint ckpt/checkpoint_best.pt -i talks.en --format docmt -o talks.de \\
        --beam 4 --scores talks.scores --alignments talks.align

The output keeps the input's layout with exactly one translated sentence per input sentence
(see :mod:`reluformer_mt.inference.inputs` for the formats); a summary (documents, sentences,
segments, fallbacks, time) goes to standard error.
"""
import argparse
import logging
import sys
import time
from pathlib import Path

from reluformer_mt.cli.checks import (EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, DefaultsHelpFormatter, add_spm_model_option,
                                     check_output_file, non_negative_float, non_negative_int, segment_tokens, writing,
                                     write_error)


# beyond this the bonus dwarfs every log-probability a model gives (search copies the memory), and
# near float32's range (1e300 is inf there) beam scores become inf - inf = NaN inside fairseq
MAX_PIECES_WEIGHT = 1e4


def pieces_weight(text) -> float:
    value = non_negative_float(text)
    if value > MAX_PIECES_WEIGHT:
        raise argparse.ArgumentTypeError(f"expected a number in [0, {MAX_PIECES_WEIGHT:g}], got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from reluformer_mt.inference.inputs import FORMATS

    p = argparse.ArgumentParser(
        prog="reluformer-translate", formatter_class=DefaultsHelpFormatter,
        description="Translate documents with a reluformer checkpoint: documents are cut into segments of the "
                    "trained length, translated with beam search and split back into exactly one sentence per "
                    "input sentence.")
    p.add_argument("--checkpoint", "-c", required=True, help="fairseq checkpoint (.pt)")
    p.add_argument("--input", "-i", default="-", help="input file, '-' = standard input (default)")
    p.add_argument("--output", "-o", default="-", help="output file, '-' = standard output (default)")
    p.add_argument("--format", "-f", choices=FORMATS, default="auto",
                   help="lines: a sentence per line, blank line between documents; docmt: '<d>' starts each document; "
                        "docids: a sentence per line plus --doc-ids; raw: paragraphs split into sentences (pysbd); "
                        "auto (default): docmt if the input starts with <d>, raw only if most lines (at least 3) are "
                        "paragraphs of 3+ sentences and 40+ words, lines otherwise; the summary says which")
    p.add_argument("--doc-ids", help="docids format: file with one document id per input line")
    p.add_argument("--language", help="language of the sentence splitter for raw input (default: the checkpoint's source language)")
    res = p.add_argument_group("resources (default: beside the checkpoint, then the data directory it was trained on)")
    res.add_argument("--data", help="directory prepared by reluformer-prepare (dictionaries, prepared.json, SentencePiece model)")
    add_spm_model_option(res, "the one prepared.json names")
    res.add_argument("--segment-tokens", type=segment_tokens, help="segment length in source tokens, or 'sentence' "
                                                                   "(default: the trained length from prepared.json)")
    gen = p.add_argument_group("search")
    gen.add_argument("--beam", type=int, default=4, help="beam size (4: the demo's decoding)")
    gen.add_argument("--lenpen", type=float, default=1.0, help="length penalty")
    gen.add_argument("--batch-size", type=int, default=32, help="most segments per batch")
    gen.add_argument("--max-tokens", type=int, default=4000, help="most source tokens per batch (padded)")
    gen.add_argument("--max-len-a", type=non_negative_float, default=1.2, help="output length limit a * source + b")
    gen.add_argument("--max-len-b", type=non_negative_int, default=10, help="see --max-len-a")
    gen.add_argument("--separators", choices=("constrained", "free"), default="constrained",
                     help="constrained (default): beam search gives each segment's translation exactly the "
                          "source's number of sentence separators (no empty sentence), so it splits back "
                          "without retranslation unless it reaches the length limit; free: plain beam search, "
                          "which shows how often the model keeps the separators by itself (the summary counts "
                          "the fallbacks)")
    gen.add_argument("--device", default="auto", help="auto (CUDA when available, else CPU), cpu, cuda or cuda:N")
    gen.add_argument("--threads", type=int, help="CPU threads of torch (default: torch's choice); on a busy shared "
                                                 "machine --threads 1 avoids threads spinning against each other")
    tm = p.add_argument_group("translation memory (matches read by checkpoints trained with --tm-fusion concat|attention; "
                              "translation pieces guide any checkpoint)")
    tm.add_argument("--memory", metavar="DIR|FILE.tmx|FILE.tsv",
                    help="the memory to retrieve matches from: a prepared directory (its training split), a TMX file "
                         "(languages from the checkpoint) or a 'source<TAB>target' TSV file "
                         "(default: the training split of the checkpoint's data directory); 'none' translates without "
                         "matches")
    tm.add_argument("--pieces-weight", type=pieces_weight, default=0.0, metavar="W",
                    help="translation pieces (Zhang et al. NAACL 2018): beam search adds W x the fuzzy score of the best "
                         "match holding each n-gram a next token completes (0: off, the default; the demo's tuned value: "
                         "docs/TRANSLATION_MEMORY.md); works for checkpoints trained without memory too")
    tm.add_argument("--pieces-k", type=int, default=8, metavar="K", help="matches per sentence whose n-grams are pieces")
    tm.add_argument("--pieces-max-n", type=int, default=4, metavar="N", help="longest piece, in SentencePiece tokens")
    out = p.add_argument_group("extra outputs (same layout as the output, one sentence per line)")
    out.add_argument("--scores", help="write each sentence's mean token log-probability here")
    out.add_argument("--memory-matches", metavar="FILE",
                     help="write each sentence's best memory match here: 'fuzzy score<TAB>entry id<TAB>entry target' "
                          "(what a translator checks first)")
    out.add_argument("--alignments", help="write each sentence's attention alignment here: 'i-j' pairs, 0-based "
                                          "source word i, target word j (words = SentencePiece words)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on standard error")
    p.add_argument("--quiet", "-q", action="store_true", help="no summary and warnings on standard error")
    return p


def _side_file(path, option):
    try:
        return open(path, "w", encoding="utf-8")
    except OSError as e:
        raise ValueError(f"{option} {path}: cannot write ({e.strerror})") from None


def check_paths(args) -> None:
    """Every file the run reads or writes is a different file (compared resolved, so './x' and a
    symlink to x are the same), and every output can be written -- before anything is written:
    a --scores equal to --output would overwrite the translation with scores."""
    for option, path in (("--scores", args.scores), ("--alignments", args.alignments),
                         ("--memory-matches", args.memory_matches)):
        if path == "-":
            raise ValueError(f"{option}: give a file; standard output holds the translation")
    if args.memory == "none":  # said before loading: these need the matches that 'none' withholds
        if args.memory_matches:
            raise ValueError("--memory-matches: --memory none withholds the matches; drop one of the two")
        if args.pieces_weight > 0:
            raise ValueError(f"--pieces-weight {args.pieces_weight:g}: translation pieces come from the memory, "
                             "which --memory none withholds; drop one of the two")
    memory_file = args.memory if args.memory and args.memory != "none" and Path(args.memory).is_file() else None
    files = [(o, p) for o, p in (("--checkpoint", args.checkpoint), ("--memory", memory_file),
                                 ("--input", args.input), ("--doc-ids", args.doc_ids), ("--output", args.output),
                                 ("--scores", args.scores), ("--alignments", args.alignments),
                                 ("--memory-matches", args.memory_matches)) if p and p != "-"]
    seen = {}
    for option, path in files:
        key = Path(path).resolve()
        if key in seen:
            raise ValueError(f"{option} {path}: the same file as {seen[key]}; give each input and output its own file")
        seen[key] = f"{option} {path}"
    for option, path in files:
        if option in ("--output", "--scores", "--alignments", "--memory-matches"):
            check_output_file(path, option)


def run(args) -> str:
    """Translate as ``args`` say; returns the summary."""
    from reluformer_mt.inference import DocumentTranslator, parse_input, read_text, write_output
    from reluformer_mt.inference.inputs import input_name, open_output

    start = time.time()
    check_paths(args)
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads: expected a positive number, got {args.threads}")
        import torch

        torch.set_num_threads(args.threads)
    lines = read_text(args.input)  # first: bad input fails before the model loads
    translator = DocumentTranslator(
        args.checkpoint, data=args.data, device=args.device, beam=args.beam, lenpen=args.lenpen,
        batch_size=args.batch_size, max_tokens=args.max_tokens, max_len_a=args.max_len_a, max_len_b=args.max_len_b,
        segment_tokens=args.segment_tokens, spm_model=args.spm_model, separators=args.separators, memory=args.memory,
        piece_weight=args.pieces_weight, piece_k=args.pieces_k, piece_max_n=args.pieces_max_n)
    if args.memory_matches and translator.memory is None:
        raise ValueError(f"--memory-matches: {args.checkpoint} was trained without a translation memory (--tm-fusion none); "
                         "with --pieces-weight W > 0 it consults one")
    if not args.quiet:
        print(f"reluformer-translate: {translator.describe()}", file=sys.stderr, flush=True)
    parsed = parse_input(lines, input_name(args.input), args.format, args.doc_ids,
                         args.language or translator.resources.src_lang)
    results = translator.translate([d.sentences for d in parsed.documents], scores=bool(args.scores),
                                   alignments=bool(args.alignments), progress=False if args.no_progress else None)
    stream = open_output(args.output)
    with writing("standard output" if stream is sys.stdout else args.output):
        try:
            write_output(parsed, [[r.text for r in doc] for doc in results], stream)
        finally:
            if stream is not sys.stdout:
                stream.close()
    # writing() outside the file: its close flushes, and a full disk fails there, naming this file
    if args.scores:
        with writing(args.scores), _side_file(args.scores, "--scores") as f:
            write_output(parsed, [["" if r.score is None else f"{r.score:.4f}" for r in doc] for doc in results], f, one_per_line=True)
    if args.alignments:
        with writing(args.alignments), _side_file(args.alignments, "--alignments") as f:
            write_output(parsed, [[" ".join(f"{i}-{j}" for i, j in (r.alignment or [])) for r in doc] for doc in results],
                         f, one_per_line=True)
    if args.memory_matches:
        def match_line(r):
            if r.match is None:
                return ""
            entry, score = r.match
            return f"{score:.3f}\t{entry}\t{translator.memory.target(entry)}"
        with writing(args.memory_matches), _side_file(args.memory_matches, "--memory-matches") as f:
            write_output(parsed, [[match_line(r) for r in doc] for doc in results], f, one_per_line=True)
    summary = translator.summary()
    fmt = parsed.fmt + (f" (detected: {parsed.detected}; --format chooses)" if parsed.detected else "")
    notes = "".join(f"\n  {note}" for note in parsed.notes)
    return f"{summary}\n  input format: {fmt}; total time with loading: {time.time() - start:.1f} s{notes}"


def main(argv=None) -> int:
    # force: importing fairseq (text_to_speech) already configured the root logger at INFO
    logging.basicConfig(format="reluformer-translate: %(levelname)s: %(message)s", level=logging.WARNING,
                        stream=sys.stderr, force=True)
    args = build_parser().parse_args(argv)
    if args.quiet:
        logging.getLogger().setLevel(logging.ERROR)
    from reluformer_mt.inference.translator import TranslationError
    from reluformer_mt.plugin import register

    register()  # the entry point registers the plugin; the checkpoint loader only loads
    try:
        summary = run(args)
    except (TranslationError, ValueError, FileNotFoundError) as e:
        print(f"reluformer-translate: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:  # a write outside the guarded ones (e.g. a full disk under a cache)
        print(f"reluformer-translate: error: {write_error(e, args.output)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("reluformer-translate: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    if not args.quiet:
        print(f"reluformer-translate: {summary}", file=sys.stderr, flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
