"""Fingerprint of what the attention code computes, to show that a refactoring changes nothing.

For every family (``architectures.FAMILIES``) and several ``--attn-impl`` values, a tiny model
built with a fixed seed gets the criterion's loss (regularisers on every function, statistics on),
its logging outputs and the gradient of every parameter, in training mode, and beam-search
hypotheses (tokens and scores) in eval mode. ``save`` writes them to a file; ``compare``
recomputes them and reports every entry that is not bit-for-bit equal (exit status 1).

    PYTHONPATH=$PWD python scripts/behaviour_fingerprint.py save /tmp/before.pt
    PYTHONPATH=$PWD python scripts/behaviour_fingerprint.py compare /tmp/before.pt
"""
import argparse
import sys

import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq.sequence_generator import SequenceGenerator
from fairseq.tasks.translation import TranslationTask

from reluformer_mt.criteria.reluformer_criterion import ReluformerCriterion
from reluformer_mt.models import FAMILIES
from reluformer_mt.plugin import register

DIMS = dict(encoder_layers=2, decoder_layers=2, encoder_embed_dim=32, decoder_embed_dim=32,
            encoder_ffn_embed_dim=64, decoder_ffn_embed_dim=64, encoder_attention_heads=4,
            decoder_attention_heads=4, dropout=0.0, attention_dropout=0.0)
# every route of the ReLU-type functions: auto (dense / direct here), blocked in small tiles,
# the C++ kernel, auto switching to blocked at this short length, the reference route (attention
# dropout in training), and options with learned tensors or other formulas
IMPLS = {"auto": {}, "dense": dict(attn_impl="dense"), "blocked": dict(attn_impl="blocked", attn_block_size=4),
         "fused": dict(attn_impl="fused", attn_block_size=4), "auto_long": dict(attn_blocked_min_len=6),
         "dropout": dict(attention_dropout=0.1),
         "options": dict(relu_gamma_mode="head", relu_gamma=1.3, sigmoid_bias="learned", pointwise_alpha=0.5,
                         rela_variant="ungated", rela_gain_init=0.7, attn_impl="blocked", attn_block_size=4),
         "no_length_scale": dict(relu_gamma_mode="layer", relu_no_length_scale=True, relu_no_logit_scale=True,
                                 pointwise_h="gelu", sigmoid_bias=0.5, attention_dropout=0.1)}


def tiny_task():
    d = Dictionary()
    for i in range(40):
        d.add_symbol(f"w{i}")
    args = argparse.Namespace(left_pad_source=True, left_pad_target=False, source_lang="x", target_lang="y")
    return TranslationTask(args, d, d)


def build(arch, task, **overrides):
    model_cls = ARCH_MODEL_REGISTRY[arch]
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    model_cls.add_args(parser)
    args = parser.parse_args([])
    for key, value in {**DIMS, **overrides}.items():
        setattr(args, key, value)
    ARCH_CONFIG_REGISTRY[arch](args)
    return model_cls.build_model(args, task)


def sample(task):
    g = torch.Generator().manual_seed(7)
    B, S, T = 3, 9, 8
    src = torch.randint(4, 40, (B, S), generator=g)
    src[1, :3] = task.source_dictionary.pad()  # left-padded source
    src[:, -1] = task.source_dictionary.eos()
    tgt = torch.randint(4, 40, (B, T), generator=g)
    tgt[2, 5:] = task.target_dictionary.pad()  # right-padded target
    tgt[0, -1] = tgt[1, -1] = task.target_dictionary.eos()
    tgt[2, 4] = task.target_dictionary.eos()
    prev = torch.roll(tgt, 1, 1)
    prev[:, 0] = task.target_dictionary.eos()
    prev[2, 5:] = task.target_dictionary.pad()
    lengths = (src != task.source_dictionary.pad()).sum(1)
    return {"id": torch.arange(B), "nsentences": B, "ntokens": int((tgt != 1).sum()), "target": tgt,
            "net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev}}


def fingerprint():
    register()
    task = tiny_task()
    batch = sample(task)
    out = {}
    for family in FAMILIES:
        for impl, overrides in IMPLS.items():
            torch.manual_seed(0)
            model = build(f"{family}_tiny", task, **overrides)
            # every function of the model but softmax, which runs fairseq's attention (refused, issue 23)
            fns = sorted({m.fn for _, m in model.attention_modules()} - {"softmax"})
            criterion = ReluformerCriterion(task, False, 0.1, regularise_fns=",".join(fns) or "relu")
            model.train()
            torch.manual_seed(1)  # the same dropout masks before and after
            loss, _, logs = criterion(model, batch)
            loss.backward()
            key = f"{family}/{impl}"
            out[f"{key}/loss"] = loss.detach().clone()
            out[f"{key}/logs"] = {k: float(v) for k, v in logs.items()}
            for name, p in model.named_parameters():
                if p.grad is not None:
                    out[f"{key}/grad/{name}"] = p.grad.clone()
            model.eval()
            generator = SequenceGenerator([model], task.target_dictionary, beam_size=2, max_len_b=6)
            with torch.no_grad():
                hyps = generator.generate([model], {"net_input": {k: v for k, v in batch["net_input"].items()
                                                                  if k != "prev_output_tokens"}})
            out[f"{key}/hyps"] = [[(h["tokens"].tolist(), float(h["score"])) for h in sent] for sent in hyps]
    return out


def same(a, b) -> bool:
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return a == b


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["save", "compare"])
    parser.add_argument("path")
    args = parser.parse_args(argv)
    now = fingerprint()
    if args.mode == "save":
        torch.save(now, args.path)
        print(f"saved {len(now)} entries to {args.path}")
        return 0
    before = torch.load(args.path, weights_only=False)
    differ = [k for k in sorted(set(before) | set(now)) if k not in before or k not in now or not same(before[k], now[k])]
    for k in differ:
        print("DIFFERS:", k)
    print(f"{len(now)} entries, {len(differ)} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
