#!/usr/bin/env python
"""Where a training step's time goes: fairseq's transformer against our families, op by op.

    python benchmarks/profile_training.py --length 30 --batch 34 --threads 1
    python benchmarks/profile_training.py --demo --python   # the demo's model: Python time per call

Builds the models as benchmarks/run.py does (same dimensions, same fake sentences), runs a few
warm-up steps, then profiles ``--steps`` steps (forward + backward + Adam) of each model with
torch.profiler and prints, per model, the total and the operators with the most self CPU time;
then the operators whose time differs most from the transformer's. This is the profile behind
the explanations in docs/PERFORMANCE.md.

``--demo`` profiles the model ``make demo`` trains (64-dim 2+2 layers, 4 heads, a 2,000-piece
shared vocabulary, dropout 0.1, padded batches of ~4,096 tokens, Adam with clipping) instead;
``--python`` adds a cProfile of the same steps: own and cumulative time of the functions of
``reluformer_mt`` (the Python work around the attention operators) and calls per step;
``--counts docs/benchmarks/training-operators.json`` counts, per training step of every family at
the demo's size and ``*_iwslt_de_en`` (sentences and 1,024-token segments), the operators, the
host synchronisations, the attention-map-sized tensors per attention call and the bytes allocated
(issue 64; tests/test_training_operators.py checks the file); ``--calls`` times one attention call and its parts (softmax's SDPA, our ReLU route, the counts,
the row sums, ReLUFormer's regularisers) in CPU time, at the same shapes.
"""
import argparse
import sys
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import build_model, make_sample  # noqa: E402  (the benchmark's own builders)


def training_step(model, criterion, sample, clip_norm=None):
    """One update as fairseq-train does it (Adam; gradient clipping with ``clip_norm``)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98))

    def step():
        loss, _, _ = criterion(model, sample)
        loss.backward()
        if clip_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def profile_steps(step, steps):
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    times, calls = Counter(), Counter()
    for event in prof.key_averages():
        times[event.key] += event.self_cpu_time_total / steps / 1000.0  # ms per step
        calls[event.key] += event.count / steps
    return times, calls


def attention_call_costs(batch, length, heads, head_dim, reps=5, inner=10):
    """CPU ms of one self-attention call's forward + backward at a model's shapes (padded keys):
    the fused softmax kernel the softmax family runs (SDPA), our ReLU route (direct, or the fused
    C++ kernel from 512 keys on, as ``--attn-impl auto``), the same with
    the non-zero counts (the statistics every family logs; rela's case; the fused kernel computes the
sums with them), with the row sums, and
    with ReLUFormer's two regularisers on them (reluformer's case). The differences are what each
    part costs; the step's other work is the same in every family."""
    import torch.nn.functional as F

    from reluformer_mt.attention import fused
    from reluformer_mt.attention.blocked import tiled_attention
    from reluformer_mt.attention.regularisers import regularisers_from_rows
    from reluformer_mt.attention.visibility import Visibility

    from reluformer_mt.cpu_memory import keep_freed_memory

    keep_freed_memory()  # as in training (a reluformer model sets it when it is built)
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, heads, length, head_dim, requires_grad=True) for _ in range(3))
    padding = torch.zeros(batch, length, dtype=torch.bool)
    padding[1:, :length // 8] = True  # left-padded sources, as fairseq batches them
    visible = Visibility.from_padding(length, length, padding)
    n_visible = visible.n_visible()
    factor = 1 / torch.sqrt(n_visible / 2.0)
    # the route --attn-impl auto takes for such a call: the C++ kernel from 512 keys on, else one tile
    route = "fused" if length >= fused.AUTO_MIN_LEN and fused.available() else "direct"

    def sdpa():
        F.scaled_dot_product_attention(q, k, v, attn_mask=~padding.view(batch, 1, 1, length)).sum().backward()

    def relu(rows, sums, regularise):
        def call():
            out, got, _ = tiled_attention(q, k, v, visible, route=route, scaling=head_dim ** -0.5,
                                          row_factor=factor, n_visible=n_visible, want_rows=rows, row_sums=sums)
            loss = out.sum()
            if regularise:
                norm, margin, _ = regularisers_from_rows(got[0], got[1], got[3])
                loss = loss + norm + margin
            loss.backward()
        return call

    variants = {"softmax (SDPA)": sdpa, f"relu ({route} route)": relu(False, False, False),
                "relu + counts": relu(True, False, False),
                "relu + counts + sums": relu(True, True, False), "relu + counts + sums + regularisers": relu(True, True, True)}
    costs = {}
    for name, fn in variants.items():
        fn()
        times = []
        for _ in range(reps):
            start = time.process_time()
            for _ in range(inner):
                fn()
            times.append((time.process_time() - start) / inner * 1000)
        costs[name] = sorted(times)[len(times) // 2]
    print(f"\none attention call, forward + backward, batch {batch} x {heads} heads x {length} x {length}, "
          f"head size {head_dim} (CPU ms, median of {reps}):")
    for name, ms in costs.items():
        print(f"  {ms:8.2f} ms  {name}")
    return costs


def python_profile(step, steps, top):
    """cProfile of ``steps`` steps: the functions of reluformer_mt with the most cumulative time."""
    import cProfile
    import pstats

    step()
    profiler = cProfile.Profile(time.process_time)  # CPU time: robust on a shared machine
    profiler.enable()
    for _ in range(steps):
        step()
    profiler.disable()
    stats = pstats.Stats(profiler)
    rows = sorted(((ct / steps, tt / steps, nc / steps, f"{Path(file).name}:{line}:{name}")
                   for (file, line, name), (_, nc, tt, ct, _) in stats.stats.items()
                   if "reluformer_mt" in file), reverse=True)[:top]
    print(f"  {stats.total_tt / steps * 1000:.0f} ms per step under cProfile; reluformer_mt functions "
          f"(cumulative ms, own ms, calls per step):")
    for ct, tt, nc, where in rows:
        print(f"  {ct * 1000:8.2f} {tt * 1000:8.2f} {nc:6.0f}  {where}")


def profile_decoding(model, dictionary, length, sentences, beam, top):
    """Python-level profile (cProfile) of beam search: decoding steps are many small calls, so
    the interpreter's overhead, not the operators, is what differs between models."""
    import cProfile
    import pstats

    from fairseq.sequence_generator import SequenceGenerator

    model.eval()
    generator = SequenceGenerator([model], dictionary, beam_size=beam, max_len_a=0, max_len_b=length, min_len=length)
    sample = make_sample(dictionary, sentences, length)
    with torch.no_grad():
        generator.generate([model], sample)  # warm-up
        profiler = cProfile.Profile()
        profiler.enable()
        generator.generate([model], sample)
        profiler.disable()
    stats = pstats.Stats(profiler)
    total = stats.total_tt
    rows = sorted(((tt, ct, f"{Path(file).name}:{line}:{name}") for (file, line, name), (_, _, tt, ct, _)
                   in stats.stats.items()), reverse=True)[:top]
    print(f"  {total * 1000:.0f} ms in total; functions with the most own time (own ms, cumulative ms):")
    for tt, ct, where in rows:
        print(f"  {tt * 1000:8.1f} {ct * 1000:8.1f}  {where}")


# ---------------------------------------------------------------------------------- counts (issue 64)
# Calls that need a value on the host (on a GPU each waits for the queue to drain): ``.item()``,
# ``bool(t)``, ``float(t)`` all end in _local_scalar_dense; the others have data-dependent shapes;
# ``Tensor.tolist()`` (no operator) is counted by wrapping it.
SYNC_OPS = frozenset({"aten::_local_scalar_dense", "aten::equal", "aten::nonzero", "aten::masked_select",
                      "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive", "aten::argwhere"})
# The C++ CPU kernel (attention/fused.py, from 512 keys on) is one call, forward and backward, like
# SDPA's; the GEMMs it runs per tile and head inside are its own (SDPA's inner BLAS calls are not
# operators either), so operators nested in its autograd function's ranges are not counted
KERNEL_RANGES = ("FusedReluAttention",)
# PyTorch's Adam keeps its step counter as a host tensor (unless capturable / fused), also when
# training on a GPU: its per-parameter .item() is no device synchronisation, so the optimizer's
# own range is left out of the sync count (its operators are counted)
OPTIMIZER_RANGE = "Optimizer."


def _inside(event, prefixes, names=()) -> bool:
    """Whether an enclosing event's name starts with one of ``prefixes`` or is one of ``names``."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith(prefixes) or parent.name in names:
            return True
        parent = parent.cpu_parent
    return False


class _MapTensors(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the new tensors (not views, not in-place or out= results) of exactly ``numel``
    elements that the operators inside the block create, forward and backward."""

    def __init__(self, numel: int):
        super().__init__()
        self.numel, self.count = numel, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not any(r.alias_info is not None for r in func._schema.returns):
            flat = out if isinstance(out, (tuple, list)) else (out,)
            self.count += sum(isinstance(t, torch.Tensor) and t.numel() == self.numel for t in flat)
        return out


@contextmanager
def _counting_tolist():
    """Counts ``Tensor.tolist()`` calls (a copy to the host, which is no operator the profiler sees)."""
    calls, tolist = [0], torch.Tensor.tolist

    def counted(self):
        calls[0] += 1
        return tolist(self)
    torch.Tensor.tolist = counted
    try:
        yield calls
    finally:
        torch.Tensor.tolist = tolist


def attention_calls(model, step) -> int:
    """How many attention calls (fairseq MultiheadAttention forwards, ours included) one step makes."""
    from fairseq.modules.multihead_attention import MultiheadAttention

    calls = [0]

    def hook(*_):
        calls[0] += 1
    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, MultiheadAttention)]
    try:
        step()
    finally:
        for handle in handles:
            handle.remove()
    return calls[0]


def step_counts(model, step, map_numel: int, steps: int = 2) -> dict:
    """What one training step does (issue 64): operator calls (every profiler event, nested ones
    included, as the issue counted them), host synchronisations (``SYNC_OPS`` outside the
    optimizer's range, nested ones once), tensors of attention-map size (batch x heads x target x
    source elements) created per attention call, and bytes allocated (CPU allocator), per step."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):  # Adam's state and the C++ kernel exist from here on
        step()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof, _counting_tolist() as lists:
        for _ in range(steps):
            step()
    events = [e for e in prof.events() if e.name != "[memory]" and not _inside(e, KERNEL_RANGES)]
    syncs = sum(e.name in SYNC_OPS and not _inside(e, (OPTIMIZER_RANGE,), SYNC_OPS) for e in events) + lists[0]
    allocated = sum(e.nbytes() for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]" and e.nbytes() > 0)
    calls = attention_calls(model, step)
    with _MapTensors(map_numel) as maps:
        step()
    return dict(ops_per_step=round(len(events) / steps), syncs_per_step=round(syncs / steps),
                attention_map_tensors_per_call=round(maps.count / max(calls, 1), 2),
                bytes_per_step=round(allocated / steps))


def count_rows(configs, settings, steps=2) -> list:
    """Rows of ``docs/benchmarks/training-operators.json``: every family of each training-speed
    configuration (training_speed.CONFIGS: the demo's size and ``*_iwslt_de_en``) at each
    (setting, length), with the benchmark's batches, criterion, clipping and Adam."""
    import training_speed

    rows = []
    for name, config in configs.items():
        for setting, length in settings:
            built = training_speed.build_variants(config, length, copy=False)
            batch = max(1, config["tokens"] // length)
            for family, (model, criterion, dictionary) in built.items():
                sample = make_sample(dictionary, batch, length, padded=True)
                step = training_speed.update_step(model, criterion, sample)
                heads = next(m.num_heads for m in model.modules() if hasattr(m, "num_heads"))
                counts = step_counts(model, step, batch * heads * length * length, steps)
                rows.append(dict(family=family, size=name, setting=setting, **counts))
                print(f"  {name} {setting} {family}: " + ", ".join(f"{k} {v}" for k, v in counts.items()), flush=True)
    return rows


def write_counts(path, steps=2, configs=None) -> list:
    """Count every row and save them as ``{"rows": [...]}`` (the format tests/test_training_operators.py reads)."""
    import json

    import training_speed

    rows = count_rows(configs or training_speed.CONFIGS, COUNT_SETTINGS, steps)
    Path(path).write_text(json.dumps({"rows": rows}, indent=1) + "\n", encoding="utf-8")
    return rows


COUNT_SETTINGS = (("sentence", 30), ("segment1024", 1024))


DEMO = dict(model_size="2,64,128,4", vocab=2000, length=30, batch=136, extra=["--share-all-embeddings"],
            clip_norm=1.0, padded=True)  # reluformer_mt/experiments/demo.py, preset quick


def options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--length", type=int, default=30)
    p.add_argument("--batch", type=int, default=34)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model-size", default="2,256,1024,4", help="LAYERS,EMBED,FFN,HEADS")
    p.add_argument("--vocab", type=int, default=4000)
    p.add_argument("--models", default="transformer,reluformer_tiny,rela_tiny")
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--demo", action="store_true",
                   help="the demo's model, vocabulary, padded batches and optimiser (--length/--batch still apply)")
    p.add_argument("--python", action="store_true", help="also a cProfile of the steps (reluformer_mt functions)")
    p.add_argument("--calls", action="store_true",
                   help="only the CPU time of one attention call (forward + backward) and its parts, at these shapes")
    p.add_argument("--decode", action="store_true", help="profile beam-4 decoding (cProfile) instead of training")
    p.add_argument("--counts", metavar="JSON",
                   help="only count what a training step does (issue 64) for every family, size and setting; save here")
    return p


def main(argv=None):
    p = options()
    args = p.parse_args(argv)
    extra, clip_norm, padded = [], None, False
    if args.demo:
        defaults = p.parse_args([])
        for key in ("model_size", "vocab", "length", "batch"):
            if getattr(args, key) == getattr(defaults, key):
                setattr(args, key, DEMO[key])
        extra, clip_norm, padded = DEMO["extra"], DEMO["clip_norm"], DEMO["padded"]
    torch.set_num_threads(args.threads)
    if args.counts:
        return write_counts(args.counts, steps=args.steps)
    layers, embed, ffn, heads = (int(x) for x in args.model_size.split(","))
    dims = ["--encoder-layers", str(layers), "--decoder-layers", str(layers), "--encoder-embed-dim", str(embed),
            "--decoder-embed-dim", str(embed), "--encoder-ffn-embed-dim", str(ffn), "--decoder-ffn-embed-dim", str(ffn),
            "--encoder-attention-heads", str(heads), "--decoder-attention-heads", str(heads), "--dropout", "0.1"]
    if args.calls:
        attention_call_costs(args.batch, args.length, heads, embed // heads)
        return
    if args.decode:
        for arch in args.models.split(","):
            model, _, dictionary = build_model(arch, dims, args.vocab, args.length, extra)
            print(f"\n{arch}: beam-4 decoding of {args.batch} sentences x {args.length} steps")
            profile_decoding(model, dictionary, args.length, args.batch, 4, args.top)
        return
    profiles = {}
    for arch in args.models.split(","):
        model, criterion, dictionary = build_model(arch, dims, args.vocab, args.length, extra)
        model.train()
        step = training_step(model, criterion, make_sample(dictionary, args.batch, args.length, padded=padded),
                             clip_norm)
        profiles[arch], calls = profile_steps(step, args.steps)
        total = sum(profiles[arch].values())
        print(f"\n{arch}: {total:.1f} ms of self CPU time per step, {sum(calls.values()):.0f} operator calls")
        for name, ms in profiles[arch].most_common(args.top):
            print(f"  {ms:8.2f} ms  {100 * ms / total:5.1f} %  {calls[name]:6.0f} calls  {name}")
        if args.python:
            python_profile(step, args.steps, args.top)
    reference = next(iter(profiles))
    for arch in list(profiles)[1:]:
        diff = Counter({name: profiles[arch][name] - profiles[reference].get(name, 0.0)
                        for name in set(profiles[arch]) | set(profiles[reference])})
        print(f"\n{arch} - {reference}: {sum(diff.values()):+.1f} ms per step; largest differences:")
        for name, ms in sorted(diff.items(), key=lambda item: -abs(item[1]))[:args.top]:
            print(f"  {ms:+8.2f} ms  {name}")


if __name__ == "__main__":
    main()
