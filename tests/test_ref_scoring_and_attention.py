"""References of the scoring, dequant and attention ops against brute-force loops and hand-worked bytes."""

import math
import struct

import dsa_ops
import pytest
import torch
from brute import indexer_logit, softmax_attend, topk_row

FP8 = torch.float8_e4m3fn


def _fp8(shape, g, scale=1.0):
    return (torch.randn(*shape, generator=g) * scale).to(FP8)


@pytest.mark.parametrize("dtype", [FP8, torch.bfloat16])
def test_indexer_logits_brute_force(dtype):
    g = torch.Generator().manual_seed(1)
    T, H, D, N = 5, 3, 16, 23
    q, kv = _fp8((T, H, D), g).to(dtype), _fp8((N, D), g).to(dtype)
    s = (torch.rand(N, generator=g) + 0.5) if dtype == FP8 else None
    w = torch.randn(T, H, generator=g)[:, :]  # any strides
    ks = torch.tensor([0, -4, 3, 10, 22], dtype=torch.int32)
    ke = torch.tensor([23, 5, 3, 40, 21], dtype=torch.int32)  # full, clipped start, empty, past N, ke<ks
    out = dsa_ops.indexer_logits(q, kv, s, w, ks, ke)
    qd, kvd = q.double(), kv.double()
    for t in range(T):
        for j in range(N):
            inside = max(int(ks[t]), 0) <= j < min(int(ke[t]), N)
            want = indexer_logit(qd, kvd, s, w, t, j) if inside else -math.inf
            assert out[t, j].item() == pytest.approx(want, rel=1e-5, abs=1e-5)


def test_indexer_logits_non_contiguous_weights():
    g = torch.Generator().manual_seed(2)
    q, kv, s = _fp8((4, 8, 32), g), _fp8((50, 32), g), torch.rand(50, generator=g)
    w = torch.randn(8, 4, generator=g).t()
    ks, ke = torch.zeros(4, dtype=torch.int32), torch.full((4,), 50, dtype=torch.int32)
    strided = dsa_ops.indexer_logits(q, kv, s, w, ks, ke)
    assert torch.equal(strided, dsa_ops.indexer_logits(q, kv, s, w.contiguous(), ks, ke))


def _paged_cache(vals_fp8, scales, nb):
    """Pack [nb*64, D] fp8 values and [nb*64] fp32 scales into the uint8 [nb, 64, 1, D+4] layout."""
    d = vals_fp8.shape[1]
    blocks = []
    for b in range(nb):
        v = vals_fp8[b * 64:(b + 1) * 64].contiguous().view(torch.uint8).flatten()
        sc = scales[b * 64:(b + 1) * 64].contiguous().view(torch.uint8)
        blocks.append(torch.cat([v, sc]))
    return torch.stack(blocks).view(nb, 64, 1, d + 4)


def test_paged_indexer_logits_brute_force():
    g = torch.Generator().manual_seed(3)
    B, next_n, H, D, nb = 2, 2, 2, 16, 4
    vals, scales = _fp8((nb * 64, D), g), torch.rand(nb * 64, generator=g) + 0.5
    cache = _paged_cache(vals, scales, nb)
    q = _fp8((B, next_n, H, D), g)
    w = torch.randn(B * next_n, H, generator=g)
    ctx = torch.tensor([100, 40], dtype=torch.int32)
    bt = torch.tensor([[2, 0, -1], [3, 9, 1]], dtype=torch.int32)  # -1 and 9 are invalid blocks
    L = 150
    out = dsa_ops.paged_indexer_logits(q, cache, w, ctx, bt, max_context_len=L)
    for b in range(B):
        for i in range(next_n):
            row = b * next_n + i
            for p in range(L):
                blk = int(bt[b, p // 64]) if p // 64 < bt.shape[1] else -1
                visible = p < int(ctx[b]) - next_n + i + 1 and 0 <= blk < nb
                if not visible:
                    assert out[row, p].item() == -math.inf
                    continue
                key = vals[blk * 64 + p % 64].double()
                scale = float(scales[blk * 64 + p % 64])
                dots = [float((q[b, i, h].double() * key).sum()) for h in range(H)]
                want = sum(float(w[row, h]) * max(dots[h] * scale, 0) for h in range(H))
                assert out[row, p].item() == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_indexer_topk_equals_unfused():
    g = torch.Generator().manual_seed(4)
    T, H, D, N, k = 6, 4, 32, 200, 16
    q, kv, s = _fp8((T, H, D), g), _fp8((N, D), g), torch.rand(N, generator=g)
    w = torch.randn(T, H, generator=g)
    ks = torch.tensor([0, 5, -3, 100, 190, 50], dtype=torch.int32)
    ke = torch.tensor([200, 20, 9, 300, 195, 50], dtype=torch.int32)
    idx, scores = dsa_ops.indexer_topk(q, kv, s, w, ks, ke, k, return_scores=True)
    logits = dsa_ops.indexer_logits(q, kv, s, w, ks, ke)
    for t in range(T):
        want = topk_row(logits[t].tolist(), k, int(ks[t]), int(ke[t]) - int(ks[t]))
        got = [i for i in idx[t].tolist() if i >= 0]
        assert set(got) == want
        for j, i in enumerate(idx[t].tolist()):
            assert scores[t, j].item() == (logits[t, i + int(ks[t])].item() if i >= 0 else -math.inf)
    pt = torch.randint(0, 50, (1, 8), dtype=torch.int32)
    rtb = torch.zeros(T, dtype=torch.int32)
    mapped, none = dsa_ops.indexer_topk(q, kv, s, w, ks, ke, k, page_table=pt, row_to_batch=rtb, page_size=32)
    assert none is None
    assert torch.equal(mapped, dsa_ops.page_table_transform(idx, pt, row_to_batch=rtb, page_size=32))


def _v32_token(vals: list[float], scales: list[float], rope: list[float]) -> bytes:
    fp8 = torch.tensor(vals).to(FP8).view(torch.uint8).tolist()
    rope_bytes = torch.tensor(rope).to(torch.bfloat16).view(torch.uint8).numpy().tobytes()
    return bytes(fp8) + struct.pack("<4f", *scales) + rope_bytes


def test_dequant_v32_hand_worked_and_padded_pages():
    P = 2
    toks = []
    for t in range(4):
        vals = [(-1) ** i * (0.5 + (i % 7)) for i in range(512)]
        toks.append(_v32_token(vals, [1.0, 0.5, 2.0 ** (-t), 3.0], [float(t)] * 64))
    raw = torch.tensor(list(b"".join(toks)), dtype=torch.uint8).view(2, P, 1, 656)
    padded = torch.full((2, P * 656 + 100), 0xFF, dtype=torch.uint8)  # NaN-filled padding
    padded[:, : P * 656] = raw.view(2, -1)
    cache = padded[:, : P * 656].view(2, P, 1, 656)
    assert cache.stride(0) == P * 656 + 100
    slots = torch.tensor([3, -1, 0, 4, 1], dtype=torch.int32)
    out = dsa_ops.dequant_k_cache_paged(cache, slots, layout="v32")
    assert out.shape == (5, 576) and out.dtype == torch.bfloat16
    assert torch.all(out[1] == 0) and torch.all(out[3] == 0)
    v = torch.tensor([(-1) ** i * (0.5 + (i % 7)) for i in range(512)]).to(FP8).float()
    for row, t in ((0, 3), (2, 0), (4, 1)):
        sc = torch.tensor([1.0, 0.5, 2.0 ** (-t), 3.0]).repeat_interleave(128)
        assert torch.equal(out[row, :512], (v * sc).to(torch.bfloat16))
        assert torch.all(out[row, 512:] == float(t))


def test_dequant_v4_split_fields_and_ue8m0():
    P, nb = 4, 2
    g = torch.Generator().manual_seed(5)
    vals = _fp8((nb, P, 448), g)
    rope = torch.randn(nb, P, 64, generator=g).to(torch.bfloat16)
    ue = torch.randint(0, 256, (nb, P, 7), generator=g, dtype=torch.uint8)
    ue[0, 0, :3] = torch.tensor([0, 127, 255], dtype=torch.uint8)
    pages = []
    for b in range(nb):
        data = torch.cat([vals[b].view(torch.uint8), rope[b].view(torch.uint8)], dim=1).flatten()
        sc = torch.cat([ue[b], torch.zeros(P, 1, dtype=torch.uint8)], dim=1).flatten()
        pages.append(torch.cat([data, sc]))
    cache = torch.stack(pages).view(nb, P, 1, 584)
    slots = torch.arange(-1, nb * P + 1, dtype=torch.int32)
    out = dsa_ops.dequant_k_cache_paged(cache, slots, layout="v4")
    assert out.shape == (nb * P + 2, 512)
    assert torch.all(out[0] == 0) and torch.all(out[-1] == 0)
    for s in range(nb * P):
        b, o = divmod(s, P)
        scale = torch.tensor([2.0 ** (int(e) - 127) for e in ue[b, o]]).repeat_interleave(64)
        want = (vals[b, o].float() * scale).to(torch.bfloat16)
        assert torch.equal(out[s + 1, :448], want), s
        assert torch.equal(out[s + 1, 448:], rope[b, o])


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, FP8])
def test_sparse_attention_brute_force(cache_dtype):
    g = torch.Generator().manual_seed(6)
    T, Hq, Hkv, D, Dv, P, nb = 4, 4, 2, 16, 8, 4, 5
    q = torch.randn(T, Hq, D, generator=g).to(torch.bfloat16)
    kc = torch.randn(nb, P, Hkv, D, generator=g).to(cache_dtype)
    vc = torch.randn(nb, P, Hkv, Dv, generator=g).to(cache_dtype)
    bt = torch.tensor([[1, 3, -1], [4, 0, 7]], dtype=torch.int32)
    idx = torch.tensor([[0, 5, 9, -1], [1, 2, 11, 6], [3, 3, -1, -1], [0, 1, 2, 3]], dtype=torch.int32)
    t2r = torch.tensor([0, 1, 1, -1], dtype=torch.int32)
    out = dsa_ops.sparse_attention(q, kc, vc, idx, bt, t2r, softmax_scale=0.3, k_scale=0.5, v_scale=2.0)
    for t in range(T):
        for h in range(Hq):
            hk = h // (Hq // Hkv)
            sc, vs = [], []
            req = int(t2r[t])
            for pos in idx[t].tolist():
                if req < 0 or pos < 0 or pos // P >= bt.shape[1]:
                    continue
                page = int(bt[req, pos // P])
                if not 0 <= page < nb:
                    continue
                kk = kc[page, pos % P, hk].double() * 0.5
                sc.append(0.3 * float((q[t, h].double() * kk).sum()))
                vs.append(vc[page, pos % P, hk].double() * 2.0)
            want, _ = softmax_attend(sc, vs)
            got = out[t, h].double()
            if want is None:
                assert torch.all(got == 0)
            else:
                assert torch.allclose(got, want, rtol=1e-2, atol=1e-2)


def test_sparse_attention_invalid_tokens_never_read():
    """Pages no request maps are NaN; tokens on a -1 page entry, on a page id past the cache, rows with no valid
    token, a request with no page and a padding row: the output has no NaN (an invalid token's row is never
    read), valid rows average their valid tokens' V, the others are 0."""
    P, nb = 4, 4
    kc = torch.ones(nb, P, 1, 8, dtype=torch.bfloat16)
    vc = torch.ones(nb, P, 1, 8, dtype=torch.bfloat16)
    kc[[0, 3]] = float("nan")
    vc[[0, 3]] = float("nan")
    bt = torch.tensor([[1, 2, -1, 9], [-1, -1, -1, -1]], dtype=torch.int32)
    idx = torch.tensor([[0, 5, 8, -1], [0, 5, 12, -1], [8, 12, -1, -1], [0, 1, 2, 3], [8, 0, 0, 0]], dtype=torch.int32)
    t2r = torch.tensor([0, 0, 0, 1, -1], dtype=torch.int32)
    q = torch.ones(5, 1, 8, dtype=torch.bfloat16)
    out = dsa_ops.sparse_attention(q, kc, vc, idx, bt, t2r, softmax_scale=0.125)
    assert not out.isnan().any()
    assert torch.all(out[:2] == 1) and torch.all(out[2:] == 0)


@pytest.mark.parametrize("layout", ["v32", "v4"])
def test_sparse_mla_decode_brute_force(layout):
    g = torch.Generator().manual_seed(7)
    B, s_q, H, P, nb = 2, 2, 2, 4, 3
    bpt, d = (656, 576) if layout == "v32" else (584, 512)
    cache = torch.randint(0, 100, (nb, P, 1, bpt), dtype=torch.uint8, generator=g)
    if layout == "v32":
        cache[..., 512:528] = torch.full((nb, P, 1, 4), 0.02).view(torch.uint8)
        cache[..., 528:] = (torch.randn(nb, P, 1, 64, generator=g) * 0.1).to(torch.bfloat16).view(torch.uint8)
    else:
        flat = cache.view(nb, -1)
        data = flat[:, : P * 576].view(nb, P, 576)
        data[..., 448:] = (torch.randn(nb, P, 64, generator=g) * 0.1).to(torch.bfloat16).view(torch.uint8)
        flat[:, P * 576:] = 120  # ue8m0 scales 2^-7
    q = (torch.randn(B, s_q, H, d, generator=g) * 0.2).to(torch.bfloat16)
    idx = torch.tensor([[[0, 3, 11, -1, 12], [5, 5, 2, 1, 0]], [[-1, -1, -1, -1, -1], [7, 8, 9, 10, 11]]],
                       dtype=torch.int32)
    lens = torch.tensor([5, 3], dtype=torch.int32)
    sink = torch.tensor([0.5, -1.0])
    out, lse = dsa_ops.sparse_mla_decode(q, cache, idx, softmax_scale=0.1, layout=layout, topk_lens=lens,
                                         attn_sink=sink)
    assert out.shape == (B, s_q, H, 512) and lse.shape == (B, H, s_q)
    for b in range(B):
        for i in range(s_q):
            valid = [sl for j, sl in enumerate(idx[b, i].tolist()) if j < int(lens[b]) and 0 <= sl < nb * P]
            rows = dsa_ops.dequant_k_cache_paged(cache, torch.tensor(valid, dtype=torch.int32), layout=layout).double()
            for h in range(H):
                sc = [0.1 * float((q[b, i, h].double() * r).sum()) for r in rows]
                want, want_lse = softmax_attend(sc, [r[:512] for r in rows])
                if want is None:
                    assert torch.all(out[b, i, h] == 0) and lse[b, h, i].item() == math.inf
                    continue
                want = want / (1 + math.exp(float(sink[h]) - want_lse))
                assert lse[b, h, i].item() == pytest.approx(want_lse, rel=1e-5)
                assert torch.allclose(out[b, i, h].double(), want, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("sink", [float("inf"), float("-inf"), 0.0])
def test_sparse_mla_decode_tokenless_row_with_any_sink(sink):
    """A request of length 0 has no valid token: out 0 and lse +inf whatever attn_sink holds (a +inf sink made
    the sink factor inf - inf); the other request's rows are unchanged by a finite or -inf sink."""
    from sparse_mla_decode_cases import make_case

    q, cache, idx, lens, _ = make_case("v32", 2, 2, 64, 32, lens=[0, 32], seed=3)
    out, lse = dsa_ops.sparse_mla_decode(q, cache, idx, softmax_scale=0.04, topk_lens=lens,
                                         attn_sink=torch.full((64,), sink))
    assert torch.all(out[0] == 0) and torch.all(lse[0] == float("inf"))
    assert not out.isnan().any() and torch.isfinite(lse[1]).all()
