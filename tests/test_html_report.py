"""The demo's HTML report, built from a tiny real run, and opened in headless Chromium.

The browser is Debian's ``chromium`` with ``chromedriver`` (``scripts/install_browser.sh``, run by
``make test``), driven by selenium; without them the browser test is skipped, the others run.
"""
import base64
import json
import logging
import re
import shutil

import pytest
import torch

from reluformer_mt.evaluation.reports import markdown_table
from reluformer_mt.evaluation.significance import paired_bootstrap
from reluformer_mt.experiments.demo import TABLE_HEADERS
from reluformer_mt.experiments.report_page import SHADES, pack_links, pack_shades

from conftest import TINY_DEMO_FAMILIES

FAMILIES = list(TINY_DEMO_FAMILIES)  # the models of conftest.tiny_demo


@pytest.fixture(scope="module")
def report_dir(tiny_demo):
    """The report folder of conftest's tiny demo run (two models, 2 sentence + 4 document updates,
    one held-out chapter translated), shared with test_demo."""
    assert tiny_demo["code"] == 0
    return tiny_demo["out"] / "report"


def test_report_folder_has_plain_outputs_metrics_and_a_self_contained_page(report_dir):
    sentences = json.loads((report_dir / "sentences.json").read_text())
    verses = sum(len(c["verses"]) for c in sentences["chapters"])
    assert len(sentences["chapters"]) == 1 and verses > 5
    chapters = (report_dir / "test.chapters.txt").read_text().splitlines()
    assert len(chapters) == verses == len((report_dir / "test.ref.en.txt").read_text().splitlines())
    for family in FAMILIES:
        for mode in ("constrained", "free"):
            assert len((report_dir / f"test_{family}.{mode}.txt").read_text(encoding="utf-8").splitlines()) == verses
        free = json.loads((report_dir / f"test_{family}.free.hyp.json").read_text())
        assert list(free) == [sentences["chapters"][0]["id"]]

    table = (report_dir / "table.md").read_text(encoding="utf-8")
    header = next(line for line in table.splitlines() if line.startswith("| model |"))
    assert "| s-BLEU |" in header and header.count("|") == len(TABLE_HEADERS) + 1
    assert "|:---|---:|" in table and "```text" in table and table.count("```") == 2
    assert "| baseline: diagonal alignment |" in table

    metrics = json.loads((report_dir / "metrics.json").read_text())
    boot = metrics["bootstrap"]
    assert boot["baseline"] == "softmax (constrained)" and boot["n_samples"] == 1000
    # every decoding mode of every family (demo_translate.MODES; without-memory for memory families only)
    modes = ("constrained", "free", "sentence", "pieces", "knn", "knn-memory", "knn+pieces")
    expected = {f"{f} ({m})" for f in FAMILIES for m in modes} | {f"{f} (without-memory)" for f in FAMILIES if "+" in f}
    tm_first = {name for name in metrics["systems"] if name.endswith("(tm-first)")}  # where its threshold won
    assert set(metrics["systems"]) - tm_first == expected | {"nearest training verse"}
    nearest = metrics["systems"]["nearest training verse"]
    assert len(nearest["sentence_chrf"]) == verses and nearest["bleu"] > 5 and 0 < nearest["ter"]
    assert boot["systems"]["nearest training verse"]["BLEU"]["significant"] is True  # copies beat 6 updates
    assert "Moses detokeniser" in metrics["definition"]

    alignments = json.loads((report_dir / "alignments.json").read_text())
    assert set(alignments["models"]) == set(FAMILIES) and alignments["models"]["softmax"]["layers"] == 2
    eflomal = json.loads((report_dir / "aligners.json").read_text())["eflomal"]
    diagonal = json.loads((report_dir / "report.json").read_text())["baselines"]["diagonal"]["aer"]
    assert eflomal["aer"] < diagonal - 0.2, "a statistical aligner beats the diagonal by far (0.36 against 0.77)"
    assert "Statistical aligner for AER: eflomal" in table

    page = (report_dir / "index.html").read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page), "the page loads nothing from the network"
    assert page.count('src="data:image/png;base64,') == len(list(report_dir.glob("*.png"))) == 4
    assert "softmax (constrained)" in page and 'id="results-table"' in page


def test_plain_files_rescore_with_reluformer_eval_and_pages_from_the_command_line(report_dir, tmp_path, capsys):
    """The plain hypothesis files give metrics.json's numbers through ``reluformer-eval bleu
    --detokenize moses``, which also writes an HTML page; ``reluformer-eval report`` rebuilds index.html."""
    from reluformer_mt.cli.eval import main

    page = tmp_path / "bleu.html"
    assert main(["bleu", "--hyp", str(report_dir / "test_reluformer.constrained.txt"), "--hyp-doc-ids",
                 str(report_dir / "test.chapters.txt"), "--ref", str(report_dir / "test.ref.en.txt"), "--ref-doc-ids",
                 str(report_dir / "test.chapters.txt"), "--detokenize", "moses", "-m", "bleu", "chrf", "chrf++", "ter",
                 "-w", "2", "--html", str(page)]) == 0  # -w 2: the tables' decimals (sacreBLEU's default is 1)
    printed = capsys.readouterr().out
    metrics = json.loads((report_dir / "metrics.json").read_text())["systems"]["reluformer (constrained)"]
    shown = float(re.search(r"^s-chrF\s+([\d.]+)", printed, re.M).group(1))
    assert shown == pytest.approx(metrics["chrf"], abs=0.01) and "s-TER" in printed
    text = page.read_text(encoding="utf-8")
    assert 'id="results-table"' in text and "s-chrF++" in text and "chrF2++|" in text and "Moses" in text

    rebuilt = tmp_path / "again.html"
    assert main(["report", "--dir", str(report_dir), "--output", str(rebuilt)]) == 0
    assert rebuilt.read_text(encoding="utf-8") == (report_dir / "index.html").read_text(encoding="utf-8")
    assert main(["report", "--dir", str(tmp_path / "missing")]) == 2  # an input error: exit 2
    assert "no such report folder" in capsys.readouterr().err


def test_shades_and_links_pack_like_the_viewer_reads_them():
    words = torch.tensor([[[0.0, 0.5, 1.0], [0.2, 0.0, 0.0]], [[2.0, 0.0, 0.01], [0.0, 0.0, 0.0]]])
    raw = base64.b64decode(pack_shades(words))
    shades = [v for b in raw for v in (b >> 4, b & 15)][:words.numel()]
    assert shades == [0, 8, SHADES, 3, 0, 0, SHADES, 0, 1, 0, 0, 0]  # exact zeros stay 0, small weights 1
    assert list(base64.b64decode(pack_links([{(2, 0), (0, 1)}, {(0, 0)}], 2))) == [3, 1, 1, 0]


def test_paired_bootstrap_tells_a_real_difference_from_none():
    refs = [f"the {w} went to the city and saw the {w} there ." for w in
            ["man", "woman", "child", "king", "servant", "priest", "crowd", "disciple", "fisher", "farmer"]] * 4
    good = [r.replace(" there", "") for r in refs]
    bad = [" ".join(r.split()[::2]) for r in refs]
    result = paired_bootstrap({"base": good, "same": list(good), "bad": bad}, refs, "base", n_samples=200)
    assert result["systems"]["base"]["BLEU"]["significant"] is None
    assert result["systems"]["same"]["BLEU"]["significant"] is False  # sacreBLEU alone says p = 1/201 here
    assert result["systems"]["same"]["BLEU"]["p_value"] == 1.0
    assert result["systems"]["bad"]["BLEU"]["significant"] is True
    assert result["systems"]["bad"]["chrF"]["score"] < result["systems"]["base"]["chrF"]["score"]
    with pytest.raises(ValueError, match="baseline 'x'"):
        paired_bootstrap({"a": good}, refs, "x")


def test_grow_diag_final_and():
    from reluformer_mt.evaluation.statistical_aligner import grow_diag_final_and

    forward = {(0, 0), (1, 1), (2, 1), (5, 0), (4, 4)}
    reverse = {(0, 0), (1, 1), (1, 2)}
    # the intersection, the union's neighbours that align a new word, then (4, 4) whose words are
    # both unaligned; (5, 0) is no neighbour and target word 0 is aligned already
    assert grow_diag_final_and(forward, reverse) == {(0, 0), (1, 1), (2, 1), (1, 2), (4, 4)}


def test_markdown_table_escapes_pipes_and_right_aligns_numbers():
    assert markdown_table(["model", "BLEU"], [["a|b", 1.234], ["c", float("nan")]]).splitlines() == [
        "| model | BLEU |", "|:---|---:|", "| a\\|b | 1.23 |", "| c | n/a |"]


def test_the_results_carry_the_readmes_columns(tmp_path):
    """The page's Results hold the README's table of the run (pieces, kNN-MT, TM-first, the chosen
    mode in bold), from the run's summary.json: the README's run, rendered as a page."""
    from reluformer_mt.evaluation.html_report import build_page
    from reluformer_mt.evaluation.reports import write_json
    from reluformer_mt.experiments.readme_table import SUMMARY_COPY, render

    summary = json.loads(SUMMARY_COPY.read_text(encoding="utf-8"))
    write_json(tmp_path / "summary.json", summary)
    write_json(tmp_path / "table.json", {"headers": TABLE_HEADERS, "rows": [], "notes": []})
    page = build_page(tmp_path)
    start = page.index('<h2 id="results">')
    end = page.find("<h2", start + 1)
    results = page[start:end if end > 0 else len(page)]
    readme = [line.strip("| ").split(" | ") for line in render(summary).splitlines()]
    for label in ("+ pieces", "+ kNN-MT", "+ kNN-MT (per-input)", "TM-first (best mode)"):
        assert label in readme[0] and f"<th>{label}</th>" in results
    for row in readme[2:]:  # every cell of every row, bold where the README's is
        cells = [f"<b>{c.strip('*')}</b>" if c.startswith("**") else c.replace("&", "&amp;") for c in row]
        assert "".join(f"<td>{c}</td>" for c in cells) in results.replace("&#x27;", "'"), row


# ---------------------------------------------------------------------------------------------- browser

def browser():
    """Headless Debian chromium through its chromedriver; skips when either is missing."""
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    for name in ("selenium", "urllib3"):  # fairseq leaves the root logger at DEBUG: every request would be logged
        logging.getLogger(name).setLevel(logging.WARNING)

    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not binary or not driver:
        pytest.skip("chromium / chromedriver not installed (scripts/install_browser.sh installs them)")
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1100"):
        options.add_argument(arg)
    options.binary_location = binary
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=options)


def rows_text(driver):
    return [r.text for r in driver.find_elements("css selector", "#sentence-rows tr[data-idx] td.num")]


def test_page_renders_and_reacts_in_headless_chromium(report_dir, tmp_path):
    from selenium.webdriver.support.ui import Select

    driver = browser()
    try:
        driver.get((report_dir / "index.html").as_uri())
        assert driver.execute_script("return document.body.dataset.ready") == "1", "the page's script did not finish"
        # tables
        results = driver.find_elements("css selector", "#results-table tbody tr")
        assert len(results) >= len(FAMILIES) + 2 and results[0].text.startswith("softmax")
        # one row per system of metrics.json: every family in every decoding mode, and the nearest verse
        systems = json.loads((report_dir / "metrics.json").read_text())["systems"]
        assert len(driver.find_elements("css selector", "#metrics-table tbody tr")) == len(systems) > 2 * len(FAMILIES)
        # every image decoded and drawn
        images = driver.execute_script("return [...document.images].map(i => [i.alt, i.complete, i.naturalWidth])")
        assert len(images) == 4 and all(done and width > 100 for _, done, width in images), images
        # the per-sentence view: one row per verse under its chapter heading
        sentences = json.loads((report_dir / "sentences.json").read_text())
        verses = sum(len(c["verses"]) for c in sentences["chapters"])
        assert len(rows_text(driver)) == verses
        assert len(driver.find_elements("css selector", "#sentence-rows tr.chapter")) == 1
        first_in_order = rows_text(driver)[0]
        assert first_in_order.startswith(f"{sentences['chapters'][0]['id']}:1")

        # click: sort by the nearest verse's chrF, highest first
        chrf = json.loads((report_dir / "metrics.json").read_text())["systems"]["nearest training verse"]["sentence_chrf"]
        Select(driver.find_element("id", "sort-key")).select_by_value("chrf:nearest training verse")
        shown = [int(r.get_attribute("data-idx")) for r in driver.find_elements("css selector", "#sentence-rows tr[data-idx]")]
        assert [chrf[i] for i in shown] == sorted(chrf, reverse=True)
        assert not driver.find_elements("css selector", "#sentence-rows tr.chapter"), "sorted: no chapter headings"
        # by the difference between two systems, lowest first
        Select(driver.find_element("id", "sort-key")).select_by_value("diff")
        Select(driver.find_element("id", "diff-a")).select_by_value("softmax (constrained)")
        Select(driver.find_element("id", "diff-b")).select_by_value("nearest training verse")
        Select(driver.find_element("id", "sort-dir")).select_by_value("asc")
        metrics = json.loads((report_dir / "metrics.json").read_text())["systems"]
        diff = [a - b for a, b in zip(metrics["softmax (constrained)"]["sentence_chrf"], chrf)]
        shown = [int(r.get_attribute("data-idx")) for r in driver.find_elements("css selector", "#sentence-rows tr[data-idx]")]
        assert [diff[i] for i in shown] == sorted(diff)

        # the alignment viewer: change head, layer, model and mode; the heatmap follows
        alignments = json.loads((report_dir / "alignments.json").read_text())
        verse = alignments["verses"][0]
        cells = driver.find_elements("css selector", "#al-heatmap rect.cell")
        assert len(cells) == len(verse["src"]) * len(verse["tgt"])
        assert len(driver.find_elements("css selector", "#al-heatmap rect.gold-sure")) == len(verse["sure"])
        assert driver.find_element("id", "al-title").text == "softmax, layer 2, head average, normal"
        before = driver.find_element("id", "al-heatmap").get_attribute("innerHTML")
        Select(driver.find_element("id", "al-head")).select_by_visible_text("head 2")
        Select(driver.find_element("id", "al-layer")).select_by_visible_text("layer 1")
        Select(driver.find_element("id", "al-model")).select_by_value("reluformer")
        Select(driver.find_element("id", "al-mode")).select_by_value("shifted")
        assert driver.find_element("id", "al-title").text == "reluformer, layer 1, head 2, shifted"
        assert driver.find_element("id", "al-heatmap").get_attribute("innerHTML") != before
        expected = alignments["models"]["reluformer"]["corpus_aer"]["shifted"]["per_head"][0][1]
        assert driver.find_element("id", "al-corpus-aer").text == f"{expected:.3f}"
        assert 0 <= float(driver.find_element("id", "al-aer").text) <= 1
        driver.find_element("id", "al-next").click()
        assert driver.find_element("id", "al-verse").get_attribute("value") == "1"
        # the per-sentence view's "align" button opens its verse in the viewer
        Select(driver.find_element("id", "sort-key")).select_by_value("doc")
        button = driver.find_elements("css selector", "#sentence-rows button[data-align]")[2]
        target = button.get_attribute("data-align")
        button.click()
        assert driver.find_element("id", "al-verse").get_attribute("value") == target != "1"

        errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
        assert not errors, errors
        driver.execute_script("window.scrollTo(0, 0)")
        shot = tmp_path / "report.png"
        driver.save_screenshot(str(shot))
        driver.find_element("id", "alignments").location_once_scrolled_into_view
        driver.save_screenshot(str(tmp_path / "report_alignments.png"))
        assert shot.stat().st_size > 20000
        print(f"screenshots: {shot}, {tmp_path / 'report_alignments.png'}")
    finally:
        driver.quit()
