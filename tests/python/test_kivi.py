"""KIVICache (kivi_layout, kivi_append_host, kivi_gathered_rows_host) from Python: every row as
attention reads it is KIVI's quantisation restated in NumPy (keys per channel over groups of G
tokens, values per token over groups of G channels, scales and zeros in float16, the newest
tokens in full precision); attention over gathered records is float64 softmax attention over
those rows; bad input raises. Seeded."""

import numpy as np
import pytest

import kvscout

H, D, G = 2, 64, 32


def quantise(x, bits, axis):
    """kv/detail/kivi_pack.hpp's formula on float32 groups along `axis`: scale = half((mx - mn) /
    L), zero = half(mn), q = floor(clamp((x - zero) / scale, 0, L) + 0.5), x' = q * scale + zero
    (one rounding: q * scale is exact)."""
    L = np.float32(2 ** bits - 1)
    mn = x.min(axis=axis, keepdims=True)
    mx = x.max(axis=axis, keepdims=True)
    scale = ((mx - mn) / L).astype(np.float16).astype(np.float32)
    zero = mn.astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.clip((x - zero) / scale, np.float32(0), L)
    q = np.where(scale > 0, np.floor(y + np.float32(0.5)), np.float32(0))
    return (q.astype(np.float64) * scale + zero).astype(np.float32), scale


def kivi_rows(x_k, x_v, bits, residual, dtype):
    """One sequence's keys / values [n, H, D] as a KIVI cache's reader sees them."""
    n = len(x_k)
    B = residual if residual > 0 else G
    kq, vq = n // B * B, max(0, n - residual)
    xk, xv = x_k.astype(np.float32), x_v.astype(np.float32)
    k, v = xk.copy(), xv.copy()
    for g in range(kq // G):  # keys: per channel over G tokens
        k[g * G:(g + 1) * G] = quantise(xk[g * G:(g + 1) * G], bits, axis=0)[0]
    if vq:  # values: per token over G channels
        grouped = xv[:vq].reshape(vq, H, D // G, G)
        v[:vq] = quantise(grouped, bits, axis=3)[0].reshape(vq, H, D)
    seq_len = min(kq, vq)
    # The window [seq_len, n) keeps rows already quantised dequantised, rounded once to dtype.
    k[seq_len:kq] = k[seq_len:kq].astype(dtype).astype(np.float32)
    v[seq_len:vq] = v[seq_len:vq].astype(dtype).astype(np.float32)
    return k, v, seq_len


@pytest.mark.parametrize("bits,dtype,residual", [(2, np.float16, 64), (4, np.float16, 32),
                                                 (4, np.float32, 0), (2, np.float32, 128)])
def test_rows_are_kivis_formula(bits, dtype, residual):
    r = np.random.default_rng(bits + residual)
    cache = kvscout.KIVICache(2, H, 320, D, bits, dtype=dtype, group=G, residual=residual)
    xs = []
    for s, chunks in enumerate(([37, 100, 1, 150], [5, 200, 6])):
        k = (r.standard_normal((sum(chunks), H, D)) * (1 + r.random(D))).astype(dtype)
        v = r.standard_normal((sum(chunks), H, D)).astype(dtype)
        at = 0
        for c in chunks:
            cache.append(s, k[at:at + c], v[at:at + c])
            at += c
        xs.append((k, v))
    assert cache.seq_lens.tolist() == [288, 211]
    keys, values, qlens = cache.rows()
    for s, (k, v) in enumerate(xs):
        want_k, want_v, seq_len = kivi_rows(k, v, bits, residual, dtype)
        n = len(k)
        assert qlens[s] == seq_len and cache.quantized_lens()[s] == seq_len
        got_k = keys[s, :, :n].transpose(1, 0, 2)
        got_v = values[s, :, :n].transpose(1, 0, 2)
        assert np.array_equal(got_k, want_k), (s, np.argwhere(got_k != want_k)[:3])
        assert np.array_equal(got_v, want_v), s
        # The error bound of kivi_layout.hpp: within half a step of the stored grid, plus float16
        # rounding of the scale and zero (and of the window's rows), for every quantised key.
        B = residual or G
        kq = n // B * B
        x = k[:kq].astype(np.float32).reshape(-1, G, H, D)
        err = np.abs(got_k[:kq].reshape(-1, G, H, D) - x)
        step = np.ptp(x, axis=1, keepdims=True) / (2 ** bits - 1)
        assert (err <= 0.5 * step * 1.01 + 2e-3 * (1 + np.abs(x))).all()


def test_attention_over_gathered_records_is_attention_over_the_rows():
    r = np.random.default_rng(4)
    cache = kvscout.KIVICache(2, H, 400, D, 4, dtype=np.float16, group=G, residual=64)
    for s, n in enumerate((300, 170)):
        cache.append(s, r.standard_normal((n, H, D)).astype(np.float16),
                     r.standard_normal((n, H, D)).astype(np.float16))
    qlens = cache.quantized_lens()
    cap = 50
    idx = np.zeros((2, H, cap), np.int32)
    cnt = np.zeros((2, H), np.int32)
    for s in range(2):
        for h in range(H):
            pick = np.sort(r.choice(qlens[s], size=cap - 10 * s, replace=False))
            idx[s, h, :len(pick)], cnt[s, h] = pick, len(pick)
    kr, vr = cache.gather(idx, cnt, threads=2)
    assert kr.shape == (2, H, cap, cache.k_row_bytes) and kr.dtype == np.uint8
    Hq = 2 * H
    q = r.standard_normal((2, Hq, D)).astype(np.float32)
    kc = r.standard_normal((2, H, D)).astype(np.float16)
    vc = r.standard_normal((2, H, D)).astype(np.float16)
    out = cache.attend(kr, vr, idx, cnt, q, D ** -0.5, k_cur=kc, v_cur=vc)
    keys, values, _ = cache.rows()
    for s in range(2):
        for hq in range(Hq):
            h = hq // 2
            rows = list(idx[s, h, :cnt[s, h]]) + list(range(qlens[s], cache.seq_lens[s]))
            K = np.concatenate([keys[s, h, rows], kc[s, h][None]]).astype(float)
            V = np.concatenate([values[s, h, rows], vc[s, h][None]]).astype(float)
            logits = K @ q[s, hq].astype(float) * D ** -0.5
            p = np.exp(logits - logits.max())
            want = (p / p.sum()) @ V
            assert np.allclose(out[s, hq], want, rtol=1e-5, atol=1e-5), (s, hq)


def test_bad_input_raises_naming_it():
    with pytest.raises(ValueError, match="KIVI with 3-bit keys and 3-bit values was not built"):
        kvscout.KIVICache(1, H, 64, D, 3)
    with pytest.raises(ValueError, match="head_dim 96 was not built"):
        kvscout.KIVICache(1, H, 64, 96)
    with pytest.raises(ValueError, match="group size G = 24 must divide head_dim = 64"):
        kvscout.KIVICache(1, H, 64, D, group=24)
    with pytest.raises(TypeError, match="dtype 'float64', expected float32"):
        kvscout.KIVICache(1, H, 64, D, dtype=np.float64)
    cache = kvscout.KIVICache(1, H, 64, D, 2, dtype=np.float16, residual=32)
    k = np.zeros((40, H, D), np.float16)
    with pytest.raises(TypeError, match="k: dtype float32, expected the cache's float16"):
        cache.append(0, k.astype(np.float32), k.astype(np.float32))
    with pytest.raises(ValueError, match=r"v: shape \[40, 2, 32\], expected \[\*, 2, 64\]"):
        cache.append(0, k, k[..., :32].copy())
    cache.append(0, k, k)
    with pytest.raises(ValueError, match="capacity"):
        cache.append(0, k, k)  # 80 tokens into 64
    assert cache.seq_lens[0] == 40  # nothing written by the refused append
    with pytest.raises(ValueError, match="sequence"):
        cache.append(1, k[:1], k[:1])
    idx = np.full((1, H, 4), 35, np.int32)  # token 35 is in the window, not quantised
    cnt = np.full((1, H), 4, np.int32)
    kr, vr = cache.gather(np.tile(np.arange(4, dtype=np.int32), (1, H, 1)), cnt)
    with pytest.raises(ValueError, match="token index 35 .* is not a quantised token"):
        cache.attend(kr, vr, idx, cnt, np.zeros((1, H, D), np.float32), 0.125)
    with pytest.raises(ValueError, match=r"k_rows: shape \[1, 2, 4, 8\], expected"):
        cache.gather(idx, cnt, k_rows=np.zeros((1, H, 4, 8), np.uint8))
