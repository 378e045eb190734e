"""Model-level checks: softmax == fairseq's transformer, clear errors for bad options and checkpoints."""
import argparse

import pytest
import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_REGISTRY, ARCH_CONFIG_REGISTRY
from fairseq.tasks.translation import TranslationTask

from reluformer_mt.plugin import register
from reluformer_mt.models import ARCHITECTURES, FAMILIES

from helpers import USER_DIR, run_subprocess

register()  # models, criterion, task and the fairseq fixes: importing the package does not register

DIMS = dict(encoder_layers=2, decoder_layers=2, encoder_embed_dim=32, decoder_embed_dim=32,
            encoder_ffn_embed_dim=64, decoder_ffn_embed_dim=64, encoder_attention_heads=4,
            decoder_attention_heads=4, dropout=0.0, attention_dropout=0.0)


def tiny_task():
    d = Dictionary()
    for i in range(40):
        d.add_symbol(f"w{i}")
    args = argparse.Namespace(left_pad_source=True, left_pad_target=False, source_lang="x", target_lang="y")
    return TranslationTask(args, d, d)


def build(arch, task, **overrides):
    """Build a model the way fairseq-train does: parser defaults, then the architecture's."""
    model_cls = ARCH_MODEL_REGISTRY[arch]
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)  # as fairseq's option parsing
    model_cls.add_args(parser)
    args = parser.parse_args([])
    for key, value in {**DIMS, **overrides}.items():
        setattr(args, key, value)
    ARCH_CONFIG_REGISTRY[arch](args)
    return model_cls.build_model(args, task)


def batch(task):
    src = torch.tensor([[1, 5, 6, 7, 2], [1, 1, 8, 9, 2]])  # second row left-padded (pad = 1)
    src[0, 0] = 4
    lengths = torch.tensor([5, 3])
    prev = torch.tensor([[2, 10, 11, 12], [2, 13, 14, 1]])
    return src, lengths, prev


def test_every_family_has_three_sizes():
    for family in FAMILIES:
        for size in ("tiny", "iwslt_de_en", "base"):
            assert f"{family}_{size}" in ARCHITECTURES
            assert f"{family}_{size}" in ARCH_MODEL_REGISTRY


def test_softmax_architecture_equals_fairseq_transformer():
    task = tiny_task()
    torch.manual_seed(0)
    ours = build("softmax_tiny", task).eval()
    theirs = build("transformer", task).eval()
    theirs.load_state_dict(ours.state_dict(), strict=True)
    src, lengths, prev = batch(task)
    out_ours, extra_ours = ours(src, lengths, prev)
    out_theirs, extra_theirs = theirs(src, lengths, prev)
    torch.testing.assert_close(out_ours, out_theirs, rtol=1e-5, atol=1e-5)
    # and the other direction: fairseq's weights load into ours
    torch.manual_seed(1)
    other = build("transformer", task).eval()
    ours.load_state_dict(other.state_dict(), strict=True)
    torch.testing.assert_close(ours(src, lengths, prev)[0], other(src, lengths, prev)[0], rtol=1e-5, atol=1e-5)


def test_architecture_defaults_are_overridable():
    task = tiny_task()
    model = build("reluformer_tiny", task, cross_attn_fn="softmax", relu_gamma=2.0)
    fns = {name: m.fn for name, m in model.attention_modules()}
    assert fns["encoder.layers.0.self_attn"] == "relu"
    assert fns["decoder.layers.0.self_attn"] == "relu"
    assert fns["decoder.layers.0.encoder_attn"] == "softmax"
    assert model.encoder.layers[0].self_attn.config.relu_gamma == 2.0
    pointwise = build("pointwise_tiny", task)
    attn = pointwise.encoder.layers[0].self_attn
    assert attn.fn == "pointwise" and attn.q_norm is not None and attn.config.pointwise_alpha == 1.0


def test_checkpoint_of_another_architecture_gives_one_line_error():
    task = tiny_task()
    rela = build("rela_tiny", task)
    relu = build("reluformer_tiny", task)
    with pytest.raises(ValueError) as err:
        relu.load_state_dict(rela.state_dict())
    message = str(err.value)
    assert "\n" not in message and "unexpected" in message and "rela_gain" in message and "--arch" in message


@pytest.mark.parametrize("flags,expected", [
    (["--encoder-attn-fn", "tanh"], "argument --encoder-attn-fn: invalid choice: 'tanh'"),
    (["--relu-gamma", "-1"], "argument --relu-gamma: expected a finite number > 0, got '-1'"),
    (["--pointwise-alpha", "5"], "argument --pointwise-alpha: expected a number in [0, 2], got '5'"),
    (["--pointwise-h", "tanh"], "argument --pointwise-h: invalid choice: 'tanh'"),
])
def test_bad_command_line_options_give_one_line_errors(tmp_path, flags, expected):
    result = run_subprocess(["fairseq-train", tmp_path, "--user-dir", USER_DIR, "--arch", "reluformer_tiny",
                             "--task", "translation", *flags], timeout=120)
    assert result.returncode != 0
    assert expected in result.stderr, result.stderr[-1500:]
    assert "Traceback" not in result.stderr


def test_encoder_reorder_skips_the_copies_beam_search_does_not_need():
    """Beam search's reorders of the encoder output give fairseq's values, and a step that only
    moves rows inside their sentence's beams keeps the tensors instead of copying them."""
    from fairseq.models.transformer.transformer_encoder import TransformerEncoderBase

    task = tiny_task()
    model = build("reluformer_tiny", task).eval()
    src = torch.tensor([[4, 5, 6, 7, 2], [1, 1, 8, 9, 2], [1, 10, 11, 12, 2]])
    with torch.no_grad():
        ours = model.encoder(src, torch.tensor([5, 3, 4]))
    theirs = {k: list(v) for k, v in ours.items()}
    beams = 3
    orders = [torch.arange(3).repeat_interleave(beams),  # beam search's first reorder: the beams
              torch.tensor([2, 0, 0, 3, 5, 3, 8, 6, 7]),  # each row stays in its sentence: no copy
              torch.tensor([3, 3, 4, 6, 8, 7]),  # the first sentence finished
              torch.tensor([1, 0, 2, 3, 3, 4]),  # inside the sentences again
              torch.tensor([3, 4, 0])]  # rows of different sentences: fairseq's copy
    copies = []
    for order in orders:
        before = ours["encoder_out"][0]
        ours = model.encoder.reorder_encoder_out(ours, order)
        theirs = TransformerEncoderBase.reorder_encoder_out(model.encoder, theirs, order)
        copies.append(ours["encoder_out"][0] is not before)
        for key in ("encoder_out", "encoder_padding_mask", "encoder_embedding"):
            assert torch.equal(ours[key][0], theirs[key][0]), (key, order)
    assert copies == [True, False, True, False, True]
