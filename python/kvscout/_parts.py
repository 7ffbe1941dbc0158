"""The host parts: thin wrappers that size and allocate what the caller does not pass, then call
the C++ functions of python/csrc/host_parts.cpp (loaded through apache-tvm-ffi)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm_ffi

_lib = tvm_ffi.load_module(str(Path(__file__).resolve().parent / "libkvscout_host_ffi.so"))
_topk_workspace_bytes = _lib.topk_workspace_bytes
_topk_select = _lib.topk_select
_gather = _lib.gather
_threshold_workspace_bytes = _lib.threshold_workspace_bytes
_threshold_select = _lib.threshold_select
_correction_workspace_bytes = _lib.correction_workspace_bytes
_correction_select = _lib.correction_select
_gather_paged = _lib.gather_paged
_decode_attention = _lib.decode_attention
_make_gather = _lib.make_gather
_describe = _lib.device_status_describe

_ORDERS = {"hnd": 0, "nhd": 1}
_WORKSPACE_ALIGNMENT = 64


@dataclass(frozen=True)
class KeepSet:
    """Tokens a selector always keeps: the first `sinks` and the last `recent` of each row."""

    sinks: int = 0
    recent: int = 0


def _dims(x, names: str, what: str):
    """x's shape, which must have len(names.split()) dimensions (else ValueError naming them)."""
    want = names.split()
    shape = tuple(getattr(x, "shape", ()))
    if len(shape) != len(want):
        raise ValueError(f"{what}: shape {list(shape)}, expected [{', '.join(want)}]")
    return shape


def _readonly(err, **arrays):
    """The ValueError for a read-only NumPy array, which tvm-ffi cannot pass (BufferError)."""
    names = [n for n, a in arrays.items() if isinstance(a, np.ndarray) and not a.flags.writeable]
    return ValueError(f"{', '.join(names) or 'an argument'}: a read-only NumPy array; kvscout's "
                      f"binding passes writeable arrays only (pass a writeable copy): {err}")


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _empty(like, shape, dtype):
    """An uninitialised array of the caller's kind (NumPy, or torch on the same device)."""
    if _is_torch(like):
        import torch

        return torch.empty(shape, dtype=getattr(torch, np.dtype(dtype).name), device=like.device)
    return np.empty(shape, dtype=dtype)


def _empty_same(like, shape):
    if _is_torch(like):
        import torch

        return torch.empty(shape, dtype=like.dtype, device=like.device)
    return np.empty(shape, dtype=like.dtype)


def _selection_buffers(scores, capacity, indices, counts, workspace, workspace_bytes):
    """A selector's outputs and workspace where the caller gave none: indices [S, H, capacity]
    and counts [S, H] int32 of the scores' kind, and the workspace. workspace_bytes() (which
    checks the configuration) runs before anything is allocated."""
    if indices is not None and counts is not None and workspace is not None:
        return indices, counts, workspace
    nbytes = workspace_bytes()
    S, H = scores.shape[0], scores.shape[1]
    return (_empty(scores, (S, H, capacity), np.int32) if indices is None else indices,
            _empty(scores, (S, H), np.int32) if counts is None else counts,
            _workspace(nbytes) if workspace is None else workspace)


def topk_workspace_bytes(num_seqs: int, num_kv_heads: int, max_tokens: int, capacity: int,
                         budget: int, keep: KeepSet = KeepSet(), budget_share: float = 0.0) -> int:
    """topk_selector_host::workspace_bytes of this configuration (checks it)."""
    return _topk_workspace_bytes(num_seqs, num_kv_heads, max_tokens, capacity, budget, keep.sinks,
                                 keep.recent, float(budget_share))


def _workspace(nbytes: int) -> np.ndarray:
    """A uint8 array of nbytes starting on a 64-byte boundary (every host part's alignment)."""
    raw = np.empty(nbytes + _WORKSPACE_ALIGNMENT, dtype=np.uint8)
    off = (-raw.ctypes.data) % _WORKSPACE_ALIGNMENT
    return raw[off:off + nbytes]


def topk_workspace(nbytes: int) -> np.ndarray:
    """A uint8 workspace of nbytes at the selectors' alignment (64 bytes)."""
    return _workspace(nbytes)


def topk_select(scores, seq_lens, budget: int, keep: KeepSet = KeepSet(), *,
                capacity: int | None = None, budget_share: float = 0.0, indices=None,
                counts=None, workspace=None):
    """Exact top-k per (sequence, KV head): the keep-set and the best-scoring other tokens,
    `budget` in all (or a `budget_share` of each row's length), as ascending token indices.

    scores [S, H, T] float32, seq_lens [S] int32. Returns (indices [S, H, capacity],
    counts [S, H]), int32; entries past a row's count are not written. Ties go to the lower
    token index; NaN is never chosen by score.
    """
    S, H, T = _dims(scores, "S H T", "scores")
    if capacity is None:
        capacity = indices.shape[2] if indices is not None else budget
    indices, counts, workspace = _selection_buffers(
        scores, capacity, indices, counts, workspace,
        lambda: topk_workspace_bytes(S, H, T, capacity, budget, keep, budget_share))
    try:
        _topk_select(scores, seq_lens, indices, counts, budget, keep.sinks, keep.recent,
                     float(budget_share), workspace)
    except BufferError as e:
        raise _readonly(e, scores=scores, seq_lens=seq_lens, indices=indices, counts=counts,
                        workspace=workspace) from None
    return indices, counts


_THRESHOLD_RULES = {"infinigen_mean": 0, "per_head": 1}


def threshold_workspace_bytes(num_seqs: int, num_kv_heads: int, max_tokens: int, capacity: int,
                              alpha: float, budget: int, rule: str = "per_head",
                              keep: KeepSet = KeepSet(), budget_share: float = 0.0) -> int:
    """threshold_selector_host::workspace_bytes of this configuration (checks it)."""
    if rule not in _THRESHOLD_RULES:
        raise ValueError(f"rule {rule!r}, expected one of {sorted(_THRESHOLD_RULES)}")
    return _threshold_workspace_bytes(num_seqs, num_kv_heads, max_tokens, capacity, float(alpha),
                                      budget, _THRESHOLD_RULES[rule], keep.sinks, keep.recent,
                                      float(budget_share))


def threshold_select(scores, seq_lens, alpha: float, budget: int, keep: KeepSet = KeepSet(), *,
                     rule: str = "per_head", capacity: int | None = None,
                     budget_share: float = 0.0, indices=None, counts=None, workspace=None):
    """Selection by threshold (threshold_selector_host): per (sequence, KV head) the keep-set and
    the tokens scoring within `alpha` of the row's maximum, at most `budget` in all. rule
    "per_head" (kvscout's): each row its own candidates; "infinigen_mean" (InfiniGen's): every
    row takes the mean candidate count's best tokens. scores [S, H, T] float32, seq_lens [S]
    int32. Returns (indices [S, H, capacity], counts [S, H]) int32, ascending."""
    S, H, T = _dims(scores, "S H T", "scores")
    if capacity is None:
        capacity = indices.shape[2] if indices is not None else budget
    indices, counts, workspace = _selection_buffers(
        scores, capacity, indices, counts, workspace,
        lambda: threshold_workspace_bytes(S, H, T, capacity, alpha, budget, rule, keep,
                                          budget_share))
    try:
        _threshold_select(scores, seq_lens, indices, counts, float(alpha), budget,
                          _THRESHOLD_RULES[rule], keep.sinks, keep.recent, float(budget_share),
                          workspace)
    except BufferError as e:
        raise _readonly(e, scores=scores, seq_lens=seq_lens, indices=indices, counts=counts,
                        workspace=workspace) from None
    return indices, counts


def correction_select(scores, seq_lens, spec_indices, spec_counts, extra: int, *,
                      total_share: float = 0.0, indices=None, counts=None, workspace=None):
    """The correction step's selection (correction_selector_host): per (sequence, KV head) the
    best-scoring rows the speculation did not select (spec_indices / spec_counts), `extra` at most,
    or where total_share > 0 enough to bring the row to ceil(total_share * len) rows in all.
    scores [S, H, T] float32 are the late scores (InfiniGenPolicy.score_query). Returns (indices
    [S, H, extra], counts [S, H]), int32, ascending."""
    S, H, T = _dims(scores, "S H T", "scores")
    capacity = extra if indices is None else _dims(indices, "S H capacity", "indices")[2]
    indices, counts, workspace = _selection_buffers(
        scores, capacity, indices, counts, workspace,
        lambda: _correction_workspace_bytes(S, H, T, capacity, extra, float(total_share)))
    try:
        _correction_select(scores, seq_lens, spec_indices, spec_counts, indices, counts, extra,
                           float(total_share), workspace)
    except BufferError as e:
        raise _readonly(e, scores=scores, seq_lens=seq_lens, spec_indices=spec_indices,
                        spec_counts=spec_counts, indices=indices, counts=counts,
                        workspace=workspace) from None
    return indices, counts


def gather(k_cache, v_cache, seq_lens, indices, counts, layout: str = "hnd", *, k_rows=None,
           v_rows=None, threads: int = 1):
    """The host gather: copies the selected K / V rows of a contiguous cache ("hnd": [S, H, T, D],
    "nhd": [S, T, H, D]) into [S, H, capacity, D] row buffers. Returns (k_rows, v_rows)."""
    if layout not in _ORDERS:
        raise ValueError(f"layout {layout!r}, expected 'hnd' or 'nhd'")
    S, H, cap = _dims(indices, "S H capacity", "indices")
    D = _dims(k_cache, "S H T D" if layout == "hnd" else "S T H D", "k_cache")[3]
    if k_rows is None:
        k_rows = _empty_same(k_cache, (S, H, cap, D))
    if v_rows is None:
        v_rows = _empty_same(v_cache, (S, H, cap, D))
    try:
        _gather(_ORDERS[layout], k_cache, v_cache, seq_lens, indices, counts, k_rows, v_rows,
                threads)
    except BufferError as e:
        raise _readonly(e, k_cache=k_cache, v_cache=v_cache, seq_lens=seq_lens, indices=indices,
                        counts=counts, k_rows=k_rows, v_rows=v_rows) from None
    return k_rows, v_rows


def gather_paged(k_pages, v_pages, indices, counts, layout: str = "nhd", *, block_table=None,
                 seq_lens=None, indptr=None, page_ids=None, last_page_len=None, k_rows=None,
                 v_rows=None, threads: int = 1):
    """The host gather out of a paged cache: pages [P, page_size, H, D] ("nhd", vLLM's and
    FlashInfer's NHD) or [P, H, page_size, D] ("hnd"), with vLLM's page table (block_table
    [S, max_blocks], seq_lens [S]) or FlashInfer's (indptr [S + 1], page_ids, last_page_len [S]),
    all int32. Returns (k_rows, v_rows), [S, H, capacity, D]."""
    if layout not in _ORDERS:
        raise ValueError(f"layout {layout!r}, expected 'hnd' or 'nhd'")
    vllm = block_table is not None or seq_lens is not None
    flashinfer = indptr is not None or page_ids is not None or last_page_len is not None
    if vllm == flashinfer or (vllm and (block_table is None or seq_lens is None)) or (
            flashinfer and (indptr is None or page_ids is None or last_page_len is None)):
        raise ValueError("the page table: pass block_table and seq_lens (vLLM), or indptr, "
                         "page_ids and last_page_len (FlashInfer)")
    S, H, cap = _dims(indices, "S H capacity", "indices")
    D = _dims(k_pages, "pages page_size H D" if layout == "nhd" else "pages H page_size D",
              "k_pages")[3]
    if k_rows is None:
        k_rows = _empty_same(k_pages, (S, H, cap, D))
    if v_rows is None:
        v_rows = _empty_same(v_pages, (S, H, cap, D))
    none = np.zeros((0,), np.int32)
    tables = ((block_table, seq_lens, none, none, none) if vllm else
              (none, none, indptr, page_ids, last_page_len))
    try:
        _gather_paged(_ORDERS[layout], k_pages, v_pages, *tables, indices, counts, k_rows, v_rows,
                      threads)
    except BufferError as e:
        raise _readonly(e, k_pages=k_pages, v_pages=v_pages, indices=indices, counts=counts,
                        k_rows=k_rows, v_rows=v_rows) from None
    return k_rows, v_rows


def decode_attention(k_rows, v_rows, indices, counts, q, scale: float, *, k_cur=None,
                     v_cur=None, out=None, probs=None):
    """Decode attention of q [S, Hq, D] (float32) over each (sequence, KV head)'s counts[s, h]
    gathered rows [S, H, capacity, D] and, where given, the current token's k_cur / v_cur
    [S, H, D]; GQA groups Hq / H query heads per KV head. Returns out [S, Hq, D] float32.
    probs [S, H, stride] float32 (stride >= capacity + 1), where given, receives each row's
    attention probability summed over its query group, the current token's after the rows (what
    H2OPolicy.observe takes)."""
    if out is None:
        out = _empty(q, _dims(q, "S Hq D", "q"), np.float32)
    if (k_cur is None) != (v_cur is None):
        raise ValueError("k_cur and v_cur: pass both (the current token) or neither")
    if k_cur is None:
        k_cur = v_cur = _empty_same(k_rows, (0,))
    try:
        _decode_attention(k_rows, v_rows, indices, counts, q, out, k_cur, v_cur, float(scale),
                          _NO_TABLE if probs is None else probs)
    except BufferError as e:
        raise _readonly(e, k_rows=k_rows, v_rows=v_rows, indices=indices, counts=counts, q=q,
                        out=out, k_cur=k_cur, v_cur=v_cur) from None
    return out


_PAGES = {None: 0, "block_table": 1, "indptr": 2}
_NO_TABLE = np.zeros((0,), np.int32)


class KVView:
    """One layer's K and V as a part reads them (kvscout::kv_view): a contiguous cache
    ([S, H, T, D] "hnd", [S, T, H, D] "nhd"; each sequence's length is the call's seq_lens), or
    pages ([P, H, page_size, D] "hnd", [P, page_size, H, D] "nhd") with vLLM's block table
    (block_table [S, max_blocks] int32, the lengths the call's seq_lens) or FlashInfer's page table
    (indptr [S + 1], page_ids, last_page_len [S], int32).

    Build one per layer and reuse it: it converts its arrays for the C++ calls once (they must
    stay where they are; write into them in place)."""

    __slots__ = ("k", "v", "layout", "pages", "_tensors")

    def __init__(self, k, v, layout: str = "hnd", *, block_table=None, indptr=None, page_ids=None,
                 last_page_len=None):
        if layout not in _ORDERS:
            raise ValueError(f"layout {layout!r}, expected 'hnd' or 'nhd'")
        flashinfer = (indptr, page_ids, last_page_len)
        if block_table is not None and any(t is not None for t in flashinfer):
            raise ValueError("the page table: pass block_table (vLLM) or indptr, page_ids and "
                             "last_page_len (FlashInfer), not both")
        if any(t is not None for t in flashinfer) and any(t is None for t in flashinfer):
            raise ValueError("FlashInfer's page table: pass indptr, page_ids and last_page_len")
        self.k, self.v, self.layout = k, v, layout
        self.pages = ("block_table" if block_table is not None else
                      "indptr" if indptr is not None else None)
        arrays = dict(k_cache=k, v_cache=v, block_table=block_table, indptr=indptr,
                      page_ids=page_ids, last_page_len=last_page_len)
        try:
            self._tensors = [tvm_ffi.from_dlpack(_NO_TABLE if a is None else a)
                             for a in arrays.values()]
        except BufferError as e:
            raise _readonly(e, **arrays) from None
        except TypeError as e:
            raise TypeError(f"KVView: expected NumPy arrays or torch tensors: {e}") from None


class Gather:
    """The host gather kept across calls (gather_executor_host): built once for one cache form
    (`layout`, `pages`, `dtype`, head_dim) and [num_seqs, num_kv_heads, capacity] selections, so
    its thread pool starts once, not on every call as gather() / gather_paged() do.

        g = kvscout.Gather(1, 8, 256, 128, dtype="float16", threads=4)
        k_rows, v_rows = g(kv, idx, cnt, seq_lens=lens)   # kv: a KVView of that form"""

    def __init__(self, num_seqs: int, num_kv_heads: int, capacity: int, head_dim: int, *, dtype,
                 layout: str = "hnd", pages: str | None = None, threads: int = 1):
        from ._pipeline import _dtype_name

        if layout not in _ORDERS:
            raise ValueError(f"layout {layout!r}, expected 'hnd' or 'nhd'")
        if pages not in _PAGES:
            raise ValueError(f"pages {pages!r}, expected None, 'block_table' or 'indptr'")
        self.layout, self.pages, self.dtype = layout, pages, _dtype_name(dtype)
        self._shape = (num_seqs, num_kv_heads, capacity, head_dim)
        self._submit = _make_gather(_PAGES[pages], _ORDERS[layout], self.dtype, head_dim,
                                    num_seqs, num_kv_heads, capacity, threads)

    def __call__(self, kv: KVView, indices, counts, *, seq_lens=None, k_rows=None, v_rows=None):
        """Copies the selected rows of kv into (k_rows, v_rows) [S, H, capacity, D] and returns
        them. seq_lens [S] int32: the lengths of a contiguous cache or a block-table one."""
        if not isinstance(kv, KVView):
            raise TypeError(f"kv: {type(kv).__name__}, expected a kvscout.KVView")
        if kv.layout != self.layout or kv.pages != self.pages:
            raise ValueError(f"kv: a {kv.layout} cache with pages={kv.pages!r}, expected the "
                             f"gather's {self.layout} with pages={self.pages!r}")
        if k_rows is None:
            k_rows = _empty_same(kv.k, self._shape)
        if v_rows is None:
            v_rows = _empty_same(kv.v, self._shape)
        try:
            self._submit(kv._tensors, _NO_TABLE if seq_lens is None else seq_lens, indices,
                         counts, k_rows, v_rows)
        except BufferError as e:
            raise _readonly(e, indices=indices, counts=counts, k_rows=k_rows,
                            v_rows=v_rows) from None
        return k_rows, v_rows


def device_status_describe(bits: int) -> str:
    """The words for a device status word (kvscout::device_status::describe)."""
    return _describe(int(bits))
