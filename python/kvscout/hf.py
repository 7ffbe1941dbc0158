"""kvscout inside Hugging Face transformers (5.x): a cache whose layers keep K and V in host memory,
an attention function registered as "kvscout" that attends over the rows kvscout's pipeline
fetched, and forward pre-hooks that hand layer i's normalised input to the speculation of layer
i + 1 (InfiniGen's rehearsal). docs/hf_plan.md has what it plugs into; docs/python.md how to use it.

    cache = kvscout.hf.attach(model, preset="kvscout_default", budget=0.1,
                              calibration_ids=ids, max_tokens=4096)
    out = model.generate(input_ids, past_key_values=cache, max_new_tokens=64)

First slice (CPU, batch without padding): decode steps (one new token per sequence) go through
presets.Pipeline; prefill (several tokens) is dense (sdpa over the cache). Not yet: padding,
CUDA streams, KIVI rows, paged caches. What it cannot do is refused by name.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from . import presets
from ._parts import KVView
from ._policy import DecodeShape, RopeConfig

NAME = "kvscout"


class KVScoutLayer(CacheLayerMixin):
    """One decoder layer's K and V in host memory, [batch, kv_heads, max_tokens, head_dim]
    (contiguous HND, the pipeline's layout), float32; update() writes the new tokens in place
    and hands their keys to the layer's speculation policy."""

    is_compileable = False
    is_sliding = False

    def __init__(self, state: "_State", layer_idx: int):
        super().__init__()
        self._state, self.layer_idx = state, layer_idx
        self.length = 0

    def lazy_initialization(self, key_states, value_states):
        st = self._state
        B, H, _, D = key_states.shape
        if (B, H, D) != (st.shape.num_seqs, st.shape.num_kv_heads, st.shape.head_dim):
            raise ValueError(f"kvscout: the model's K is [{B}, {H}, *, {D}], the cache was "
                             f"attached for batch {st.shape.num_seqs}, {st.shape.num_kv_heads} "
                             f"KV heads, head_dim {st.shape.head_dim} (beam search and "
                             f"num_return_sequences > 1 multiply the batch: not supported)")
        T = st.shape.max_tokens
        self.keys = torch.zeros((B, H, T, D), dtype=torch.float32)
        self.values = torch.zeros((B, H, T, D), dtype=torch.float32)
        self.view = KVView(self.keys, self.values, "hnd")
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        B, H, q, D = key_states.shape
        start, end = self.length, self.length + q
        if end > self._state.shape.max_tokens:
            raise ValueError(f"kvscout: {end} tokens exceed the cache's max_tokens "
                             f"{self._state.shape.max_tokens} (attach(..., max_tokens=))")
        self.keys[:, :, start:end] = key_states.float()
        self.values[:, :, start:end] = value_states.float()
        self._state.keys_arrived(self.layer_idx, key_states, start)
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self._state.shape.max_tokens

    def get_mask_sizes(self, query_length: int):
        return self.length + query_length, 0

    def reorder_cache(self, beam_idx):
        raise NotImplementedError("kvscout: beam search is not supported (its cache reorders "
                                  "rows every step); use greedy or sampling")

    def crop(self, max_length: int):
        raise NotImplementedError("kvscout: cache cropping (assisted decoding) is not supported")

    def batch_repeat_interleave(self, repeats: int):
        raise NotImplementedError("kvscout: the batch is fixed at attach()")

    def batch_select_indices(self, indices):
        raise NotImplementedError("kvscout: the batch is fixed at attach()")


class KVScoutCache(Cache):
    """The cache attach() returns: pass it as past_key_values. stats() reports what was
    fetched."""

    def __init__(self, state: "_State"):
        super().__init__(layers=[KVScoutLayer(state, i) for i in range(state.shape.num_layers)])
        self._state = state

    def activate_past_recording(self, *args, **kwargs):
        raise NotImplementedError("kvscout: assisted decoding is not supported")

    def stats(self):
        """presets.FetchStats of every step so far: rows and bytes fetched per layer."""
        return self._state.pipe.stats()


class _State:
    """What the hooks, the cache and the attention function share for one attached model."""

    def __init__(self, model, p, shape: DecodeShape, cal, budget: float):
        self.p, self.shape = p, shape
        layers = model.model.layers
        w_q = [layer.self_attn.q_proj.weight.detach().float().contiguous() for layer in layers]
        b_q = [None if layer.self_attn.q_proj.bias is None else
               layer.self_attn.q_proj.bias.detach().float().contiguous() for layer in layers]
        self.pipe = presets.Pipeline(p, shape, cal, budget, w_q,
                                     None if all(b is None for b in b_q) else b_q,
                                     dtype="float32", layout="hnd")
        self.cache = None
        self.decoding = False

    def keys_arrived(self, layer: int, key_states, start: int):
        """The new tokens' post-RoPE keys [B, H, q, D] enter layer `layer`'s policy."""
        if layer < self.p.skip_layers:
            return
        B, H, q, D = key_states.shape
        keys = key_states.float().permute(0, 2, 1, 3).reshape(B * q, H, D).contiguous()
        seq_ids = torch.arange(B, dtype=torch.int32).repeat_interleave(q)
        token_ids = (start + torch.arange(q, dtype=torch.int32)).repeat(B)
        self.pipe.append(layer, keys, seq_ids, token_ids)


def _lengths(state: _State, layer: int) -> torch.Tensor:
    return torch.full((state.shape.num_seqs,), state.cache.layers[layer].length, dtype=torch.int32)


def _pre_hook(layer_idx: int):
    """Layer layer_idx's attention is about to run: its normalised input predicts the rows of
    layer layer_idx + 1 (fetched now, before layer layer_idx's own attention)."""

    def hook(module, args, kwargs):
        state = getattr(module, "_kvscout", None)
        x = kwargs.get("hidden_states")
        nxt = layer_idx + 1
        if state is None or x is None or x.shape[1] != 1 or state.cache is None:
            return None
        # transformers 5.25 passes the cache as `cache` (`past_key_values` before)
        if kwargs.get("cache", kwargs.get("past_key_values")) is not state.cache:
            return None
        if nxt >= state.shape.num_layers or nxt < state.p.skip_layers:
            return None
        if kwargs.get("attention_mask") is not None:
            raise NotImplementedError("kvscout: decoding with an attention mask (padding) is "
                                      "not supported yet")
        if state.cache.layers[nxt].length == 0:
            return None  # nothing cached yet: the first token attends to itself only (sdpa)
        lens = _lengths(state, nxt)  # layer nxt has not stored this step's token yet
        xs = x[:, 0].float().contiguous()
        state.pipe.speculate(nxt, xs, lens.clone(), lens, state.cache.layers[nxt].view)
        return None

    return hook


def kvscout_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                      **kwargs):
    """The "kvscout" attention: a decode step (one query token) attends over the rows the
    pipeline fetched for this layer (and every row below the preset's skip_layers); anything
    else (prefill, a model not attached) is sdpa's."""
    state = getattr(module, "_kvscout", None)
    # The pipeline's path only for a decode step whose K is this layer's kvscout cache (a model
    # attached once and then run with another cache, or none, attends densely, as sdpa).
    own = (state is not None and state.cache is not None and
           state.cache.layers[module.layer_idx].is_initialized and
           key.data_ptr() == state.cache.layers[module.layer_idx].keys.data_ptr())
    if not own or query.shape[2] != 1 or key.shape[2] < 2:
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      scaling=scaling, dropout=dropout, **kwargs)
    if attention_mask is not None:
        raise NotImplementedError("kvscout: decoding with an attention mask (padding) is not "
                                  "supported yet")
    layer = module.layer_idx
    lens = _lengths(state, layer) - 1  # the cached rows before this step's token
    q = query[:, :, 0].float().contiguous()  # [B, Hq, D], after RoPE
    k_cur = key[:, :, -1].float().contiguous()
    v_cur = value[:, :, -1].float().contiguous()
    out = state.pipe.attend(layer, q, lens, state.cache.layers[layer].view, k_cur=k_cur,
                            v_cur=v_cur)
    return out[:, None].to(query.dtype), None


AttentionInterface.register(NAME, kvscout_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)


def _rope_theta(config) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise ValueError("kvscout: the model's config has no rope_theta")
    rope_type = params.get("rope_type", "default")
    if rope_type not in ("default", None):
        raise NotImplementedError(f"kvscout: RoPE type {rope_type!r} is not supported (the "
                                  f"partial query is rotated with plain RoPE)")
    return float(theta)


@torch.no_grad()
def calibrate(model, p, shape: DecodeShape, calibration_ids):
    """presets.calibrate on the model's own queries and keys (post-RoPE) over calibration_ids
    [1, n]: one dense forward with hooks that record them."""
    L, Hq, H, D = shape.num_layers, shape.num_q_heads, shape.num_kv_heads, shape.head_dim
    qs, ks = [None] * L, [None] * L

    hooks = []
    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn

        def q_hook(module, args, kwargs, i=i):
            x = kwargs["hidden_states"]
            cos, sin = kwargs["position_embeddings"]
            B, n, _ = x.shape
            q = module.q_proj(x).view(B, n, Hq, D).transpose(1, 2)
            k = module.k_proj(x).view(B, n, H, D).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            qs[i] = q[0].transpose(0, 1).float().contiguous().numpy()
            ks[i] = k[0].transpose(0, 1).float().contiguous().numpy()
            return None

        hooks.append(attn.register_forward_pre_hook(q_hook, with_kwargs=True))
    try:
        model(calibration_ids, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    rope = RopeConfig(D, _rope_theta(model.config))
    return presets.calibrate(p, shape, rope, np.stack(qs), np.stack(ks))


def attach(model, preset: str = "kvscout_default", budget: float = 0.1, *, calibration_ids=None,
           calibration=None, max_tokens: int = 4096, batch_size: int = 1) -> KVScoutCache:
    """Switches `model` (a Llama-family transformers model on the CPU) to kvscout: registers
    the "kvscout" attention, hooks each decoder layer, calibrates the preset on
    calibration_ids (or takes a presets.Calibration), and returns the cache to pass as
    past_key_values. budget: the share of each layer's cached rows fetched per step."""
    cfg = model.config
    if getattr(cfg, "model_type", None) not in ("llama", "mistral", "qwen2"):
        raise NotImplementedError(f"kvscout: model type {cfg.model_type!r} is not supported "
                                  f"(RoPE multi-head / GQA attention of the Llama family)")
    D = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    shape = DecodeShape(num_seqs=batch_size, num_kv_heads=cfg.num_key_value_heads,
                        num_q_heads=cfg.num_attention_heads, head_dim=D,
                        d_model=cfg.hidden_size, max_tokens=max_tokens, scale=D ** -0.5,
                        num_layers=cfg.num_hidden_layers)
    p = presets.preset(preset, D)
    if calibration is None:
        if calibration_ids is None:
            raise ValueError("kvscout: attach() needs calibration_ids (token ids of a text to "
                             "calibrate on) or a calibration")
        calibration = calibrate(model, p, shape, calibration_ids)
    state = _State(model, p, shape, calibration, budget)
    cache = KVScoutCache(state)
    state.cache = cache
    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        attn._kvscout = state
        if not getattr(attn, "_kvscout_hooked", False):
            attn.register_forward_pre_hook(_pre_hook(i), with_kwargs=True)
            attn._kvscout_hooked = True
    model.set_attn_implementation(NAME)
    return cache
