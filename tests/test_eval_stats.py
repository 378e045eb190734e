"""Attention statistics and alignments from attention on hand-made tensors."""
import math

import pytest
import torch

from reluformer_mt.evaluation.stats import (AttentionStats, alignment_from_attention, attention_entropy,
                                            head_diversity, js_divergence, null_rate, sentencepiece_word_map,
                                            shift_rows, sparsity_rate, top_score_ratio, word_attention)


def close(actual, expected, tol=1e-6):
    torch.testing.assert_close(actual.double(), torch.tensor(expected, dtype=torch.float64), atol=tol, rtol=0)


def example():
    """1 layer, 2 heads, 2 queries, 3 real keys + 1 padded key (garbage weight 9)."""
    attn = torch.tensor([[[[0.5, 0.5, 0.0, 9.0], [0.0, 0.0, 0.0, 9.0]],
                          [[1.0, 0.0, 0.0, 9.0], [0.2, 0.3, 0.5, 0.0]]]])
    mask = torch.tensor([True, True, True, False]).expand(2, 4)
    return attn, mask


def test_sparsity_and_null_rate():
    attn, mask = example()
    close(sparsity_rate(attn, mask), [[4 / 6, 2 / 6]])
    close(null_rate(attn, mask), [[0.5, 0.0]])
    close(sparsity_rate(attn), [[4 / 8, 3 / 8]])  # no mask: the padded column counts


def test_entropy_skips_null_rows_and_normalises():
    attn, mask = example()
    h1 = -(0.2 * math.log(0.2) + 0.3 * math.log(0.3) + 0.5 * math.log(0.5))
    close(attention_entropy(attn, mask), [[math.log(2), h1 / 2]])
    # ReLU rows need not sum to one: scaling a row changes nothing
    close(attention_entropy(attn * 3, mask), [[math.log(2), h1 / 2]])


def test_head_diversity_is_js_over_shared_live_rows():
    attn, mask = example()
    # only row 0 is live in both heads: JS([.5,.5,0], [1,0,0]) in bits
    m = [0.75, 0.25]
    js = (-(m[0] * math.log(m[0]) + m[1] * math.log(m[1])) - math.log(2) / 2) / math.log(2)
    close(head_diversity(attn, mask), [js])
    p = torch.tensor([0.0, 1.0])
    assert js_divergence(p, p).item() == pytest.approx(0.0)
    assert js_divergence(p, p.flip(0)).item() == pytest.approx(1.0)


def test_top_score_ratio():
    attn, mask = example()
    close(top_score_ratio(attn, mask, top_percent=34), [[1.0, 0.9]])  # top 2 of 3 keys
    close(top_score_ratio(attn, mask, top_percent=10), [[0.5, 0.75]])  # top 1
    with pytest.raises(ValueError, match="top_percent"):
        top_score_ratio(attn, mask, top_percent=0)


def test_accumulator_sums_counts_over_sentences():
    attn, mask = example()
    acc = AttentionStats(top_percent=10)
    acc.update(attn, mask)
    acc.update(torch.ones(1, 2, 3, 4) / 4)  # a dense softmax-like sentence, no mask
    r = acc.result()
    close(r["sparsity"], [[4 / 18, 2 / 18]])
    close(r["null_rate"], [[1 / 5, 0.0]])
    close(r["entropy"], [[(math.log(2) + 3 * math.log(4)) / 4, (0 + 1.0296530 + 3 * math.log(4)) / 5]])
    assert r["head_diversity"].shape == (1,)


def test_sentencepiece_word_map():
    assert sentencepiece_word_map(["\u2581Das", "\u2581Hau", "s", "</s>"]) == [0, 1, 1, -1]
    assert sentencepiece_word_map(["ab", "c", "\u2581d", "<sep>", "e", "\u2581", "!"]) == [0, 0, 1, -1, 2, 3, 3]


def test_alignment_from_attention_merges_pieces():
    src = sentencepiece_word_map(["\u2581Das", "\u2581Hau", "s", "</s>"])
    tgt = sentencepiece_word_map(["\u2581The", "\u2581ho", "use", "\u2581now", "</s>"])
    attn = torch.tensor([[0.9, 0.1, 0.0, 0.0],
                         [0.1, 0.3, 0.3, 0.3],
                         [0.5, 0.0, 0.2, 0.3],
                         [0.0, 0.0, 0.0, 1.0],  # only </s>: no link for 'now'
                         [0.2, 0.2, 0.6, 0.0]])
    words = word_attention(attn, src, tgt)
    # 'house' row = mean of its two piece rows; 'Haus' column = sum of its two piece columns
    close(words, [[0.9, 0.1], [0.3, 0.4], [0.0, 0.0]])
    assert alignment_from_attention(attn, src, tgt) == [(0, 0), (1, 1)]
    shifted = shift_rows(attn)
    assert shifted[-1].tolist() == [0, 0, 0, 0] and torch.equal(shifted[:-1], attn[1:])
    assert alignment_from_attention(shifted, src, tgt) == [(0, 1), (1, 0), (1, 2)]
    # head average over a (heads, T, S) stack equals the direct computation on the mean
    heads = torch.stack([attn, attn.flip(1)])
    assert alignment_from_attention(heads.mean(0), src, tgt) == alignment_from_attention((attn + attn.flip(1)) / 2, src, tgt)
    with pytest.raises(ValueError, match="does not match"):
        alignment_from_attention(attn[:3], src, tgt)
