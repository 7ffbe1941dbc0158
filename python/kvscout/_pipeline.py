"""A preset's whole host step with its parts owned (presets::pipeline_host)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._parts import _NO_TABLE, _ORDERS, _PAGES, KVView, _empty, _lib, _readonly
from ._policy import _STYLES, DecodeShape, _lookup, _plan_arrays

_make = _lib.make_pipeline


@dataclass(frozen=True)
class FetchStats:
    """What a pipeline fetched, per layer, accumulated over its steps (fetch_stats): rows, their
    bytes (K and V), rows also selected the step before, rows the correction step added."""

    rows: np.ndarray
    bytes: np.ndarray
    reused: np.ndarray
    corrected: np.ndarray


def _dtype_name(dtype) -> str:
    """"float32" for np.float32, np.dtype("float32"), torch.float32 or "float32"."""
    try:
        return np.dtype(dtype).name
    except TypeError:  # torch's dtypes, "bfloat16"
        return str(dtype).removeprefix("torch.")


class Pipeline:
    """A preset's host decode step over a model's layers (presets::pipeline_host): its InfiniGen
    policies (the calibration's plans), one top-k selector per speculated layer at its share of
    the budget, the correction step where the preset has one, the gather and every buffer, built
    once. Per layer i of a step:

        pipe.speculate(i + 1, x_i, positions, seq_lens, kv[i + 1])  # layer i's input x_i
        out = pipe.attend(i, q_i, seq_lens, kv[i], k_cur=k, v_cur=v)

    (dense below the preset's skip_layers: no speculate), and each token's keys once cached:
    pipe.append(i, keys, seq_ids, token_ids). The caches are KVViews of the pipeline's `layout`
    and `pages`; dtype is their element type (float32, float16, bfloat16); head_dim 64 or 128.

    shape: a DecodeShape with num_layers, d_model, max_tokens (a contiguous cache's T) and scale.
    w_q: each layer's W_Q [num_q_heads * head_dim, d_model] (float32, float16 or bfloat16; read
    here, not kept); b_q: None or each layer's bias. threads: the gather's and attention's.
    """

    def __init__(self, p, shape: DecodeShape, cal, budget: float, w_q, b_q=None, *, dtype,
                 layout: str = "hnd", pages: str | None = None, threads: int = 1):
        from .presets import budgets

        order = _lookup(_ORDERS, layout, "layout")
        kind = _lookup(_PAGES, pages, "pages")
        plans = [pl for pl in cal.plans if pl is not None]
        if not plans:
            raise ValueError("the calibration has no plans (no speculated layer)")
        if plans[0].mode != p.mode:
            raise ValueError(f"the calibration's plans are {plans[0].mode}, {p.name}'s mode is "
                             f"{p.mode}: calibrate with this preset (presets.calibrate)")
        rope = plans[0].rope
        style = _lookup(_STYLES, rope.style, "rope style")
        if len(cal.plans) != shape.num_layers:
            raise ValueError(f"the calibration covers {len(cal.plans)} layers, expected the "
                             f"shape's num_layers {shape.num_layers}")

        def flat(per_layer):
            return [a for pl in per_layer for a in _plan_arrays(pl)]

        corr = flat(cal.correction_plans) if cal.correction_plans is not None else []
        mass = cal.mass_curves if cal.mass_curves is not None else np.zeros((0,))
        w = list(w_q)
        b = [] if b_q is None else [_NO_TABLE if t is None else t for t in b_q]
        self.shape, self.layout, self.pages = shape, layout, pages
        self.dtype = _dtype_name(dtype)
        try:
            calls = _make(p.name, p.fields(), shape.model_dims(), float(shape.scale),
                          float(rope.theta), style, float(budget), int(threads), kind, order,
                          self.dtype, int(cal.first_layer), flat(cal.plans), corr, mass, w, b)
        except BufferError as e:
            raise _readonly(e, w_q=w[0] if w else None) from None
        (self._append, self._speculate, self._attend, self._stats, self._selection,
         rotated, self._time_steps) = calls
        self.skip_layers = p.skip_layers
        self.rotated_keys = bool(rotated())
        """append() takes keys after RoPE (True; the rope_planes and post_rope_skew modes) or
        before (pre_rope_folded)."""
        self.budgets = budgets(p, shape, budget, cal.layer_shares(p, budget))

    def _check(self, kv: KVView):
        if not isinstance(kv, KVView):
            raise TypeError(f"kv: {type(kv).__name__}, expected a kvscout.KVView")
        if kv.layout != self.layout or kv.pages != self.pages:
            raise ValueError(f"kv: a {kv.layout} cache with pages={kv.pages!r}, expected the "
                             f"pipeline's {self.layout} with pages={self.pages!r}")

    def append(self, layer: int, keys, seq_ids, token_ids):
        """Layer `layer`'s partial keys of keys [n, H, D] (see rotated_keys): token j of sequence
        seq_ids[j] at position token_ids[j] (int32). A layer below skip_layers keeps none."""
        self._append(layer, keys, seq_ids, token_ids)

    def speculate(self, layer: int, x, positions, seq_lens, kv: KVView, *, seq_ids=None):
        """Layer `layer`'s rows, predicted from x [S, d_model] float32 (layer - 1's input) for the
        tokens at positions [S], then fetched from kv: seq_lens [S] int32 cached tokens."""
        self._check(kv)
        self._speculate(layer, x, positions, seq_lens, _NO_TABLE if seq_ids is None else seq_ids,
                        kv._tensors)

    def attend(self, layer: int, q, seq_lens, kv: KVView, *, k_cur=None, v_cur=None, out=None,
               seq_ids=None):
        """Layer `layer`'s attention for q [S, Hq, D] float32 (after RoPE): over the rows
        speculate() fetched and the ones the correction adds (dense below skip_layers), and the
        current token k_cur / v_cur [S, H, D] where given. Returns out [S, Hq, D] float32."""
        self._check(kv)
        if (k_cur is None) != (v_cur is None):
            raise ValueError("k_cur and v_cur: pass both (the current token) or neither")
        if out is None:
            sh = self.shape
            out = _empty(q, (sh.num_seqs, sh.num_q_heads, sh.head_dim), np.float32)
        try:
            self._attend(layer, q, seq_lens, _NO_TABLE if seq_ids is None else seq_ids,
                         kv._tensors, _NO_TABLE if k_cur is None else k_cur,
                         _NO_TABLE if v_cur is None else v_cur, out)
        except BufferError as e:
            raise _readonly(e, q=q, seq_lens=seq_lens, k_cur=k_cur, v_cur=v_cur, out=out) from None
        return out

    def stats(self) -> FetchStats:
        out = np.zeros((4, self.shape.num_layers), np.int64)
        self._stats(out)
        return FetchStats(*out)

    def last_selection(self, layer: int):
        """The rows layer `layer`'s last speculation selected: (indices [S, H, capacity], counts
        [S, H]), int32, ascending."""
        return self._copy(layer, False, self.budgets.capacity)

    def last_correction(self):
        """The rows the last attend()'s correction added (indices, counts), or None without a
        correction step."""
        if self.budgets.correction_capacity == 0:
            return None
        return self._copy(0, True, self.budgets.capacity)

    def _copy(self, layer, corrected, capacity):
        sh = self.shape
        idx = np.zeros((sh.num_seqs, sh.num_kv_heads, capacity), np.int32)
        cnt = np.zeros((sh.num_seqs, sh.num_kv_heads), np.int32)
        self._selection(layer, corrected, idx, cnt)
        return idx, cnt
