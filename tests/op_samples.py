"""One small valid call per op (and per out overload), for opcheck and the compile tests.

A name `op[variant]` is a further call of `op` (e.g. each precision mode of the indexer scoring ops)."""

import torch

FP8 = torch.float8_e4m3fn


def i32(*v):
    return torch.tensor(v, dtype=torch.int32)


def samples():
    g = torch.Generator().manual_seed(0)
    T, H, D, N = 3, 2, 16, 40
    q = torch.randn(T, H, D, generator=g).to(FP8)
    kv = torch.randn(N, D, generator=g).to(FP8)
    w = torch.randn(T, H, generator=g)
    ks, ke = i32(0, 5, 10), i32(40, 30, 12)
    scores = torch.randn(4, 50, generator=g)
    nan_scores = scores.clone()
    nan_scores[0, ::7] = float("nan")  # the nan_first samples: NaN inside and outside the windows
    nan_scores[2, 44:] = float("nan")
    lengths, starts = i32(50, 10, 3, 0), i32(0, 20, 45, 2)
    pt = torch.randint(0, 20, (2, 4), generator=g, dtype=torch.int32)
    rtb = i32(1, 0, 1, 0)
    idx = torch.randint(-1, 200, (4, 6), generator=g, dtype=torch.int32)
    cache_v32 = torch.randint(0, 100, (3, 4, 1, 656), generator=g, dtype=torch.uint8)
    slots = i32(0, 5, -1, 11, 12)
    paged = torch.randint(0, 100, (3, 64, 1, D + 4), generator=g, dtype=torch.uint8)
    kc = torch.randn(3, 4, 2, D, generator=g).to(torch.bfloat16)
    vc = torch.randn(3, 4, 2, 8, generator=g).to(torch.bfloat16)
    qa = torch.randn(2, 2, D, generator=g).to(torch.bfloat16)
    qm = torch.randn(1, 1, 2, 576, generator=g).to(torch.bfloat16)
    qb, kvb = q.to(torch.bfloat16), kv.to(torch.bfloat16)
    s = torch.rand(N, generator=g) + 0.5
    paged_args = (q[:2].view(2, 1, H, D), paged, w[:2], i32(70, 5), i32(0, 2)[None].repeat(2, 1))
    ops = torch.ops.dsa
    return {
        "indexer_logits": (ops.indexer_logits.default, (qb, kvb, None, w, ks, ke), {}),
        "indexer_logits[fp8]": (ops.indexer_logits.default, (q, kv, s, w, ks, ke), {}),
        "indexer_logits[fp8,precise]": (ops.indexer_logits.default, (q, kv, s, w, ks, ke), {"precise": True}),
        "paged_indexer_logits": (ops.paged_indexer_logits.default, paged_args, {"max_context_len": 80}),
        "paged_indexer_logits[precise]": (ops.paged_indexer_logits.default, paged_args,
                                          {"max_context_len": 80, "precise": True}),
        "topk": (ops.topk.default, (scores, 5), {"lengths": lengths, "row_starts": starts}),
        "topk_page_table_transform": (ops.topk_page_table_transform.default, (scores, pt, lengths, 5),
                                      {"row_starts": starts, "row_to_batch": rtb, "page_size": 16}),
        "topk_page_table_transform.out": (ops.topk_page_table_transform.out, (scores, pt, lengths, 5),
                                          {"row_to_batch": rtb, "page_size": 16,
                                           "out": torch.empty(4, 5, dtype=torch.int32),
                                           "out_raw": torch.empty(4, 5, dtype=torch.int32)}),
        "topk_ragged_transform": (ops.topk_ragged_transform.default, (scores, i32(0, 7, 100, 3), lengths, 5), {}),
        "topk[nan_first]": (ops.topk.default, (nan_scores, 5), {"lengths": lengths, "row_starts": starts,
                                                               "nan_first": True}),
        "topk_page_table_transform[nan_first]": (ops.topk_page_table_transform.default, (nan_scores, pt, lengths, 5),
                                                 {"row_to_batch": rtb, "page_size": 16, "nan_first": True}),
        "topk_ragged_transform[nan_first]": (ops.topk_ragged_transform.default,
                                             (nan_scores, i32(0, 7, 100, 3), lengths, 5), {"nan_first": True}),
        "page_table_transform": (ops.page_table_transform.default, (idx, pt), {"row_to_batch": rtb, "page_size": 64}),
        "page_table_transform.out": (ops.page_table_transform.out, (idx, pt),
                                     {"row_to_batch": rtb, "page_size": 64, "out": torch.empty_like(idx)}),
        "indexer_topk": (ops.indexer_topk.default, (qb, kvb, None, w, ks, ke, 4), {"return_scores": True}),
        "indexer_topk[fp8,precise]": (ops.indexer_topk.default, (q, kv, s, w, ks, ke, 4),
                                      {"precise": True, "return_scores": True}),
        "indexer_topk[nan_first]": (ops.indexer_topk.default, (qb, kvb, None, w, ks, ke, 4), {"nan_first": True}),
        "dequant_k_cache_paged": (ops.dequant_k_cache_paged.default, (cache_v32, slots), {"layout": "v32"}),
        "sparse_attention": (ops.sparse_attention.default, (qa, kc, vc, i32(0, 5, -1, 3).view(2, 2), i32(0, 2)[None],
                                                            i32(0, -1)), {"softmax_scale": 0.25}),
        "sparse_attention.out": (ops.sparse_attention.out, (qa, kc, vc, i32(0, 5, -1, 3).view(2, 2), i32(0, 2)[None],
                                                            i32(0, 0)),
                                 {"softmax_scale": 0.25, "out": torch.empty(2, 2, 8, dtype=torch.bfloat16)}),
        "sparse_mla_decode": (ops.sparse_mla_decode.default, (qm, cache_v32, i32(0, 3, 7).view(1, 1, 3)),
                              {"softmax_scale": 0.04, "topk_lens": i32(2)}),
    }
