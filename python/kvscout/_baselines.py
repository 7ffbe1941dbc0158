"""The policies InfiniGen is measured against (score/streaming.hpp, oracle.hpp, quest.hpp,
h2o.hpp): each scores every cached token of a layer; a selector (topk_select) picks the rows."""

from __future__ import annotations

import numpy as np

from ._parts import _NO_TABLE, KVView, _empty, _lib, _ORDERS, _PAGES, _workspace
from ._policy import _AGGREGATIONS, DecodeShape, _lookup

_streaming = _lib.streaming_score
_oracle = _lib.oracle_score
_quest_bytes = _lib.quest_workspace_bytes
_make_quest = _lib.make_quest_policy
_h2o_bytes = _lib.h2o_workspace_bytes
_make_h2o = _lib.make_h2o_policy


def _scores(like, shape: DecodeShape, out):
    if out is not None:
        return out
    return _empty(like, (shape.num_seqs, shape.num_kv_heads, shape.max_tokens), np.float32)


def _ids(seq_ids):
    return _NO_TABLE if seq_ids is None else seq_ids


def _policy_dims(shape: DecodeShape):
    return [shape.num_layers, shape.num_seqs, shape.num_kv_heads, shape.num_q_heads,
            shape.head_dim, shape.max_tokens]


class StreamingPolicy:
    """StreamingLLM's choice (streaming_policy_host): the first `sinks` tokens score +inf, token t
    scores t, so a top-k selector of budget B keeps the sinks and the B - sinks newest tokens."""

    def __init__(self, shape: DecodeShape, sinks: int = 4):
        self.shape, self.sinks = shape, sinks

    def score(self, seq_lens, *, seq_ids=None, out=None):
        out = _scores(seq_lens, self.shape, out)
        _streaming(self.sinks, seq_lens, _ids(seq_ids), out)
        return out


class OraclePolicy:
    """The true scores (oracle_policy_host): layer i's own query q [S, Hq, D] (after RoPE) against
    every cached key of its cache, aggregated over each KV head's query group ("sum_prob": the
    softmax mass, "max_logit", "mean_logit"): the upper bound the other policies are measured
    against."""

    def __init__(self, shape: DecodeShape, aggregation: str = "sum_prob"):
        self.shape = shape
        self._agg = _lookup(_AGGREGATIONS, aggregation, "aggregation")

    def score(self, q, seq_lens, kv: KVView, *, seq_ids=None, out=None):
        if not isinstance(kv, KVView):
            raise TypeError(f"kv: {type(kv).__name__}, expected a kvscout.KVView")
        out = _scores(q, self.shape, out)
        _oracle(_PAGES[kv.pages], _ORDERS[kv.layout], float(self.shape.scale), self._agg, q,
                seq_lens, _ids(seq_ids), kv._tensors, out)
        return out


class QuestPolicy:
    """Quest's page selection (quest_policy_host): per page of `page_size` tokens the per-channel
    minimum and maximum of the post-RoPE keys; every token of a page scores the page's bound on
    q . k, so a top-k selector picks whole pages. State (the bounds of every layer) in the
    workspace, the caller's or allocated here. shape: with num_layers and max_tokens."""

    def __init__(self, shape: DecodeShape, page_size: int = 16, aggregation: str = "max_logit",
                 *, workspace=None):
        self.shape = shape
        agg = _lookup(_AGGREGATIONS, aggregation, "aggregation")
        nbytes = _quest_bytes(_policy_dims(shape), page_size)
        self.workspace = _workspace(nbytes) if workspace is None else workspace
        self._append, self._score = _make_quest(_policy_dims(shape), float(shape.scale),
                                                page_size, agg, self.workspace)

    def append(self, layer: int, keys, seq_ids, token_ids):
        """Bounds keys [n, H, D] float32 (after RoPE): token j of sequence seq_ids[j] at position
        token_ids[j] (int32)."""
        self._append(layer, keys, seq_ids, token_ids)

    def score(self, layer: int, q, seq_lens, *, seq_ids=None, out=None):
        out = _scores(q, self.shape, out)
        self._score(layer, q, seq_lens, _ids(seq_ids), out)
        return out


class H2OPolicy:
    """H2O's heavy hitters (h2o_policy_host): a token scores the attention probability it has
    received so far, summed over its query group and accumulated over the steps that attended it
    (observe, with decode_attention's probs). Pair it with a recent window (KeepSet.recent), as
    H2O does. State in the workspace, the caller's or allocated here."""

    def __init__(self, shape: DecodeShape, *, workspace=None):
        self.shape = shape
        nbytes = _h2o_bytes(_policy_dims(shape))
        self.workspace = _workspace(nbytes) if workspace is None else workspace
        self._score, self._observe, self._reset = _make_h2o(_policy_dims(shape), self.workspace)

    def score(self, layer: int, seq_lens, *, seq_ids=None, out=None):
        out = _scores(seq_lens, self.shape, out)
        self._score(layer, seq_lens, _ids(seq_ids), out)
        return out

    def observe(self, layer: int, indices, counts, probs, seq_lens, *, has_current: bool = True,
                seq_ids=None):
        """Adds the probabilities decode_attention wrote (probs [S, H, stride]) to the tokens it
        attended (indices / counts), and the current token's at position seq_lens[s]."""
        self._observe(layer, indices, counts, probs, seq_lens, _ids(seq_ids), bool(has_current))

    def reset(self, s: int):
        """Clears sequence s's accumulated mass (every layer)."""
        self._reset(s)
