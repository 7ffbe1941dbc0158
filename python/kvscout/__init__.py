"""kvscout's parts on NumPy arrays and PyTorch CPU tensors (the host backend).

One decode step's selection, fetch and attention, as examples/03 runs them in C++:

    import kvscout
    idx, cnt = kvscout.topk_select(scores, seq_lens, budget=64, keep=kvscout.KeepSet(4, 16))
    k_rows, v_rows = kvscout.gather(k_cache, v_cache, seq_lens, idx, cnt, layout="hnd")
    out = kvscout.decode_attention(k_rows, v_rows, idx, cnt, q, scale=0.125,
                                   k_cur=k_new, v_cur=v_new)

Every function checks its inputs and raises TypeError (a dtype) or ValueError (anything else)
naming the bad value and what was expected. docs/python.md has the rest.
"""

from ._policy import DecodeShape, InfiniGenPolicy, RopeConfig, SkewPlans, rope_planes_plans
from . import presets
from ._kivi import KIVICache
from ._baselines import H2OPolicy, OraclePolicy, QuestPolicy, StreamingPolicy
from ._parts import (
    Gather,
    KeepSet,
    KVView,
    correction_select,
    decode_attention,
    device_status_describe,
    gather,
    gather_paged,
    threshold_select,
    threshold_workspace_bytes,
    topk_select,
    topk_workspace,
    topk_workspace_bytes,
)

__version__ = "0.1.0"
__all__ = [
    "DecodeShape",
    "InfiniGenPolicy",
    "H2OPolicy",
    "OraclePolicy",
    "QuestPolicy",
    "StreamingPolicy",
    "RopeConfig",
    "SkewPlans",
    "rope_planes_plans",
    "Gather",
    "KeepSet",
    "KIVICache",
    "KVView",
    "presets",
    "correction_select",
    "decode_attention",
    "device_status_describe",
    "gather",
    "gather_paged",
    "threshold_select",
    "threshold_workspace_bytes",
    "topk_select",
    "topk_workspace",
    "topk_workspace_bytes",
]
