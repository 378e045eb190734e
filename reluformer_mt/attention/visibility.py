"""Which keys each query may see, kept as key ranges and a causal flag instead of a T x S mask.

Every mask fairseq hands an attention sublayer in translation is one of two simple patterns or
their combination: padding, which hides a contiguous run of keys at the start (left-padded
source) or end (right-padded target) of each sentence, and the decoder's causal mask, under which
query i (at absolute position S - T + i while decoding step by step) sees keys j <= S - T + i.
So query i of sentence b sees exactly the keys

    start_b <= j < min(end_b, i + offset + 1)          (offset = S - T when causal)

which :class:`Visibility` stores as two (B,) vectors and one integer: O(B + T) memory at any
length, where a bool mask costs T x S bytes (256 MB at L = 16384) and its int64 row sums eight
times that. Tiles of the blocked path and the C++ kernel are classified in O(1) (skipped when
nothing is visible, unmasked when everything is) and masked by column ranges per row.

A pattern the ranges cannot express (padding in the middle of a sentence, a custom bool mask)
keeps the full mask (``mask``), so every caller stays correct; only such calls pay T x S.
"""
from contextlib import contextmanager
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
from torch import Tensor

# fairseq's decoder reuses one future-mask buffer for every call (``buffered_future_mask``):
# whether a given tensor is the causal pattern is checked once per buffer, not once per call.
# An entry keeps a copy of the mask it was computed from and serves only a tensor that still
# holds the same values (issue 34): the version counter misses writes through ``.data``, a numpy
# view or a reused ``torch.from_numpy`` buffer, and inference tensors have none at all.
_CAUSAL_CHECKS: dict = {}
_RANGE_CHECKS: dict = {}
# Every layer of a forward gets the same padding mask tensor (the encoder's, the decoder's), so
# its Visibility, live query rows, counts and short-call dense mask are built once per forward
# and shared by the layers (issue 22: per-call work that does not scale with the model).
_VISIBILITY_CACHE: dict = {}
_LIVE_ROWS: dict = {}
_CACHE_MAX = 8
# a Visibility keeps its dense mask for the next layer up to this many entries (8 MB of bool;
# the direct route's calls are far below it, long reference-path calls are not kept)
DENSE_CACHE_ELEMENTS = 2 ** 23
_CHECK_ROWS = 256  # rows per chunk when checking a mask: no T x S temporary
# masks above this many elements are not remembered (their copy would cost what the check saves)
_SNAPSHOT_ELEMENTS = 2 ** 22


@dataclass(frozen=True)
class Visibility:
    """Visible keys of a (B, T queries, S keys) attention call; see the module docstring.

    ``starts`` / ``ends`` are (B,) int64 tensors on the keys' device (None: 0 / S for every
    sentence); ``causal_offset`` is S - T for causal self-attention, None otherwise; ``mask``,
    when set, is the whole truth: a (B or 1, 1, T, S) bool tensor for patterns ranges cannot express.
    ``padding``, when set, is the (B, S) bool key padding mask (True = padding) the ranges were
    derived from on the device; they describe it only where ``ranges_hold()`` (padding in the
    middle of a sentence: :meth:`resolved` gives the dense-mask form the kernels take).
    """

    tgt_len: int
    src_len: int
    starts: Optional[Tensor] = None
    ends: Optional[Tensor] = None
    causal_offset: Optional[int] = None
    mask: Optional[Tensor] = None
    padding: Optional[Tensor] = None

    # ------------------------------------------------------------------ construction
    @staticmethod
    def from_padding(tgt_len: int, src_len: int, key_padding_mask: Optional[Tensor] = None,
                     causal: bool = False, extra_mask: Optional[Tensor] = None) -> "Visibility":
        """From fairseq's (B, S) key padding mask (True = padding), a causal flag and an optional
        bool (T, S) mask of further hidden keys (True = hidden) that is not the causal pattern.

        Without ``extra_mask`` the result is remembered per padding mask tensor (its storage, layout
        and values) and call shape: the layers of one forward share one object and what it computes."""
        if extra_mask is not None:
            return Visibility._from_padding(tgt_len, src_len, key_padding_mask, causal, extra_mask)
        shape = (tgt_len, src_len, bool(causal))
        found = _recall(_VISIBILITY_CACHE, key_padding_mask, shape)
        if found is _MISSING:
            found = Visibility._from_padding(tgt_len, src_len, key_padding_mask, causal, None)
            _remember(_VISIBILITY_CACHE, key_padding_mask, shape, found)
        return found

    @staticmethod
    def _from_padding(tgt_len: int, src_len: int, key_padding_mask: Optional[Tensor], causal: bool,
                      extra_mask: Optional[Tensor]) -> "Visibility":
        offset = src_len - tgt_len if causal else None
        if key_padding_mask is None:
            vis = Visibility(tgt_len, src_len, causal_offset=offset)
        else:
            # the ranges and whether they describe the padding stay on the device: the dense mask
            # and the counts are built from the padding itself, so the short calls of training ask
            # the host nothing; routes that need host bounds ask once (``resolved``, issue 64)
            padding = key_padding_mask.bool()
            starts, ends, hold = _device_ranges(padding)
            vis = Visibility(tgt_len, src_len, starts, ends, offset, padding=padding)
            object.__setattr__(vis, "_hold_flag", hold)
        if extra_mask is not None:
            return vis._with_mask(vis.dense(extra_mask.device) & ~extra_mask.view(1, 1, tgt_len, src_len))
        return vis

    @staticmethod
    def from_mask(keep: Tensor) -> "Visibility":
        """From a (B or 1, 1, T, S) bool mask, True where a key is visible."""
        return Visibility(keep.size(-2), keep.size(-1), mask=keep)

    def _with_mask(self, mask: Tensor) -> "Visibility":
        return Visibility(self.tgt_len, self.src_len, mask=mask)

    # ------------------------------------------------------------------ queries
    @property
    def batch(self) -> int:
        """Rows of the pattern: B, or 1 when it is the same for every sentence."""
        if self.mask is not None:
            return self.mask.size(0)
        return self.starts.numel() if self.starts is not None else 1

    def ranges_hold(self) -> bool:
        """Whether ``starts`` / ``ends`` describe the visible keys (always, unless built from a
        padding mask with padding inside a sentence). Asks the host once, with the bounds."""
        if self.padding is None:
            return True
        self._bounds()
        return self.__dict__["_hold"]

    def resolved(self) -> "Visibility":
        """This pattern as the kernels and tile classifiers take it: key ranges where they hold,
        else the dense mask (one host copy for a padding mask's check and bounds)."""
        return self if self.mask is not None or self.ranges_hold() else self._with_mask(self.dense())

    def kernel_range_check(self) -> Optional[Tuple[Tensor, Tensor]]:
        """(the ranges' check, the padding mask) for a CPU kernel that reads the check itself, while
        the host has not been asked yet; None when nothing is left to check (``resolved()`` holds)."""
        if self.padding is None or self.mask is not None or "_hold" in self.__dict__:
            return None
        hold = self.__dict__["_hold_flag"]
        return (hold, self.padding) if hold.device.type == "cpu" else None

    def _bounds(self) -> Tuple[List[int], List[int]]:
        """Python lists of starts and ends (one host sync per object, cached)."""
        cached = self.__dict__.get("_bounds_cache")
        if cached is None:
            n = self.batch
            if self.padding is not None:
                hold, cached = self._host_ranges()
                object.__setattr__(self, "_hold", hold)
            else:
                starts = self.starts.tolist() if self.starts is not None else [0] * n
                ends = self.ends.tolist() if self.ends is not None else [self.src_len] * n
                cached = (starts, ends)
            object.__setattr__(self, "_bounds_cache", cached)
        return cached

    def _host_ranges(self) -> Tuple[bool, Tuple[List[int], List[int]]]:
        """(whether the ranges hold, their bounds as lists) of this padding mask: one copy for the
        check and the bounds, shared by every call shape of the mask (the encoder's self- and the
        decoder's cross-attention), since it waits for the device."""
        found = _recall(_RANGE_CHECKS, self.padding)
        if found is _MISSING:
            B = self.starts.numel()
            host = torch.cat([self.starts, self.ends, self.__dict__["_hold_flag"].view(1)]).tolist()
            found = (bool(host[-1]), (host[:B], host[B:2 * B]))
            _remember(_RANGE_CHECKS, self.padding, (), found)
        return found

    def row_end(self, i: int, end: int) -> int:
        """One past the last key query i sees, for a sentence whose keys end at ``end``."""
        return end if self.causal_offset is None else min(end, i + self.causal_offset + 1)

    @property
    def all_visible(self) -> bool:
        """True when every query sees every key (no mask needed at all)."""
        cached = self.__dict__.get("_all_cache")
        if cached is None:
            if self.mask is not None:
                cached = bool(self.mask.all())
            elif not self.ranges_hold():
                cached = self.resolved().all_visible
            else:
                starts, ends = self._bounds()
                cached = (all(s == 0 for s in starts) and all(e == self.src_len for e in ends)
                          and self.row_end(0, self.src_len) == self.src_len)
            object.__setattr__(self, "_all_cache", cached)
        return cached

    def _memo(self, what: str, device, compute):
        """``compute()`` once per object, device and version of the range tensors (a caller that
        changes ``starts`` / ``ends`` in place gets fresh results); callers must not modify it."""
        tensors = [t for t in (self.starts, self.ends, self.mask) if t is not None]
        if any(t.is_inference() for t in tensors):  # no version counter to key on: computed each time
            return compute()
        key = (what, str(device), tuple(t._version for t in tensors))
        memo = self.__dict__.get("_memo_cache")
        if memo is None:
            memo = {}
            object.__setattr__(self, "_memo_cache", memo)
        if key not in memo:
            memo[key] = compute()
        return memo[key]

    def n_visible(self, device=None) -> Tensor:
        """(B or 1, 1, T, 1) int64: how many keys each query sees (computed once per object and
        device; not to be modified in place)."""
        return self._memo("n_visible", device, lambda: self._n_visible(device))

    def _n_visible(self, device=None) -> Tensor:
        if self.mask is not None:
            return count_visible(self.mask)
        if self.padding is not None:
            return self._n_visible_of_padding(device)
        device = device if device is not None else (self.starts.device if self.starts is not None else None)
        T, S = self.tgt_len, self.src_len
        starts = (self.starts if self.starts is not None else torch.zeros(1, dtype=torch.long, device=device)).view(-1, 1)
        ends = (self.ends if self.ends is not None else torch.full((1,), S, dtype=torch.long, device=device)).view(-1, 1)
        ends = ends.to(device) if device is not None else ends
        starts = starts.to(ends.device)
        if self.causal_offset is not None:
            positions = torch.arange(T, device=ends.device).view(1, T) + self.causal_offset + 1
            ends = torch.minimum(ends, positions)
        counts = (ends - starts).clamp_(min=0)
        return counts.expand(counts.size(0), T).reshape(-1, 1, T, 1)

    def _n_visible_of_padding(self, device=None) -> Tensor:
        """Counts from the padding mask itself (exact whether or not the ranges hold)."""
        T, S = self.tgt_len, self.src_len
        real = ~self.padding.to(device) if device is not None else ~self.padding
        if self.causal_offset is None:
            counts = real.sum(1, keepdim=True).expand(-1, T)
        else:  # query i sees the real keys j <= i + offset: a running count read at that key
            last = torch.arange(T, device=real.device) + self.causal_offset
            counts = real.cumsum(1).index_select(1, last.clamp(0, S - 1)).masked_fill_(last.view(1, T) < 0, 0)
        return counts.reshape(-1, 1, T, 1)

    def dense(self, device=None) -> Tensor:
        """The (B or 1, 1, T, S) bool mask, True where visible (T x S: the reference path only)."""
        if self.mask is not None:
            return self.mask
        if self.batch * self.tgt_len * self.src_len > DENSE_CACHE_ELEMENTS:
            return self.tile(0, self.tgt_len, 0, self.src_len, device)
        return self._memo("dense", device, lambda: self.tile(0, self.tgt_len, 0, self.src_len, device))

    def tile(self, i0: int, i1: int, j0: int, j1: int, device=None) -> Tensor:
        """The bool mask of queries i0..i1 x keys j0..j1, shape (B or 1, 1, i1 - i0, j1 - j0)."""
        if self.mask is not None:
            return self.mask[:, :, i0:i1, j0:j1]
        device = device if device is not None else (self.starts.device if self.starts is not None else None)
        cols = torch.arange(j0, j1, device=device).view(1, 1, 1, -1)
        keep = torch.ones(1, 1, i1 - i0, j1 - j0, dtype=torch.bool, device=device)
        if self.padding is not None:  # exact for any padding, ranges or not
            keep = keep & ~self.padding[:, j0:j1].to(cols.device).view(-1, 1, 1, j1 - j0)
        elif self.starts is not None:
            keep = keep & (cols >= self.starts.to(cols.device).view(-1, 1, 1, 1))
        if self.ends is not None and self.padding is None:
            keep = keep & (cols < self.ends.to(cols.device).view(-1, 1, 1, 1))
        if self.causal_offset is not None:
            rows = torch.arange(i0, i1, device=device).view(1, 1, -1, 1)
            keep = keep & (cols <= rows + self.causal_offset)
        return keep

    def tile_kind(self, i0: int, i1: int, j0: int, j1: int) -> int:
        """0: no query of the tile sees any of its keys; 1: all see all; 2: mixed."""
        if self.mask is not None:
            tile = self.mask[:, :, i0:i1, j0:j1]
            return 0 if not bool(tile.any()) else (1 if bool(tile.all()) else 2)
        if self.kernel_range_check() is not None:
            # a CPU padding mask not yet checked on the host: the causal flag alone may skip the
            # tile; any other is masked from the padding itself (exact, and nothing waits)
            return 0 if self.causal_offset is not None and j0 > i1 - 1 + self.causal_offset else 2
        if not self.ranges_hold():
            return self.resolved().tile_kind(i0, i1, j0, j1)
        starts, ends = self._bounds()
        any_visible = any(max(s, j0) < min(self.row_end(i1 - 1, e), j1) for s, e in zip(starts, ends))
        if not any_visible:
            return 0
        all_visible = all(s <= j0 and self.row_end(i0, e) >= j1 for s, e in zip(starts, ends))
        return 1 if all_visible else 2

    def repeat_interleave(self, repeats: int) -> "Visibility":
        """Each sentence's pattern repeated (beam search's copies of one sentence)."""
        if self.mask is not None:
            return self._with_mask(self.mask.repeat_interleave(repeats, 0) if self.mask.size(0) > 1 else self.mask)
        rep = (lambda t: None if t is None else t.repeat_interleave(repeats, 0))
        copy = Visibility(self.tgt_len, self.src_len, rep(self.starts), rep(self.ends), self.causal_offset,
                          padding=rep(self.padding))
        if self.padding is not None:
            object.__setattr__(copy, "_hold_flag", self.__dict__["_hold_flag"])
        return copy


def padding_ranges(key_padding_mask: Tensor) -> Optional[Tuple[Tensor, Tensor]]:
    """(starts, ends) of the unpadded keys of each sentence when padding is a run at the start or
    the end of every row (fairseq's left-padded sources, right-padded targets); None otherwise
    (one host copy, remembered per mask as a Visibility's check is)."""
    vis = Visibility.from_padding(1, key_padding_mask.size(1), key_padding_mask)
    return (vis.starts, vis.ends) if vis.ranges_hold() else None


def live_query_rows(padding: Tensor, always: bool = False) -> Optional[Tensor]:
    """(B, 1, T) bool, True at the real query positions of a (B, T) padding mask (True =
    padding); None when no position is padding (``always``: the mask then too, without asking the
    host whether any position is padding). Remembered per mask tensor, as the ranges are."""
    found = _recall(_LIVE_ROWS, padding, (always,))
    if found is _MISSING:
        found = ~padding.bool().view(padding.size(0), 1, padding.size(-1))
        if not always and not bool(padding.any()):
            found = None
        _remember(_LIVE_ROWS, padding, (always,), found)
    return found


_MISSING = object()
# Inside ``one_batch()`` (a model's whole forward), a mask whose entry was computed or compared in the
# block is trusted by place, layout and version for the rest of it: fairseq builds each padding mask
# once per forward and writes none, so the layers' later calls need no comparison (``torch.equal``
# waits for the values: one host synchronisation per attention call, issue 64). A padding mask the
# block has not seen is a new batch's: its entries are computed afresh, not compared. The block's
# end forgets everything; a causal mask kept across forwards is compared once per forward (issue 34).
_TRUSTED: Optional[dict] = None


@contextmanager
def one_batch():
    """Masks compared once are trusted for the rest of the block (see ``_TRUSTED``); nests."""
    global _TRUSTED
    outer = _TRUSTED
    _TRUSTED = {} if outer is None else outer
    try:
        yield
    finally:
        _TRUSTED = outer


_KNOWN_CAUSAL: dict = {}  # a namespace of ``_TRUSTED``: masks built causal in this forward


def known_causal(mask: Tensor) -> Tensor:
    """``mask``, just built as the causal pattern by the caller: for the rest of ``one_batch``,
    ``is_causal_mask`` answers True for it without comparing any value."""
    _trust(_KNOWN_CAUSAL, _tensor_key(mask, ()), mask)
    return mask


def in_one_batch() -> bool:
    return _TRUSTED is not None


def _trust(cache: dict, key: tuple, t: Optional[Tensor]) -> None:
    """``cache``'s entry ``key`` holds ``t``'s values: trusted for the rest of ``one_batch``."""
    if _TRUSTED is not None and t is not None and not t.is_inference():
        _TRUSTED[(id(cache), key)] = (t, t._version)  # the reference keeps t's id from being reused


def _trusted(cache: dict, key: tuple, t: Tensor) -> bool:
    """By place, layout and version, not identity: fairseq hands each layer a fresh slice of its
    future-mask buffer; the kept reference holds the memory, so the place is the same tensor's."""
    entry = None if _TRUSTED is None else _TRUSTED.get((id(cache), key))
    return entry is not None and not t.is_inference() and entry[1] == t._version


def _tensor_key(t: Optional[Tensor], extra: tuple) -> tuple:
    """Where a tensor lives and how it is laid out (its values are compared on every use)."""
    if t is None:
        return (None,) + extra
    return (t.data_ptr(), t.dtype, t.device, tuple(t.shape), t.stride()) + extra


def _recall(cache: dict, t: Optional[Tensor], extra: tuple = ()):
    """What was remembered for tensor ``t`` (and ``extra``), or _MISSING: an entry serves only a
    tensor holding the values it was computed from (one comparison of a B x S mask per call;
    the version counter is not enough, see the caches' comment)."""
    key = _tensor_key(t, extra)
    entry = cache.get(key)
    if entry is None:
        return _MISSING
    snapshot, value = entry
    if t is not None and not _trusted(cache, key, t):
        if _TRUSTED is not None and cache is not _CAUSAL_CHECKS and not t.is_inference():
            # inside a forward, a padding mask not yet seen in it is a new batch's: recomputing
            # takes one sync, comparing first took one more whenever the batch differs
            return _MISSING
        if not torch.equal(snapshot, t):
            return _MISSING
        _trust(cache, key, t)
    return value


def _remember(cache: dict, t: Optional[Tensor], extra: tuple, value) -> None:
    if t is not None and t.numel() > _SNAPSHOT_ELEMENTS:
        return
    if len(cache) >= _CACHE_MAX:
        cache.pop(next(iter(cache)))
    key = _tensor_key(t, extra)
    cache[key] = (None if t is None else t.clone(), value)
    _trust(cache, key, t)  # its values are the snapshot's


def _device_ranges(padding: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """(starts, ends, hold) of a (B, S) bool padding mask, all on its device: the unpadded keys of
    each sentence as a range, and a 0-dim bool, True when padding is a run at the start or the end
    of every row (fairseq's left-padded sources, right-padded targets) so that the ranges hold."""
    S = padding.size(1)
    n_pad = padding.sum(1)
    positions = torch.arange(S, device=padding.device).view(1, S)
    is_left = (padding == (positions < n_pad.view(-1, 1))).all(1)
    is_right = (padding == (positions >= (S - n_pad).view(-1, 1))).all(1)
    starts = torch.where(is_left, n_pad, torch.zeros_like(n_pad))
    ends = torch.where(is_left, torch.full_like(n_pad, S), S - n_pad)
    return starts, ends, (is_left | is_right).all()


def is_causal_mask(attn_mask: Tensor, tgt_len: int, src_len: int) -> bool:
    """Whether a (T, S) float (0 / -inf) or bool (True = hidden) mask is exactly the causal
    pattern (key j hidden from query i iff j > i + S - T). Checked in row chunks (no T x S
    temporary) once per mask buffer, then remembered."""
    if attn_mask.dim() != 2 or attn_mask.shape != (tgt_len, src_len):
        return False
    if _trusted(_KNOWN_CAUSAL, _tensor_key(attn_mask, ()), attn_mask):
        return True
    found = _recall(_CAUSAL_CHECKS, attn_mask)
    if found is not _MISSING:
        return found
    offset = src_len - tgt_len
    cols = torch.arange(src_len, device=attn_mask.device).view(1, -1)
    answer = True
    for i0 in range(0, tgt_len, _CHECK_ROWS):
        chunk = attn_mask[i0:i0 + _CHECK_ROWS]
        rows = torch.arange(i0, i0 + chunk.size(0), device=attn_mask.device).view(-1, 1)
        hidden = cols > rows + offset
        if attn_mask.dtype == torch.bool:
            ok = bool((chunk == hidden).all())
        else:
            ok = bool((torch.isneginf(chunk) == hidden).all()) and bool((chunk.masked_fill(hidden, 0) == 0).all())
        if not ok:
            answer = False
            break
    _remember(_CAUSAL_CHECKS, attn_mask, (), answer)
    return answer


def count_visible(keep: Tensor, rows: int = 256) -> Tensor:
    """keep.sum(-1, keepdim=True) in row chunks: summing a bool tensor first converts it to
    int64 (8 bytes per entry; 2 GB at T = S = 16384), which the memory profile showed."""
    T = keep.size(-2)
    if T <= rows:
        return keep.sum(-1, keepdim=True)
    return torch.cat([keep[..., i:i + rows, :].sum(-1, keepdim=True) for i in range(0, T, rows)], dim=-2)


def as_visibility(keep) -> Visibility:
    """A Visibility from either a Visibility or a (B or 1, 1, T, S) bool mask (older callers)."""
    return keep if isinstance(keep, Visibility) else Visibility.from_mask(keep)


__all__ = ["Visibility", "as_visibility", "count_visible", "in_one_batch", "is_causal_mask", "known_causal",
           "live_query_rows", "one_batch", "padding_ranges"]
