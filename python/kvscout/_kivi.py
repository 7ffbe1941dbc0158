"""KIVI-quantised caches (kivi_layout, kivi_host_storage, kivi_append_host, kivi_gathered_rows_host)."""

from __future__ import annotations

import numpy as np

from ._parts import _empty, _lib, _readonly

_sizes = _lib.kivi_sizes
_append = _lib.kivi_append
_gather = _lib.kivi_gather
_attention = _lib.kivi_attention
_rows = _lib.kivi_rows
_NONE = np.zeros((0,), np.float32)


def _aligned_zeros(nbytes: int, alignment: int = 64) -> np.ndarray:
    raw = np.zeros(nbytes + alignment, dtype=np.uint8)
    off = (-raw.ctypes.data) % alignment
    return raw[off:off + nbytes]


class KIVICache:
    """K and V of num_seqs sequences, capacity tokens each, quantised as KIVI does (Liu et al.,
    ICML'24; kivi_layout): keys per channel over groups of `group` tokens, values per token over
    groups of `group` channels, at `bits` (2: KIVI-2, 4: KIVI-4), scales and zeros float16; the
    `residual` most recent tokens stay in full precision (dtype: float32, float16, bfloat16).
    head_dim 64 or 128. docs/layouts.md has the rule.

    Its buffers are uint8 arrays (k_codes, v_records: what a fetch moves; k_params, k_residual,
    v_residual: resident) and seq_lens int32 [num_seqs], the tokens each sequence holds."""

    def __init__(self, num_seqs: int, num_kv_heads: int, capacity: int, head_dim: int,
                 bits: int = 2, *, dtype="float16", group: int = 32, residual: int = 128):
        from ._pipeline import _dtype_name

        self.dtype = _dtype_name(dtype)
        self.num_seqs, self.num_kv_heads, self.capacity, self.head_dim = (
            num_seqs, num_kv_heads, capacity, head_dim)
        self.bits, self.group, self.residual = bits, group, residual
        self._cfg = [num_seqs, num_kv_heads, capacity, head_dim, bits, bits, group, residual]
        sizes = list(_sizes(self._cfg, self.dtype))
        self.k_codes, self.v_records, self.k_params, self.k_residual, self.v_residual = (
            _aligned_zeros(n) for n in sizes[:5])
        self.k_row_bytes, self.v_row_bytes = int(sizes[5]), int(sizes[6])
        self.seq_lens = np.zeros(num_seqs, np.int32)
        self._buffers = [self.k_codes, self.v_records, self.k_params, self.k_residual,
                         self.v_residual]

    def append(self, s: int, k, v):
        """Appends k / v [n, num_kv_heads, head_dim] (the cache's dtype) to sequence s, quantising
        by KIVI's rule as tokens leave the full-precision window; seq_lens[s] += n."""
        try:
            _append(self._cfg, self.dtype, self._buffers, self.seq_lens, int(s), k, v)
        except BufferError as e:
            raise _readonly(e, k=k, v=v) from None

    def gather(self, indices, counts, *, k_rows=None, v_rows=None, threads: int = 1):
        """The selected tokens' records, still quantised: indices [S, H, capacity] (each below
        quantized_lens()[s]), counts [S, H] int32 -> (k_rows [S, H, capacity, k_row_bytes],
        v_rows [S, H, capacity, v_row_bytes]) uint8."""
        S, H, cap = indices.shape
        if k_rows is None:
            k_rows = _empty(indices, (S, H, cap, self.k_row_bytes), np.uint8)
        if v_rows is None:
            v_rows = _empty(indices, (S, H, cap, self.v_row_bytes), np.uint8)
        try:
            _gather(self._cfg, self.dtype, self._buffers, self.seq_lens, indices, counts, k_rows,
                    v_rows, threads)
        except BufferError as e:
            raise _readonly(e, indices=indices, counts=counts, k_rows=k_rows,
                            v_rows=v_rows) from None
        return k_rows, v_rows

    def attend(self, k_rows, v_rows, indices, counts, q, scale: float, *, k_cur=None, v_cur=None,
               out=None):
        """Decode attention of q [S, Hq, D] float32 over the gathered records, each sequence's
        full-precision window (never fetched) and the current token k_cur / v_cur [S, H, D]:
        out [S, Hq, D] float32."""
        if (k_cur is None) != (v_cur is None):
            raise ValueError("k_cur and v_cur: pass both (the current token) or neither")
        if out is None:
            out = _empty(q, tuple(q.shape), np.float32)
        try:
            _attention(self._cfg, self.dtype, self._buffers, self.seq_lens, indices, counts,
                       k_rows, v_rows, q, out, _NONE if k_cur is None else k_cur,
                       _NONE if v_cur is None else v_cur, float(scale))
        except BufferError as e:
            raise _readonly(e, q=q, k_rows=k_rows, v_rows=v_rows, out=out) from None
        return out

    def quantized_lens(self) -> np.ndarray:
        """Per sequence the tokens a selector chooses among and a gather fetches (the rest, the
        newest, stay in the window that attention reads)."""
        lens = np.zeros(self.num_seqs, np.int32)
        _rows(self._cfg, self.dtype, self._buffers, self.seq_lens, _NONE, _NONE, lens)
        return lens

    def rows(self):
        """Every cached row as attention reads it: (keys, values) [S, H, capacity, D] float32,
        token t < seq_lens[s] written (quantised ones dequantised), and quantized_lens [S]."""
        shape = (self.num_seqs, self.num_kv_heads, self.capacity, self.head_dim)
        keys, values = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        lens = np.zeros(self.num_seqs, np.int32)
        _rows(self._cfg, self.dtype, self._buffers, self.seq_lens, keys, values, lens)
        return keys, values, lens
