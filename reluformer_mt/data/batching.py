"""Batches of items by length, for translating and force-decoding outside fairseq's iterators."""
from typing import List, Optional, Sequence


def length_batches(lengths: Sequence[int], max_tokens: int, max_items: Optional[int] = None) -> List[List[int]]:
    """Indices grouped longest first (ties in index order) so that every batch holds at most
    ``max_items`` items and items x longest <= ``max_tokens``; an item longer than
    ``max_tokens`` forms a batch of its own (it is never dropped)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches, batch, longest = [], [], 0
    for i in order:
        full = max_items is not None and len(batch) == max_items
        if batch and (max(longest, lengths[i]) * (len(batch) + 1) > max_tokens or full):
            batches.append(batch)
            batch, longest = [], 0
        batch.append(i)
        longest = max(longest, lengths[i])
    if batch:
        batches.append(batch)
    return batches
