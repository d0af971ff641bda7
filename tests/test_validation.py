"""Bad inputs raise DsaArgumentError naming the op and the argument; nothing is coerced silently."""

import dsa_ops
import pytest
import torch
from dsa_ops import DsaArgumentError
from op_samples import samples

S = samples()


def call(name, **changes):
    op, args, kwargs = S[name]
    names = [a.name for a in op._schema.arguments]
    args = list(args)
    for k, v in changes.items():
        i = names.index(k)
        if i < len(args):
            args[i] = v
        else:
            kwargs = {**kwargs, k: v}
    return op(*args, **kwargs)


BAD = [
    ("topk", {"scores": torch.randn(4, 50).double()}, "`scores` must have dtype float32 or bfloat16 or float16"),
    ("topk", {"scores": torch.randn(4, 50, 2)}, "`scores` must be 2-D"),
    ("topk", {"scores": torch.randn(50, 4).t()}, "`scores` must have unit stride in its last dimension"),
    ("topk", {"k": 0}, "`k` must be >= 1"),
    ("topk", {"lengths": torch.tensor([1, 2, 3, 4])}, "`lengths` must have dtype int32"),
    ("topk", {"row_starts": torch.zeros(3, dtype=torch.int32)}, "`row_starts` must have shape [4]"),
    ("page_table_transform", {"indices": torch.zeros(4, 6, dtype=torch.int64)}, "`indices` must have dtype int32"),
    ("page_table_transform", {"indices": torch.zeros(6, 4, dtype=torch.int32).t()}, "`indices` must be contiguous"),
    ("page_table_transform", {"page_size": 48}, "`page_size` must be a power of two"),
    ("page_table_transform.out", {"out": torch.empty(4, 5, dtype=torch.int32)}, "`out` must have shape [4, 6]"),
    ("page_table_transform.out", {"out": torch.empty(4, 6, dtype=torch.int64)}, "`out` must have dtype int32"),
    ("topk_page_table_transform", {"page_table": torch.zeros(2, 4)}, "`page_table` must have dtype int32"),
    ("topk_page_table_transform.out", {"out_raw": torch.empty(4, 4, dtype=torch.int32)}, "`out_raw` must have shape"),
    ("topk_ragged_transform", {"offsets": torch.zeros(4)}, "`offsets` must have dtype int32"),
    ("indexer_logits", {"kv": torch.zeros(40, 8, dtype=torch.bfloat16)}, "`kv` must have shape [*, 16]"),
    ("indexer_logits", {"kv_scale": torch.ones(40)}, "`kv_scale` must be None for bfloat16"),
    ("indexer_logits", {"weights": torch.ones(3, 5)}, "`weights` must have shape [3, 2]"),
    ("indexer_logits", {"ks": torch.zeros(3, dtype=torch.int64)}, "`ks` must have dtype int32"),
    ("paged_indexer_logits", {"kv_cache": torch.zeros(3, 32, 1, 20, dtype=torch.uint8)},
     "`kv_cache` must have shape [*, 64, 1, 20]"),
    ("indexer_topk", {"page_size": 3}, "`page_size` must be a power of two"),
    ("dequant_k_cache_paged", {"layout": "v5"}, "`layout` must be one of"),
    ("dequant_k_cache_paged", {"kv_cache": torch.zeros(3, 4, 1, 584, dtype=torch.uint8)}, "[num_blocks, P, 1, 656]"),
    ("dequant_k_cache_paged", {"slots": torch.zeros(3, dtype=torch.int64)}, "`slots` must have dtype int32"),
    ("sparse_attention", {"q": torch.zeros(2, 3, 16, dtype=torch.bfloat16)}, "query heads (3) must be a multiple"),
    ("sparse_attention", {"q": torch.zeros(2, 2, 16)}, "`q` must have dtype bfloat16"),
    ("sparse_attention", {"k_cache": torch.zeros(3, 0, 1, 16, dtype=torch.bfloat16),
                          "v_cache": torch.zeros(3, 0, 1, 16, dtype=torch.bfloat16)}, "pages must hold at least one"),
    ("dequant_k_cache_paged", {"kv_cache": torch.zeros(3, 0, 1, 656, dtype=torch.uint8)}, "pages must hold at least"),
    ("sparse_mla_decode", {"q": torch.zeros(1, 1, 2, 512, dtype=torch.bfloat16)}, "head dim must be 576"),
    ("sparse_mla_decode", {"attn_sink": torch.zeros(3)}, "`attn_sink` must have shape [2]"),
]


@pytest.mark.parametrize("name,change,message", BAD, ids=[f"{b[0]}-{next(iter(b[1]))}" for b in BAD])
def test_bad_input_names_the_argument(name, change, message):
    with pytest.raises(DsaArgumentError) as e:
        call(name, **change)
    text = str(e.value)
    assert message in text and f"dsa.{name.split('.')[0]}" in text


def test_out_buffers_that_share_memory_are_refused():
    """An out= buffer must not overlap itself, an input or the other output; page_table_transform may write its
    indices in place (the same elements), never a shifted view of them."""
    i32 = torch.int32
    scores, pt, lengths = torch.randn(4, 50), torch.zeros(2, 4, dtype=i32), torch.tensor([50, 10, 3, 0], dtype=i32)
    o = torch.empty(4, 5, dtype=i32)
    with pytest.raises(ValueError, match="`out` overlaps `out_raw`"):
        dsa_ops.topk_page_table_transform(scores, pt, lengths, 5, out=o, out_raw=o)
    with pytest.raises(ValueError, match="`out` has elements that share memory"):
        dsa_ops.topk_page_table_transform(scores, pt, lengths, 5, out=torch.empty(1, 5, dtype=i32).expand(4, 5))
    idx, table = torch.randint(0, 64, (8, 8), dtype=i32), torch.randint(0, 64, (8, 8), dtype=i32)
    with pytest.raises(ValueError, match="`out` overlaps `page_table`"):
        dsa_ops.page_table_transform(idx, table, page_size=1, out=table)
    both = torch.randint(0, 64, (9, 8), dtype=i32)
    with pytest.raises(ValueError, match="`out` overlaps `indices`"):
        dsa_ops.page_table_transform(both[:8], table, page_size=1, out=both[1:])
    want = dsa_ops.page_table_transform(idx, table, page_size=1)
    halves = torch.empty(16, 8, dtype=i32)  # disjoint halves of one buffer: adjacent, not overlapping
    halves[:8] = idx
    assert torch.equal(dsa_ops.page_table_transform(halves[:8], table, page_size=1, out=halves[8:]), want)
    assert torch.equal(dsa_ops.page_table_transform(idx, table, page_size=1, out=idx), want)  # in place


def test_device_mismatch_is_named():
    if not torch.cuda.is_available():
        pytest.skip("needs a second device type")
    with pytest.raises(DsaArgumentError, match="`lengths` is on"):
        dsa_ops.topk(torch.randn(2, 8, device="cuda"), 2, lengths=torch.ones(2, dtype=torch.int32))


def test_every_bad_case_targets_a_real_op():
    from dsa_ops._define import OPS

    assert {b[0].split(".")[0] for b in BAD} == set(OPS)


FLAG_CASES = [("indexer_logits", "indexer_logits[fp8]", "precise"),
              ("paged_indexer_logits", "paged_indexer_logits", "precise"),
              ("indexer_topk", "indexer_topk[fp8,precise]", "precise"),
              ("topk", "topk", "deterministic"),
              ("topk_page_table_transform", "topk_page_table_transform", "deterministic"),
              ("indexer_logits", "indexer_logits[fp8]", "clean"),
              ("paged_indexer_logits", "paged_indexer_logits", "clean"),
              ("indexer_topk", "indexer_topk[fp8,precise]", "exact"),
              ("indexer_topk", "indexer_topk[fp8,precise]", "return_scores")]


@pytest.mark.parametrize("api,sample,flag", FLAG_CASES, ids=[f"{c[0]}-{c[2]}" for c in FLAG_CASES])
@pytest.mark.parametrize("value", [None, 1, 0.0, torch.tensor(True)], ids=["None", "int", "float", "tensor"])
def test_flags_must_be_bools(api, sample, flag, value):
    """The API and the reference refuse what torch's argument parser would read as a bool flag (None, 0.0, a
    tensor)."""
    _, args, kwargs = S[sample]
    for fn in (getattr(dsa_ops, api), getattr(dsa_ops.reference, api)):
        with pytest.raises(DsaArgumentError, match=f"dsa.{api}: `{flag}` must be a bool"):
            fn(*args, **{**kwargs, flag: value})


def test_reference_refuses_unknown_and_repeated_arguments():
    _, args, kwargs = S["topk"]
    with pytest.raises(TypeError, match="dsa.topk: unexpected or repeated argument `largest`"):
        dsa_ops.reference.topk(*args, **kwargs, largest=True)
    with pytest.raises(TypeError, match="dsa.topk: unexpected or repeated argument `k`"):
        dsa_ops.reference.topk(*args, **kwargs, k=3)
    with pytest.raises(DsaArgumentError, match="dsa.topk: `k` must be an int"):
        dsa_ops.reference.topk(args[0], True)


INT_CASES = [("topk", "topk", "k"), ("topk_page_table_transform", "topk_page_table_transform", "k"),
             ("topk_page_table_transform", "topk_page_table_transform", "page_size"),
             ("topk_ragged_transform", "topk_ragged_transform", "k"),
             ("page_table_transform", "page_table_transform", "page_size"),
             ("indexer_topk", "indexer_topk[fp8,precise]", "k"),
             ("paged_indexer_logits", "paged_indexer_logits", "max_context_len")]


@pytest.mark.parametrize("api,sample,name", INT_CASES, ids=[f"{c[0]}-{c[2]}" for c in INT_CASES])
@pytest.mark.parametrize("value", [True, "tensor"], ids=["bool", "tensor"])
def test_int_arguments_must_be_ints(api, sample, name, value):
    """The API refuses True or a 0-d tensor for an int argument, which torch's argument parser would read as one."""
    op, args, kwargs = S[sample]
    names = [a.name for a in op._schema.arguments]
    args, kwargs = list(args), dict(kwargs)
    given = args[names.index(name)] if names.index(name) < len(args) else kwargs[name]
    bad = True if value is True else torch.tensor(given)
    if names.index(name) < len(args):
        args[names.index(name)] = bad
    else:
        kwargs[name] = bad
    with pytest.raises(DsaArgumentError, match=f"dsa.{api}: `{name}` must be an int"):
        getattr(dsa_ops, api)(*args, **kwargs)


@pytest.mark.parametrize("api,sample", [c[:2] for c in FLAG_CASES if c[2] == "precise"])
def test_precise_is_keyword_only(api, sample):
    import inspect

    op = S[sample][0]
    (arg,) = [a for a in op._schema.arguments if a.name == "precise"]
    assert arg.kwarg_only and arg.default_value is False
    p = inspect.signature(getattr(dsa_ops, api)).parameters["precise"]
    assert p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is False
