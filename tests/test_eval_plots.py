"""PNG plots and the reluformer-eval command table."""
import torch

from reluformer_mt.cli.eval import SUBCOMMANDS, build_parser
from reluformer_mt.evaluation import plots
from reluformer_mt.evaluation.stats import shift_rows


def test_plots_write_pngs(tmp_path):
    torch.manual_seed(0)
    src, tgt = ["\u2581Das", "\u2581Haus", "\u2581ist", "\u2581klein", "</s>"], ["\u2581The", "\u2581house", "\u2581is", "\u2581small", "</s>"]
    soft = torch.softmax(torch.randn(4, 5, 5) * 2, -1)
    relu = torch.relu(torch.randn(4, 5, 5))
    out = plots.plot_attention_heatmaps({"softmax": soft, "relu": relu, "relu shifted": shift_rows(relu)}, src, tgt,
                                        tmp_path / "heat.png", title="one sentence pair")
    aer = {"softmax": {"normal": {"best_head": [0.6, 0.5, 0.45], "head_average": [0.7, 0.6, 0.55]},
                       "shifted": {"best_head": [0.5, 0.4, 0.35], "head_average": [0.6, 0.5, 0.5]}},
           "rela": {"normal": {"best_head": [0.55, 0.45, 0.41], "head_average": [0.65, 0.55, 0.5]},
                    "shifted": {"best_head": [0.45, 0.35, 0.31], "head_average": [0.55, 0.45, 0.4]}}}
    out2 = plots.plot_aer_per_layer(aer, tmp_path / "aer.png")
    out3 = plots.plot_sparsity_per_layer({"softmax": [0.0, 0.0, 0.0], "relu": [0.5, 0.62, 0.7]}, tmp_path / "sparsity.png")
    for path in (out, out2, out3):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_cli_registry():
    assert {"bleu", "aer"} <= set(SUBCOMMANDS)
    args = build_parser().parse_args(["aer", "--gold", "g", "--gold-base", "0", "--baseline", "diagonal", "--lengths", "l",
                                      "--json", "r.json"])
    assert args.command == "aer" and args.json == "r.json"
