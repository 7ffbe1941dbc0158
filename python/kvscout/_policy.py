"""The InfiniGen policy of one layer (infinigen_policy_host), its shape and its plans."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from ._parts import _empty, _lib, _readonly, _workspace

_make = _lib.make_infinigen_policy
_workspace_bytes = _lib.infinigen_workspace_bytes

_MODES = {"post_rope_skew": 0, "rope_planes": 1, "pre_rope_folded": 2}
_AGGREGATIONS = {"max_logit": 0, "mean_logit": 1, "sum_prob": 2}
_STYLES = {"split_half": 0, "interleaved": 1}


@dataclass(frozen=True)
class DecodeShape:
    """One decode step's dimensions (kvscout::decode_shape): every part reads the fields it needs.
    max_tokens is the cache length per sequence (the score rows' stride)."""

    num_seqs: int
    num_kv_heads: int
    num_q_heads: int
    head_dim: int
    d_model: int = 0
    max_tokens: int = 0
    scale: float = 0.0
    num_layers: int = 1

    def dims(self):
        return [self.num_seqs, self.num_kv_heads, self.num_q_heads, self.head_dim, self.d_model,
                self.max_tokens]

    def model_dims(self):
        return [self.num_layers] + self.dims()


@dataclass(frozen=True)
class RopeConfig:
    head_dim: int
    theta: float = 10000.0
    style: str = "split_half"  # or "interleaved"


@dataclass(frozen=True)
class SkewPlans:
    """One skew plan per KV head (kvscout::skew_plan): rope_planes mode keeps whole RoPE planes
    (planes [H, r / 2]); the skew modes rotate by A [H, D, D] and keep channels [H, r]."""

    mode: str
    r: int
    rope: RopeConfig
    planes: np.ndarray | None = None
    A: np.ndarray | None = None
    channels: np.ndarray | None = None


def rope_planes_plans(rope: RopeConfig, planes) -> SkewPlans:
    """The rope_planes plans that keep the given planes, [num_kv_heads, r / 2] (strictly ascending
    per head, each in [0, head_dim / 2)): kvscout::rope_planes_plan per head."""
    p = np.ascontiguousarray(planes, dtype=np.int32)
    if p.ndim != 2:
        raise ValueError(f"planes: shape {list(p.shape)}, expected [num_kv_heads, r / 2]")
    return SkewPlans(mode="rope_planes", r=2 * p.shape[1], rope=rope, planes=p)


_NONE_I32 = np.zeros((0,), np.int32)
_NONE_F32 = np.zeros((0,), np.float32)


def _plan_arrays(p: SkewPlans | None):
    if p is None:
        return _NONE_I32, _NONE_F32, _NONE_I32
    return (p.planes if p.planes is not None else _NONE_I32,
            p.A if p.A is not None else _NONE_F32,
            p.channels if p.channels is not None else _NONE_I32)


def _lookup(table, value, what):
    """table[value], or ValueError naming the value and the choices."""
    try:
        return table[value]
    except (KeyError, TypeError):
        raise ValueError(f"{what} {value!r}, expected one of {sorted(table)}") from None


def _address_range(a):
    """[first byte, one past the last) of a NumPy array or torch tensor."""
    if isinstance(a, np.ndarray):
        return a.ctypes.data, a.ctypes.data + a.nbytes
    start = a.data_ptr()
    return start, start + a.numel() * a.element_size()


_live = weakref.WeakSet()  # the policies alive now, each of which owns its workspace's bytes


def _options(mode, r, aggregation, query_aggregation, correction_r):
    for name, value, table in (("mode", mode, _MODES), ("aggregation", aggregation, _AGGREGATIONS)):
        if value not in table:
            raise ValueError(f"{name} {value!r}, expected one of {sorted(table)}")
    if query_aggregation is not None and query_aggregation not in _AGGREGATIONS:
        raise ValueError(f"query_aggregation {query_aggregation!r}, expected one of "
                         f"{sorted(_AGGREGATIONS)} or None")
    q = -1 if query_aggregation is None else _AGGREGATIONS[query_aggregation]
    return [_MODES[mode], _AGGREGATIONS[aggregation], q, r, correction_r]


class InfiniGenPolicy:
    """One layer's InfiniGen speculation on the host (infinigen_policy_host): a partial key cache
    of r channels per token, scored against a partial query from layer i - 1's input; with
    correction plans it also scores layer i's own query over their wider channels (score_query).

    key_bits: 0 keeps the partial keys as floats, 2 at 2 bits (kvscout_default's). The workspace
    (uint8, 64-byte aligned, workspace_bytes long) holds all of its state; by default it is
    allocated here, or pass your own.
    """

    def __init__(self, shape: DecodeShape, plans: SkewPlans, w_q, b_q=None, *,
                 correction_plans: SkewPlans | None = None, key_bits: int = 0,
                 aggregation: str = "max_logit", query_aggregation: str | None = None,
                 workspace=None):
        if correction_plans is not None and (correction_plans.rope != plans.rope
                                             or correction_plans.mode != plans.mode):
            raise ValueError("correction_plans: their mode and RoPE must be the speculation "
                             "plans' (one cache holds both)")
        style = _lookup(_STYLES, plans.rope.style, "rope style")
        if plans.rope.head_dim != shape.head_dim:
            raise ValueError(f"the plans' RoPE head_dim {plans.rope.head_dim}, expected the "
                             f"shape's head_dim {shape.head_dim}")
        self.shape = shape
        cr = correction_plans.r if correction_plans is not None else 0
        self._opts = _options(plans.mode, plans.r, aggregation, query_aggregation, cr)
        self.key_bits = key_bits
        nbytes = _workspace_bytes(shape.dims(), float(shape.scale), self._opts, key_bits)
        if workspace is not None:  # one policy per workspace: it holds the policy's state
            lo, hi = _address_range(workspace)
            for other in list(_live):
                olo, ohi = _address_range(other.workspace)
                if lo < ohi and olo < hi and hi > lo:
                    raise ValueError("workspace: its memory holds another live InfiniGenPolicy's "
                                     "state; give each policy its own")
        self.workspace = _workspace(nbytes) if workspace is None else workspace
        b = b_q if b_q is not None else np.zeros((0,), dtype=np.float32)
        self._append, self._score, self._score_query = _make(
            shape.dims(), float(shape.scale), self._opts, key_bits, float(plans.rope.theta),
            style, *_plan_arrays(plans), *_plan_arrays(correction_plans), w_q, b, self.workspace)
        _live.add(self)

    @staticmethod
    def workspace_bytes(shape: DecodeShape, r: int, mode: str = "rope_planes", *,
                        key_bits: int = 0, correction_r: int = 0,
                        aggregation: str = "max_logit", query_aggregation: str | None = None) -> int:
        """The bytes of the workspace of a policy configured so (sum_prob needs more)."""
        return _workspace_bytes(shape.dims(), float(shape.scale),
                                _options(mode, r, aggregation, query_aggregation, correction_r),
                                key_bits)

    def append(self, keys, seq_ids, token_ids):
        """Stores the partial keys of keys [n, H, D] (after RoPE unless pre_rope_folded): token j
        of sequence seq_ids[j] at position token_ids[j] (int32)."""
        try:
            self._append(keys, seq_ids, token_ids)
        except BufferError as e:
            raise _readonly(e, keys=keys, seq_ids=seq_ids, token_ids=token_ids) from None

    def score(self, x, positions, seq_lens, *, seq_ids=None, out=None):
        """Scores every cached token from x [S, d_model] float32 (layer i - 1's input) for the
        tokens at positions [S]: out [S, H, max_tokens] float32, t < seq_lens[s] written."""
        if out is None:
            out = _empty(x, (self.shape.num_seqs, self.shape.num_kv_heads, self.shape.max_tokens),
                         np.float32)
        try:
            self._score(x, positions, seq_lens, _NONE_I32 if seq_ids is None else seq_ids, out)
        except BufferError as e:
            raise _readonly(e, x=x, positions=positions, seq_lens=seq_lens, seq_ids=seq_ids,
                            out=out) from None
        return out

    def score_query(self, q, seq_lens, *, seq_ids=None, out=None):
        """The correction step's scores from layer i's own query q [S, Hq, D] float32 (after
        RoPE), over the correction plans' channels."""
        if out is None:
            out = _empty(q, (self.shape.num_seqs, self.shape.num_kv_heads, self.shape.max_tokens),
                         np.float32)
        try:
            self._score_query(q, seq_lens, _NONE_I32 if seq_ids is None else seq_ids, out)
        except BufferError as e:
            raise _readonly(e, q=q, seq_lens=seq_lens, seq_ids=seq_ids, out=out) from None
        return out
