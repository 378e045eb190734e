"""One self-contained HTML page per report folder: ``index.html`` beside what the run wrote.

It opens from the file system (no server, no network, no library: vanilla JavaScript, images
embedded as base64) and shows what it finds in the folder, each part only when its file is there:

- ``table.json`` (else ``report.json``'s fixed-width ``table``): the comparison table with the
  baselines, the reference run's rows and the papers' points of comparison;
- ``metrics.json``: BLEU, chrF, chrF++, TER on detokenised text with 95 % intervals and which
  differences to the softmax row are significant (sacreBLEU's paired bootstrap);
- every ``*.png``: the plots;
- ``sentences.json`` with ``metrics.json``'s per-verse chrF: the held-out chapters verse by verse
  (source, reference, the nearest training verse's copy, every model's constrained and free output),
  sortable by a system's chrF or by the difference between two systems;
- ``alignments.json``: the alignment viewer (word-level cross-attention of a model, layer and head
  as a heatmap, the gold sure/possible links and the extracted links over it, its AER beside it).

``reluformer_mt.experiments.report_page`` writes these files for the demo; ``reluformer-eval
report --dir FOLDER`` (re)builds the page of any report folder, ``reluformer-eval SUBCOMMAND
--html PAGE`` writes a page for one evaluation.
"""
import base64
import html
import json
import math
from pathlib import Path
from typing import Any, List, Optional, Sequence

from reluformer_mt.data.textfiles import write_text_atomically
from reluformer_mt.evaluation.mode_table import mode_table
from reluformer_mt.evaluation.significance import verdict

PLOT_CAPTIONS = {
    "learning_curves.png": "Learning curves: training and validation loss, and greedy validation s-BLEU, against "
                           "updates (left: what each model learns per step) and against minutes (right: what it "
                           "learns per unit of time). Dotted lines: where the document phase begins.",
    "aer_per_layer.png": "AER of cross-attention per decoder layer (lower is better), best head and head average, "
                         "normal and shifted; the dashed line is the diagonal baseline that attention must go below "
                         "before it can be said to align.",
    "sparsity_per_layer.png": "Share of exact zeros among the attention weights per layer, a panel per kind of "
                              "attention (softmax is 0 everywhere by construction).",
    "attention_heatmaps.png": "Word-level cross-attention of one held-out verse (the best layer's head average); "
                              "squares: gold sure links, circles: possible links. The alignment viewer below shows "
                              "any verse, layer and head.",
}

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d2430;background:#fafbfc;margin:0}
main{max-width:1280px;margin:0 auto;padding:8px 24px 48px}
header{background:#fff;border-bottom:1px solid #dde2e8;padding:12px 24px}
header h1{font-size:20px;margin:0 0 4px}
nav a{margin-right:14px;color:#2357a0;text-decoration:none}
h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde2e8;padding-bottom:4px}
.meta{color:#5a6472;font-size:12.5px}
table.data{border-collapse:collapse;background:#fff;font-size:13px;margin:6px 0}
table.data th,table.data td{border:1px solid #dde2e8;padding:3px 7px;text-align:right;vertical-align:top}
table.data th{background:#eef1f5;position:sticky;top:0}
table.data td:first-child,table.data th:first-child{text-align:left}
tr.baseline td{background:#fbf7ec}
tr.reference td{color:#5a6472;background:#f6f7f9}
.better{color:#1a7f37;font-weight:600}.worse{color:#c0392b;font-weight:600}.same{color:#5a6472}
.scroll{overflow-x:auto}
figure{background:#fff;border:1px solid #dde2e8;margin:10px 0;padding:8px}
figure img{max-width:100%;height:auto;display:block}
figcaption{color:#5a6472;font-size:12.5px;margin-top:4px}
.controls{display:flex;flex-wrap:wrap;gap:10px;align-items:center;margin:6px 0 8px;background:#fff;
 border:1px solid #dde2e8;padding:6px 10px}
.controls label{font-size:12.5px;color:#3b4452}
select,button{font:inherit;font-size:13px}
#sentences td{text-align:left;max-width:420px;overflow-wrap:anywhere}
#sentences td.num{white-space:nowrap;color:#5a6472}
#sentences th{text-align:left}
.cut{color:#5a6472;font-size:12px}
#sentences tr.chapter th{background:#e4ebf5;text-align:left}
.hyp{margin:1px 0}.sys{display:inline-block;min-width:170px;color:#3b4452;font-size:12px}
.score{display:inline-block;min-width:52px;font-variant-numeric:tabular-nums;font-size:12px;color:#2357a0}
.src{color:#5a2a82}.ref{color:#1d2430;font-weight:500}
.aligner{display:flex;gap:18px;align-items:flex-start;flex-wrap:wrap}
#al-heatmap{background:#fff;border:1px solid #dde2e8;padding:6px;overflow:auto;max-width:900px}
#al-stats{background:#fff;border:1px solid #dde2e8;padding:8px 12px;min-width:250px}
#al-stats td{padding:1px 8px 1px 0}
.legend span{display:inline-block;margin-right:12px}
pre{background:#fff;border:1px solid #dde2e8;padding:8px;overflow-x:auto;font-size:12px}
details{margin:6px 0}
button.link{background:none;border:none;color:#2357a0;cursor:pointer;padding:0;text-decoration:underline}
"""

SCRIPT = r"""
"use strict";
const DATA = JSON.parse(document.getElementById("report-data").textContent);
const $ = (id) => document.getElementById(id);
const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]));
function option(select, value, text) {
  const o = document.createElement("option"); o.value = value; o.textContent = text; select.appendChild(o);
}
function bytesOf(b64) {
  const raw = atob(b64); const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out;
}

// ------------------------------------------------------------------ per-sentence view
function setupSentences() {
  const S = DATA.sentences, M = DATA.metrics;
  if (!S || !M) return;
  const systems = [];
  const first = S.chapters[0].verses[0].hyp;  // a mode a model was not decoded with is left out
  for (const model of S.models) for (const mode of S.modes) if (first[model][mode] !== undefined) systems.push([model, mode, model + " (" + mode + ")"]);
  const nearest = DATA.nearest_name;
  const rows = [];
  S.chapters.forEach((ch) => ch.verses.forEach((v, k) => rows.push({chapter: ch.id, verse: k + 1, idx: rows.length, v: v})));
  const chrf = (name, idx) => (M.systems[name] ? M.systems[name].sentence_chrf[idx] : null);
  const key = $("sort-key"), a = $("diff-a"), b = $("diff-b"), dir = $("sort-dir");
  option(key, "doc", "document order");
  const names = systems.map((s) => s[2]).concat([nearest]);
  for (const n of names) option(key, "chrf:" + n, "chrF of " + n);
  option(key, "diff", "difference: chrF of A \u2212 chrF of B");
  for (const n of names) { option(a, n, n); option(b, n, n); }
  if (names.length > 1) b.value = names.find((n) => n.startsWith(S.models[S.models.length > 1 ? 1 : 0])) || names[1];
  a.value = names[0];
  const fmt = (x) => (x === null || x === undefined ? "n/a" : x.toFixed(1));
  // a model output over twice the reference's length (repeating itself up to the length limit)
  // is cut for the eye; the whole text is its tooltip
  const text = (t, ref) => {
    const most = 2 * ref.length + 40;
    return t.length <= most ? esc(t) : '<span title="' + esc(t) + '">' + esc(t.slice(0, most)) +
      '</span><span class="cut"> \u2026 (' + t.length + " characters)</span>";
  };
  const alignIndex = {};
  if (DATA.alignments) DATA.alignments.verses.forEach((v, i) => { alignIndex[v.chapter + ":" + v.verse] = i; });

  function render() {
    const k = key.value;
    let order = rows.slice();
    let value = null;
    if (k.startsWith("chrf:")) value = (r) => chrf(k.slice(5), r.idx);
    if (k === "diff") value = (r) => chrf(a.value, r.idx) - chrf(b.value, r.idx);
    if (value) {
      const sign = dir.value === "desc" ? -1 : 1;
      order.sort((x, y) => sign * (value(x) - value(y)) || x.idx - y.idx);
    }
    $("diff-controls").style.display = k === "diff" ? "" : "none";
    const out = [];
    let last = null;
    for (const r of order) {
      if (!value && r.chapter !== last) {
        out.push('<tr class="chapter"><th colspan="4">chapter ' + esc(r.chapter) + "</th></tr>");
        last = r.chapter;
      }
      const lines = systems.map(([model, mode, name]) =>
        '<div class="hyp"><span class="sys">' + esc(name) + '</span><span class="score">' + fmt(chrf(name, r.idx)) +
        "</span>" + text(r.v.hyp[model][mode], r.v.ref) + "</div>");
      lines.push('<div class="hyp"><span class="sys">' + esc(nearest) + '</span><span class="score">' +
                 fmt(chrf(nearest, r.idx)) + "</span>" + esc(r.v.nearest) + "</div>");
      const where = r.chapter + ":" + r.verse;
      const align = where in alignIndex ? ' <button class="link" data-align="' + alignIndex[where] + '">align</button>' : "";
      const diff = value ? '<br><span class="score">' + fmt(value(r)) + "</span>" : "";
      out.push('<tr data-idx="' + r.idx + '"><td class="num">' + esc(where) + align + diff + '</td><td class="src">' +
               esc(r.v.src) + '</td><td class="ref">' + esc(r.v.ref) + "</td><td>" + lines.join("") + "</td></tr>");
    }
    $("sentence-rows").innerHTML = out.join("");
    $("sentence-count").textContent = rows.length + " verses" + (value ? ", sorted" : ", in document order");
  }
  [key, a, b, dir].forEach((el) => el.addEventListener("change", render));
  $("sentence-rows").addEventListener("click", (e) => {
    const t = e.target.closest("button[data-align]");
    if (!t) return;
    $("al-verse").value = t.dataset.align; drawAlignment(); $("alignments").scrollIntoView();
  });
  render();
}

// ------------------------------------------------------------------ alignment viewer
let drawAlignment = () => {};
function setupAlignments() {
  const A = DATA.alignments;
  if (!A || !A.verses.length) return;
  const verse = $("al-verse"), model = $("al-model"), layer = $("al-layer"), head = $("al-head"), mode = $("al-mode");
  A.verses.forEach((v, i) => option(verse, i, "chapter " + v.chapter + ", verse " + v.verse + " (" + v.tgt.length + " words)"));
  Object.keys(A.models).forEach((m) => option(model, m, m));
  A.modes.forEach((m) => option(mode, m, m));
  function fillLayers() {
    const info = A.models[model.value], keepL = layer.value, keepH = head.value;
    layer.innerHTML = ""; head.innerHTML = "";
    for (let l = 0; l < info.layers; l++) option(layer, l, "layer " + (l + 1));
    for (let h = 0; h < info.heads; h++) option(head, h, "head " + (h + 1));
    option(head, info.heads, "head average");
    layer.value = keepL && keepL < info.layers ? keepL : info.layers - 1;
    head.value = keepH && keepH <= info.heads ? keepH : info.heads;
  }
  drawAlignment = function () {
    const v = A.verses[+verse.value], info = A.models[model.value];
    const L = info.layers, H = info.heads + 1, T = v.tgt.length, S = v.src.length;
    const m = (A.modes.indexOf(mode.value) * L + +layer.value) * H + +head.value;
    const data = v.models[model.value];
    const shades = bytesOf(data.shades), links = bytesOf(data.links);
    const cell = 20, left = 8 + 7 * Math.max(...v.tgt.map((w) => w.length)), top = 10 + 6 * Math.max(...v.src.map((w) => w.length));
    const parts = ['<svg xmlns="http://www.w3.org/2000/svg" width="' + (left + S * cell + 10) + '" height="' + (top + T * cell + 10) + '">'];
    for (let j = 0; j < T; j++) {
      parts.push('<text x="' + (left - 4) + '" y="' + (top + j * cell + 14) + '" text-anchor="end" font-size="11">' + esc(v.tgt[j]) + "</text>");
      for (let i = 0; i < S; i++) {
        const c = (m * T + j) * S + i, byte = shades[c >> 1], s = c & 1 ? byte & 15 : byte >> 4;
        const fill = s ? "rgba(8,69,148," + (0.08 + 0.92 * s / A.shades).toFixed(3) + ")" : "#fff";
        parts.push('<rect class="cell" x="' + (left + i * cell) + '" y="' + (top + j * cell) + '" width="' + cell + '" height="' + cell +
                   '" fill="' + fill + '" stroke="#e3e7ec"><title>' + esc(v.tgt[j] + " \u2190 " + v.src[i]) + " shade " + s + "/" + A.shades + "</title></rect>");
      }
    }
    for (let i = 0; i < S; i++) {
      const x = left + i * cell + 14;
      parts.push('<text x="' + x + '" y="' + (top - 4) + '" font-size="11" transform="rotate(-60 ' + x + " " + (top - 4) + ')">' + esc(v.src[i]) + "</text>");
    }
    const sure = new Set(v.sure.map(([i, j]) => i + "-" + j)), possible = new Set(v.possible.map(([i, j]) => i + "-" + j));
    for (const [i, j] of v.sure) parts.push('<rect class="gold-sure" x="' + (left + i * cell + 2) + '" y="' + (top + j * cell + 2) + '" width="' + (cell - 4) + '" height="' + (cell - 4) + '" fill="none" stroke="#000" stroke-width="1.6"/>');
    for (const [i, j] of v.possible) parts.push('<circle class="gold-possible" cx="' + (left + i * cell + cell / 2) + '" cy="' + (top + j * cell + cell / 2) + '" r="7" fill="none" stroke="#777" stroke-width="1.4" stroke-dasharray="2 2"/>');
    let nA = 0, aS = 0, aP = 0;
    for (let j = 0; j < T; j++) {
      const i = links[m * T + j] - 1;
      if (i < 0) continue;
      nA++;
      const k = i + "-" + j;
      if (sure.has(k)) aS++;
      if (sure.has(k) || possible.has(k)) aP++;
      parts.push('<circle class="link" cx="' + (left + i * cell + cell / 2) + '" cy="' + (top + j * cell + cell / 2) + '" r="3.2" fill="#e8590c"/>');
    }
    parts.push("</svg>");
    $("al-heatmap").innerHTML = parts.join("");
    const nS = v.sure.length, nP = nS + v.possible.length;
    const aer = nA + nS ? 1 - (aS + aP) / (nA + nS) : NaN;
    const corpus = info.corpus_aer[mode.value];
    const h = +head.value, l = +layer.value;
    const c = !corpus ? null : h < info.heads ? (corpus.per_head ? corpus.per_head[l][h] : null) : (corpus.head_average ? corpus.head_average[l] : null);
    const f = (x) => (x === null || x === undefined || isNaN(x) ? "n/a" : x.toFixed(3));
    $("al-title").textContent = model.value + ", layer " + (l + 1) + ", " + (h < info.heads ? "head " + (h + 1) : "head average") + ", " + mode.value;
    $("al-stats-body").innerHTML = [
      ["links", "links extracted |A|", nA], ["sure", "gold sure |S|", nS], ["possible", "gold possible |P| (incl. sure)", nP],
      ["precision", "precision |A\u2229P|/|A|", f(nA ? aP / nA : NaN)], ["recall", "recall |A\u2229S|/|S|", f(nS ? aS / nS : NaN)],
      ["aer", "AER of this verse", f(aer)], ["corpus-aer", "AER of this setting, all test verses", f(c)],
      ["diagonal", "diagonal baseline, all test verses", f(DATA.diagonal_aer)],
      ["eflomal", "eflomal (statistical aligner), all test verses", f(DATA.eflomal_aer)]]
      .map(([id, k, x]) => "<tr><td>" + k + '</td><td id="al-' + id + '"><b>' + x + "</b></td></tr>").join("");
  };
  model.addEventListener("change", () => { fillLayers(); drawAlignment(); });
  [verse, layer, head, mode].forEach((el) => el.addEventListener("change", drawAlignment));
  $("al-prev").addEventListener("click", () => { verse.value = Math.max(0, +verse.value - 1); drawAlignment(); });
  $("al-next").addEventListener("click", () => { verse.value = Math.min(A.verses.length - 1, +verse.value + 1); drawAlignment(); });
  fillLayers();
  drawAlignment();
}

setupSentences();
setupAlignments();
document.body.dataset.ready = "1";
"""


# ------------------------------------------------------------------------------------ helpers
# what the page reads of each report file (a file without it is one line, not a KeyError)
REQUIRED_KEYS = {"table.json": ("headers", "rows"), "metrics.json": ("bootstrap", "systems", "definition")}
REPORT_FILES = ("report.json", "table.json", "metrics.json", "sentences.json", "alignments.json", "seeds.json")


def _read_json(path: Path) -> Optional[dict]:
    if not path.exists():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: byte {e.start}: not UTF-8") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object, got a {type(value).__name__}")
    missing = [key for key in REQUIRED_KEYS.get(path.name, ()) if key not in value]
    if missing:
        raise ValueError(f"{path}: no {', '.join(repr(k) for k in missing)} (not a report file of reluformer-mt?)")
    if path.name == "metrics.json":
        boot = value["bootstrap"]
        if not isinstance(boot, dict) or not all(k in boot for k in ("systems", "baseline", "signatures")):
            raise ValueError(f"{path}: 'bootstrap' needs 'systems', 'baseline' and 'signatures'")
    return value


def _cell(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return html.escape(str(value))


def html_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], row_classes: Sequence[str] = (),
               table_id: str = "", digits: int = 2) -> str:
    """An HTML table of already formatted or plain cells (floats with ``digits`` decimals)."""
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = []
    for k, row in enumerate(rows):
        cls = f' class="{row_classes[k]}"' if k < len(row_classes) and row_classes[k] else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{c if isinstance(c, Raw) else _cell(c, digits)}</td>" for c in row)
                    + "</tr>")
    ident = f' id="{table_id}"' if table_id else ""
    return f'<div class="scroll"><table class="data"{ident}><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


class Raw(str):
    """A cell that is already HTML."""


def row_class(name: str) -> str:
    if name.startswith("baseline"):
        return "baseline"
    if name.startswith("reference run") or name.startswith("paper"):
        return "reference"
    return ""


# ------------------------------------------------------------------------------------ sections
def modes_table(summary: Optional[dict]) -> str:
    """The README's table of the run (``summary.json``): s-BLEU of every decoding mode (translation
    pieces, kNN-MT, TM-first ...), the mode chosen on the validation chapters in bold."""
    if not summary or not any(f.get("modes") for f in (summary.get("families") or {}).values()):
        return ""
    header, rows = mode_table(summary, bold=lambda text: Raw(f"<b>{html.escape(text)}</b>"))
    return ('<h3 id="modes">Every decoding mode</h3><p>The README\'s table of this run: s-BLEU over the held-out '
            "verses of the same checkpoint decoded by the document translator, verse by verse and guided by the "
            "memory (translation pieces, kNN-MT over the model's datastore and over per-input datastores, TM-first); "
            "<b>bold</b>: the mode chosen on the validation chapters, whose d-BLEU follows.</p>"
            + html_table(header, rows, [row_class(str(r[0])) for r in rows], "modes-table"))


def results_section(table: Optional[dict], report: Optional[dict], summary: Optional[dict] = None) -> str:
    parts = ['<h2 id="results">Results</h2>']
    if table:
        names = [str(r[0]) for r in table["rows"]]
        parts.append(html_table(table["headers"], table["rows"], [row_class(n) for n in names], "results-table"))
        if table.get("notes"):
            parts.append("<p><b>Published points of comparison</b> (other corpora and model sizes: for orientation, "
                         "not for a match):</p><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in table["notes"])
                         + "</ul>")
    elif report and report.get("table"):
        parts.append(f"<pre>{html.escape(report['table'])}</pre>")
    else:
        return ""
    for note in (table or {}).get("aer_references", []):
        parts.append(f"<p>{html.escape(note)}</p>")
    parts.append(modes_table(summary))
    definitions = (report or {}).get("definitions") or (table or {}).get("definitions")
    if definitions:
        parts.append("<details><summary>What the columns mean</summary><ul>" + "".join(
            f"<li><b>{html.escape(k)}</b>: {html.escape(str(v))}</li>" for k, v in definitions.items()) + "</ul></details>")
    return "\n".join(parts)


def _interval(entry: dict) -> Raw:
    return Raw(f"{entry['score']:.2f} <span class=\"meta\">± {entry['ci']:.2f}</span>")


def _comparison(entry: dict, base: dict) -> Raw:
    v = verdict(entry, base)
    if v == "baseline":
        return Raw('<span class="same">baseline of the test</span>')
    diff = entry["score"] - base["score"]
    cls = {"better": "better", "worse": "worse"}.get(v, "same")
    return Raw(f'<span class="{cls}">{diff:+.2f} (p = {entry["p_value"]:.3f}): {html.escape(v)}</span>')


def seeds_section(seeds: Optional[dict]) -> str:
    """``seeds.json`` (:mod:`reluformer_mt.experiments.seeds`): the spread over training seeds and each
    family against the baseline family, beside the one-run bootstrap."""
    if not seeds:
        return ""
    labels = seeds["labels"]  # column key -> label, in the table's order

    def cell(s: dict, digits: int) -> str:
        return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"

    keys = [key for key in labels if any(key in c for c in seeds["families"].values())]
    rows = [[family] + [cell(c[key], seeds["digits"].get(key, 2)) if key in c else "" for key in keys]
            for family, c in seeds["families"].items()]
    parts = ['<h2 id="seeds">Spread over training seeds</h2>',
             f'<p class="meta">seeds {html.escape(", ".join(map(str, seeds["seeds"])))}: mean ± standard deviation '
             "(min–max) of the test chapters, one demo run per seed.</p>",
             html_table(["family"] + [labels[k] for k in keys], rows, table_id="seeds-table")]
    comparison = [[family, labels[key], f"{c['difference']:+.2f}", c["verdict"],
                   seeds.get("bootstrap", {}).get(family, "") if key == "s_bleu" else ""]
                  for family, columns in seeds.get("comparison", {}).items() for key, c in columns.items()]
    if comparison:
        parts += [f'<p class="meta">Against {html.escape(seeds["baseline"])}: separated = every seed of one family '
                  "beyond every seed of the other (chance does that 1 time in 10 with 3 seeds each); the bootstrap "
                  "resamples the verses of the first seed's run only.</p>",
                  html_table(["family", "column", f"Δ vs {seeds['baseline']}", "over seeds",
                              "bootstrap over verses (one run)"], comparison, table_id="seeds-comparison")]
    return "\n".join(parts)


def metrics_section(metrics: Optional[dict]) -> str:
    if not metrics:
        return ""
    boot = metrics["bootstrap"]
    base = boot["systems"][boot["baseline"]]
    headers = ["system", "BLEU ± 95 % CI", f"BLEU vs {boot['baseline']}", "chrF ± 95 % CI",
               f"chrF vs {boot['baseline']}", "chrF++", "TER (lower is better)", "d-BLEU"]
    rows, classes = [], []
    for name, m in metrics["systems"].items():
        b = boot["systems"].get(name)
        rows.append([name, _interval(b["BLEU"]) if b else m["bleu"], _comparison(b["BLEU"], base["BLEU"]) if b else "",
                     _interval(b["chrF"]) if b else m["chrf"], _comparison(b["chrF"], base["chrF"]) if b else "",
                     m["chrf_pp"], m["ter"], m["d_bleu"]])
        classes.append("baseline" if name.startswith("nearest") else "")
    significant = [n for n, s in boot["systems"].items() if any(e.get("significant") for e in s.values())]
    summary = ("Significantly different from the baseline (p &lt; 0.05) in BLEU or chrF: "
               + (", ".join(html.escape(n) for n in significant) if significant else "none")
               + ". The intervals cover the test set's sampling only, not the spread between training seeds.")
    sigs = "<br>".join(f"{html.escape(k)}: {html.escape(v)}" for k, v in boot["signatures"].items())
    return "\n".join(['<h2 id="metrics">Standard metrics and significance</h2>',
                      f'<p class="meta">{html.escape(metrics["definition"])}. Unlike the table above (s-BLEU of the '
                      "tokenised text), these numbers compare with other work.</p>",
                      html_table(headers, rows, classes, "metrics-table"), f"<p>{summary}</p>",
                      f'<p class="meta">{sigs}</p>'])


def plots_section(report_dir: Path) -> str:
    known = list(PLOT_CAPTIONS)  # the demo's plots in a reading order, then any others by name
    images = sorted(report_dir.glob("*.png"),
                    key=lambda p: (known.index(p.name) if p.name in known else len(known), p.name))
    if not images:
        return ""
    parts = ['<h2 id="plots">Plots</h2>']
    for path in images:
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        caption = PLOT_CAPTIONS.get(path.name, path.stem.replace("_", " "))
        parts.append(f'<figure><img alt="{html.escape(path.name)}" src="data:image/png;base64,{data}">'
                     f"<figcaption><b>{html.escape(path.name)}</b>: {html.escape(caption)}</figcaption></figure>")
    return "\n".join(parts)


def sentences_section(sentences: Optional[dict], metrics: Optional[dict]) -> str:
    if not sentences or not metrics:
        return ""
    return """<h2 id="sentences-view">Held-out verses</h2>
<p class="meta">Every held-out verse of the translated chapters: source (Greek), reference (BSB), each model's output with
separator-constrained and with free decoding, and the copy of the nearest training verse; the number before each output
is its chrF against the reference (detokenised).</p>
<div class="controls"><label>sort by <select id="sort-key"></select></label>
<span id="diff-controls"><label>A <select id="diff-a"></select></label> <label>B <select id="diff-b"></select></label></span>
<label>order <select id="sort-dir"><option value="desc">highest first</option><option value="asc">lowest first</option></select></label>
<span class="meta" id="sentence-count"></span></div>
<div class="scroll"><table class="data" id="sentences"><thead><tr><th>chapter:verse</th><th>source</th><th>reference</th>
<th>translations (chrF, text)</th></tr></thead><tbody id="sentence-rows"></tbody></table></div>"""


def alignments_section(alignments: Optional[dict]) -> str:
    if not alignments or not alignments.get("verses"):
        return ""
    return f"""<h2 id="alignments">Alignment viewer</h2>
<p class="meta">Word-level cross-attention of the reference force-decoded ({html.escape(alignments['note'])}): a target
word's row is the mean of its pieces' rows, a source word's column the sum of its pieces' columns; shades are relative to
the matrix's maximum, white is exactly zero. Shifted: the row of the step where the word is the decoder input.</p>
<div class="controls"><button id="al-prev">&larr;</button><label>verse <select id="al-verse"></select></label>
<button id="al-next">&rarr;</button><label>model <select id="al-model"></select></label>
<label><select id="al-layer"></select></label><label><select id="al-head"></select></label>
<label>attention <select id="al-mode"></select></label></div>
<div class="aligner"><div id="al-heatmap"></div><div id="al-stats"><b id="al-title"></b>
<table><tbody id="al-stats-body"></tbody></table>
<p class="legend meta"><span>&#9633; gold sure link</span><span>&#9676; gold possible link</span>
<span style="color:#e8590c">&#9679; extracted link (argmax)</span></p></div></div>"""


def header(report_dir: Path, report: Optional[dict]) -> str:
    r = report or {}
    options, versions = r.get("options", {}), r.get("versions", {})
    facts = []
    if options.get("preset"):
        facts.append(f"preset {options['preset']}")
    if options.get("families"):
        facts.append("models " + ", ".join(options["families"]))
    if r.get("total_seconds") is not None:
        facts.append(f"total {r['total_seconds'] / 60:.1f} min")
    if r.get("created"):
        facts.append(f"written {r['created']}")
    if versions:
        facts.append(", ".join(f"{k} {v}" for k, v in versions.items()))
    command = f'<div class="meta">command: <code>{html.escape(r["command"])}</code></div>' if r.get("command") else ""
    return (f"<header><h1>reluformer-mt report: {html.escape(report_dir.resolve().parent.name or report_dir.name)}</h1>"
            f'<div class="meta">{html.escape("; ".join(facts))}</div>{command}'
            '<nav><a href="#results">results</a><a href="#metrics">metrics</a><a href="#plots">plots</a>'
            '<a href="#sentences-view">verses</a><a href="#alignments">alignments</a></nav></header>')


def _script_json(data: dict) -> str:
    """JSON inside <script>: '</' would end the element, so it is escaped."""
    return json.dumps(data, ensure_ascii=False, allow_nan=False).replace("</", "<\\/")


def page(title: str, header_html: str, body: str, data: dict) -> str:
    """A whole self-contained page: style, body, the data as JSON and the script that reads it."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
            f"{header_html}<main>{body}</main>"
            f'<script type="application/json" id="report-data">{_script_json(data)}</script>'
            f"<script>{SCRIPT}</script></body></html>\n")


def build_page(report_dir: Path, extra_sections: Sequence[str] = ()) -> str:
    """The page's HTML from the files of ``report_dir`` (see the module docstring)."""
    report = _read_json(report_dir / "report.json")
    table = _read_json(report_dir / "table.json")
    metrics = _read_json(report_dir / "metrics.json")
    sentences = _read_json(report_dir / "sentences.json")
    alignments = _read_json(report_dir / "alignments.json")
    diagonal = ((report or {}).get("baselines") or {}).get("diagonal", {}).get("aer")
    eflomal = ((_read_json(report_dir / "aligners.json") or {}).get("eflomal") or {}).get("aer")
    data = {"sentences": sentences if metrics else None, "metrics": metrics, "alignments": alignments,
            "diagonal_aer": diagonal, "eflomal_aer": eflomal, "nearest_name": "nearest training verse"}
    seeds = _read_json(report_dir / "seeds.json")
    sections = [results_section(table, report, _read_json(report_dir / "summary.json")), metrics_section(metrics), seeds_section(seeds), *extra_sections,
                plots_section(report_dir),
                sentences_section(sentences, metrics), alignments_section(alignments)]
    body = "\n".join(s for s in sections if s)
    return page("reluformer-mt report", header(report_dir, report), body, data)


def write_html_report(report_dir, path: Optional[Path] = None, extra_sections: Sequence[str] = ()) -> Path:
    """Write ``index.html`` (or ``path``) for the report folder ``report_dir``; returns its path."""
    report_dir = Path(report_dir)
    if not report_dir.is_dir():
        raise ValueError(f"{report_dir}: no such report folder")
    if not any((report_dir / name).is_file() for name in REPORT_FILES) and not any(report_dir.glob("*.png")):
        raise ValueError(f"{report_dir}: no report files ({', '.join(REPORT_FILES)} or *.png); nothing to show")
    out = Path(path) if path else report_dir / "index.html"
    write_text_atomically(out, build_page(report_dir, extra_sections))
    return out


# ------------------------------------------------------------------------------------ one evaluation
def score_rows(report: dict) -> List[list]:
    """(metric, score, items, signature) of every sacreBLEU score in a ``reluformer-eval bleu`` report."""
    rows = []
    for key, prefix in (("scores", "BLEU"), ("chrf", "chrF2"), ("chrf++", "chrF2++"), ("ter", "TER")):
        for r in (report.get(key) or {}).values():
            r = r.to_dict() if hasattr(r, "to_dict") else r
            rows.append([r["name"], r["score"], r["n_items"], f"{prefix}|{r['signature']}"])
    return rows


def evaluation_page(command: str, report: dict, printed: str) -> str:
    """The page of one ``reluformer-eval`` run: its scores as a table (bleu), its plot, the tables
    it printed and its JSON report."""
    from reluformer_mt.evaluation.reports import to_jsonable

    parts = ['<h2 id="results">Results</h2>']
    if report.get("definition"):
        parts.append(f'<p class="meta">{html.escape(str(report["definition"]))}</p>')
    rows = score_rows(report)
    if rows:
        parts.append(html_table(["metric", "score", "items", "signature"], rows, table_id="results-table"))
    plot = report.get("plot")
    if plot and Path(plot).exists():
        data = base64.b64encode(Path(plot).read_bytes()).decode("ascii")
        parts.append(f'<h2 id="plots">Plot</h2><figure><img alt="{html.escape(Path(plot).name)}" '
                     f'src="data:image/png;base64,{data}"><figcaption>{html.escape(str(plot))}</figcaption></figure>')
    parts.append(f"<h2>Output</h2><pre>{html.escape(printed)}</pre>")
    parts.append("<details><summary>The JSON report</summary><pre>"
                 + html.escape(json.dumps(to_jsonable(report), indent=1, ensure_ascii=False)) + "</pre></details>")
    head = (f"<header><h1>reluformer-eval</h1><div class=\"meta\">command: <code>{html.escape(command)}</code></div>"
            "</header>")
    return page(f"reluformer-eval: {command[:60]}", head, "\n".join(parts), {})


def write_evaluation_page(path, command: str, report: dict, printed: str) -> Path:
    """Write :func:`evaluation_page` to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, evaluation_page(command, report, printed))
    return path


__all__ = ["build_page", "evaluation_page", "html_table", "write_evaluation_page", "write_html_report",
           "PLOT_CAPTIONS"]
