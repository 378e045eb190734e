"""fairseq-train options shared by the experiments (demo, study)."""
from typing import List


def size_args(embed: int, ffn: int, layers: int, heads: int) -> List[str]:
    """The same width, FFN width, depth and heads for encoder and decoder."""
    args = []
    for side in ("encoder", "decoder"):
        args += [f"--{side}-embed-dim", str(embed), f"--{side}-ffn-embed-dim", str(ffn),
                 f"--{side}-layers", str(layers), f"--{side}-attention-heads", str(heads)]
    return args
