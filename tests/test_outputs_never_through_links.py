"""Outputs are never written through a symbolic link: a file a command writes whole (reports,
pages, arrays, neighbours) replaces a link in its place, and the file the link pointed to (here a
checkpoint's copy) is left as it was. Before, the write followed the link onto its target."""
import shutil

from test_hardening_loading import demo_run, good_summary, seeds_main


def test_a_whole_file_write_replaces_a_link_and_leaves_its_target(doc_checkpoint, tmp_path):
    from reluformer_mt.data.textfiles import write_text_atomically

    copy = tmp_path / "copy.pt"
    shutil.copy(doc_checkpoint, copy)
    link = tmp_path / "report.json"
    link.symlink_to(copy)
    write_text_atomically(link, "{}\n")
    assert not link.is_symlink() and link.read_text(encoding="utf-8") == "{}\n"
    assert copy.read_bytes() == doc_checkpoint.read_bytes()


def test_the_seed_report_leaves_a_checkpoint_its_output_folder_links_to(doc_checkpoint, tmp_path, capsys):
    copy = tmp_path / "copy.pt"
    shutil.copy(doc_checkpoint, copy)
    out = tmp_path / "report"
    out.mkdir()
    (out / "seeds.md").symlink_to(copy)
    runs = [demo_run(tmp_path / "a", 1, good_summary()), demo_run(tmp_path / "b", 2, good_summary(5.5))]
    code, err = seeds_main([*runs, "--report-dir", out], capsys)
    assert code == 0, err
    assert copy.read_bytes() == doc_checkpoint.read_bytes()
    assert not (out / "seeds.md").is_symlink() and "seed" in (out / "seeds.md").read_text(encoding="utf-8")
