#!/usr/bin/env python
"""Where a training step's time goes: fairseq's transformer against our families, op by op.

    python benchmarks/profile_training.py --length 30 --batch 34 --threads 1

Builds the models as benchmarks/run.py does (same dimensions, same fake sentences), runs a few
warm-up steps, then profiles ``--steps`` steps (forward + backward + Adam) of each model with
torch.profiler and prints, per model, the total and the operators with the most self CPU time;
then the operators whose time differs most from the transformer's. This is the profile behind
the explanations in docs/PERFORMANCE.md.
"""
import argparse
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import build_model, make_sample  # noqa: E402  (the benchmark's own builders)


def profile_steps(model, criterion, sample, steps):
    from torch.profiler import ProfilerActivity, profile

    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step():
        loss, _, _ = criterion(model, sample)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    times = Counter()
    for event in prof.key_averages():
        times[event.key] += event.self_cpu_time_total / steps / 1000.0  # ms per step
    return times


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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--length", type=int, default=30)
    p.add_argument("--batch", type=int, default=34)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model-size", default="2,256,1024,4", help="LAYERS,EMBED,FFN,HEADS")
    p.add_argument("--models", default="transformer,reluformer_tiny,rela_tiny")
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--decode", action="store_true", help="profile beam-4 decoding (cProfile) instead of training")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    layers, embed, ffn, heads = (int(x) for x in args.model_size.split(","))
    dims = ["--encoder-layers", str(layers), "--decoder-layers", str(layers), "--encoder-embed-dim", str(embed),
            "--decoder-embed-dim", str(embed), "--encoder-ffn-embed-dim", str(ffn), "--decoder-ffn-embed-dim", str(ffn),
            "--encoder-attention-heads", str(heads), "--decoder-attention-heads", str(heads), "--dropout", "0.1"]
    if args.decode:
        for arch in args.models.split(","):
            model, _, dictionary = build_model(arch, dims, 4000, args.length)
            print(f"\n{arch}: beam-4 decoding of {args.batch} sentences x {args.length} steps")
            profile_decoding(model, dictionary, args.length, args.batch, 4, args.top)
        return
    profiles = {}
    for arch in args.models.split(","):
        model, criterion, dictionary = build_model(arch, dims, 4000, args.length)
        model.train()
        profiles[arch] = profile_steps(model, criterion, make_sample(dictionary, args.batch, args.length), args.steps)
        total = sum(profiles[arch].values())
        print(f"\n{arch}: {total:.1f} ms of self CPU time per step")
        for name, ms in profiles[arch].most_common(args.top):
            print(f"  {ms:8.2f} ms  {100 * ms / total:5.1f} %  {name}")
    reference = next(iter(profiles))
    for arch in list(profiles)[1:]:
        diff = Counter({name: profiles[arch][name] - profiles[reference].get(name, 0.0)
                        for name in set(profiles[arch]) | set(profiles[reference])})
        print(f"\n{arch} - {reference}: {sum(diff.values()):+.1f} ms per step; largest differences:")
        for name, ms in sorted(diff.items(), key=lambda item: -abs(item[1]))[:args.top]:
            print(f"  {ms:+8.2f} ms  {name}")


if __name__ == "__main__":
    main()
