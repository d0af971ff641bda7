"""GPU tests of the device providers of dsa.indexer_logits and dsa.paged_indexer_logits (pytest -m gpu).

Each case forces one provider (`dsa_ops.use_backend`) and compares with the exact reference run on the
GPU, in both precision modes of the op's `precise` argument: precise=True (and bf16 operands in either
mode) |out - ref| <= 1e-5 * ||ref row||_2 on visible entries; precise=False (the default: fp8 MMAs)
|out - ref| <= 1e-3 * max |ref row| there. Outside the windows -inf at exactly the reference's
positions. One case per op also calls the provider's kernel directly into an output poisoned before
the call, to check that every element is written. The default mode's top-k (k 2048) overlaps the exact
scores' top-k in >= 99% of each row's indices (test_default_mode_topk_overlap).
"""

from __future__ import annotations

import dsa_ops
import pytest
import torch
from dsa_ops import registry
from dsa_ops.ops.indexer_logits import reference as ref_dense
from dsa_ops.ops.paged_indexer_logits import reference as ref_paged

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (run `pytest -m gpu` on the H200)"),
]

FP8 = torch.float8_e4m3fn
BACKENDS = ["triton", "cuda"]  # dense indexer_logits providers
PAGED_BACKENDS = ["triton", "cuda"]  # paged_indexer_logits providers
POISON = 12345.0
MODES = [False, True]  # the ops' `precise` argument


def _mode_id(precise):
    return "precise" if precise else "default"


_REF_CACHE = {}


def _ref_dense_cached(key, args):
    """The reference of a case, computed once for every backend (the large cases take seconds)."""
    if key not in _REF_CACHE:
        _REF_CACHE.clear()
        _REF_CACHE[key] = ref_dense(*args, True)
    return _REF_CACHE[key]


def _direct(backend):
    """The provider's kernel called directly (launch(..., out=)), for the poisoned-output checks."""
    if backend == "triton":
        from dsa_ops.backends.triton import indexer_logits as il

        return lambda *a, out: il.launch(*a, out=out)
    from dsa_ops.backends.cuda import providers_indexer as pi

    return lambda *a, out: pi.run(*a, out=out)  # a: op args incl. precise


def _check_windows(out, ref):
    """-inf exactly outside the windows (the reference's -inf), finite inside; returns the inside mask."""
    assert out.shape == ref.shape
    vis = torch.isfinite(ref)
    bad_outside = (~vis) & (out != ref)
    assert not bad_outside.any(), f"not -inf outside the windows at {bad_outside.nonzero()[:5].tolist()}"
    assert torch.isfinite(out[vis]).all(), "non-finite value inside a window"
    return vis


def _assert_within(err, size, tol, args, size_name):
    """Every row's errors `err` within tol x its `size` ([rows, 1], named `size_name` in the message). With
    `args` (see _check), the entries of at most 64 rows past that bound pass within tol x their condition."""
    bound = tol * size.expand_as(err)
    over = (err > bound).any(dim=1).nonzero().flatten()
    if args is not None and 0 < len(over) <= 64:
        bound = bound.clone()
        bound[over] = torch.maximum(bound[over], tol * _condition(args, over))
    excess = (err - bound).amax(dim=1)
    r = int(excess.argmax())
    assert excess[r] <= 0, (f"row {r}: max err {err[r].max().item():.3g} > {tol} * {size_name} "
                            f"{size[r].item():.3g}" + (" (and its condition)" if args is not None else ""))


def _check(out, ref, tol=1e-5, args=None):
    """-inf exactly outside the windows, finite inside, and within tol x the row norm there.

    With `args` (the dense op's q, kv, kv_scale, weights, ks, ke, or a callable, see _condition), an
    entry of a row past that bound
    passes if within tol x its condition, sum_h |w[t,h]| |s[j]| sum_d |q[t,h,d] kv[j,d]|: the size
    of the terms whose summation order differs. An ill-conditioned row (a window of one key whose
    score is the cancelling sum of head terms hundreds of times larger) is beyond any fp32 kernel at
    1e-5 of its norm (docs/design_indexer.md, "Precision modes"); a wrong head, key or window still
    fails, as its error is of the size of the terms themselves.
    """
    vis = _check_windows(out, ref)
    norm = torch.where(vis, ref, 0).double().norm(dim=1, keepdim=True)
    err = torch.where(vis, (out.double() - ref.double()).abs(), 0)
    _assert_within(err, norm, tol, args, "row norm")


def _check_default(out, ref, args=None, tol=1e-3):
    """The default mode (fp8 MMAs): -inf exactly outside the windows, finite inside, and within tol x the
    row's largest |ref| there. With `args` (as for _check: the dense op's arguments or a callable), an entry of
    a row past that bound (at most 64 such rows) passes if within tol x its condition (see _check): a
    window of a few keys whose scores cancel across heads. Prints the worst error / row max."""
    vis = _check_windows(out, ref)
    if not vis.any():
        return
    rmax = torch.where(vis, ref, 0).double().abs().amax(dim=1, keepdim=True)
    err = torch.where(vis, (out.double() - ref.double()).abs(), 0)
    rel = (err.amax(dim=1, keepdim=True) / rmax.clamp_min(1e-30))[rmax > 0]
    if rel.numel():
        print(f"\n  default mode: max err / row max {rel.max().item():.2e}, median {rel.median().item():.2e}")
    _assert_within(err, rmax, tol, args, "row max |score|")


def _check_mode(out, ref, precise, *, fp8=True, args=None):
    """The bound of the op's mode: _check (1e-5 of the row norm) for precise=True or bf16 operands,
    _check_default (1e-3 of the row max) for fp8 operands in the default mode."""
    if precise or not fp8:
        _check(out, ref, args=args)
    else:
        _check_default(out, ref, args=args)


def _condition(args, rows):
    """sum_h |w[t,h]| |s[j]| sum_d |q[t,h,d] kv[j,d]| for the rows `rows`, in float64. `args`: the dense
    op's arguments, or a callable rows -> condition (the paged form's, see _paged_condition)."""
    if callable(args):
        return args(rows)
    q, kv, s, w = args[:4]
    qa = q[rows].double().abs()  # [R, H, D]
    ka = kv.double().abs()  # [N, D]
    dots = torch.einsum("rhd,nd->rhn", qa, ka)
    cond = torch.einsum("rh,rhn->rn", w[rows].double().abs(), dots)
    return cond * (s.double().abs() if s is not None else 1.0)


def _dense(t, n, h, dtype, windows, *, wt_noncontig=False, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    d = 128
    q = (torch.randn(t, h, d, device="cuda", generator=g) * 2).to(dtype)
    kv = (torch.randn(n, d, device="cuda", generator=g) * 2).to(dtype)
    s = (torch.rand(n, device="cuda", generator=g) + 0.25) if dtype == FP8 else None
    w = (torch.randn(h, t, device="cuda", generator=g).t() if wt_noncontig
         else torch.randn(t, h, device="cuda", generator=g))
    ar = torch.arange(t, device="cuda")
    if windows == "full":
        ks = torch.zeros(t, dtype=torch.int32, device="cuda")
        ke = torch.full((t,), n, dtype=torch.int32, device="cuda")
    elif windows == "causal":
        ks = torch.zeros(t, dtype=torch.int32, device="cuda")
        ke = (n - t + ar + 1).to(torch.int32)
    elif windows == "sliding":  # short windows scattered over the keys (many tiles skipped)
        ks = torch.randint(-64, n, (t,), device="cuda", generator=g, dtype=torch.int32)
        ke = ks + torch.randint(0, 2048, (t,), device="cuda", generator=g, dtype=torch.int32)
    else:  # hostile
        ks = torch.randint(-2 * n, 2 * n, (t,), device="cuda", generator=g, dtype=torch.int32)
        ke = torch.randint(-2 * n, 2 * n, (t,), device="cuda", generator=g, dtype=torch.int32)
        fixed = torch.tensor([[-5, n + 7], [0, n], [3, 3], [n, n + 10], [-10, -1], [7, 2], [n - 1, n],
                              [0, 1], [-(2**31), 2**31 - 1], [n // 2, n // 2 + 65]], dtype=torch.int32)
        k = min(t, len(fixed))
        ks[:k], ke[:k] = fixed[:k, 0].cuda(), fixed[:k, 1].cuda()
    return q, kv, s, w, ks, ke


def _row_strided(q, kv):
    """q and kv as views of wider zero-filled tensors: q rows 2D apart, kv rows 3D apart (kv in the middle
    third, so a tensor map's row stride is 384 bytes)."""
    t, h, d = q.shape
    q_wide = torch.zeros(t, h, 2 * d, dtype=q.dtype, device="cuda")
    q_wide[:, :, :d] = q
    kv_wide = torch.zeros(kv.shape[0], 3 * d, dtype=kv.dtype, device="cuda")
    kv_wide[:, d:2 * d] = kv
    return q_wide[:, :, :d], kv_wide[:, d:2 * d]


DENSE_CASES = [
    # (T, N, H, dtype, windows)
    (1000, 5000, 64, FP8, "hostile"),
    (1000, 5000, 32, FP8, "hostile"),
    (777, 3333, 64, torch.bfloat16, "hostile"),
    (777, 3333, 32, torch.bfloat16, "causal"),
    (513, 8191, 64, FP8, "causal"),
    (2048, 20000, 64, FP8, "sliding"),
    (3, 1 << 20, 64, FP8, "full"),  # 1M-key rows
    (70000, 300, 32, FP8, "hostile"),  # more than 65535 rows
    (4096, 32768, 64, FP8, "full"),  # real prefill size
]


def _ids(c):
    t, n, h, dt, w = c
    return f"T{t}-N{n}-H{h}-{'fp8' if dt == FP8 else 'bf16'}-{w}"


@pytest.mark.parametrize("precise", MODES, ids=_mode_id)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", DENSE_CASES, ids=_ids)
def test_indexer_logits(backend, precise, case):
    t, n, h, dtype, windows = case
    args = _dense(t, n, h, dtype, windows)
    with dsa_ops.use_backend(backend):
        out = dsa_ops.indexer_logits(*args) if not precise else dsa_ops.indexer_logits(*args, precise=True)
    torch.cuda.synchronize()
    _check_mode(out, _ref_dense_cached(case, args), precise, fp8=dtype == FP8, args=args)


@pytest.mark.parametrize("precise", MODES, ids=_mode_id)
@pytest.mark.parametrize("backend", BACKENDS)
def test_indexer_logits_weights_noncontig_and_poisoned(backend, precise):
    args = _dense(600, 4000, 64, FP8, "hostile", wt_noncontig=True, seed=3)
    assert not args[3].is_contiguous()
    p = registry.providers("indexer_logits")[backend]
    ref = ref_dense(*args, True)
    out = torch.full((600, 4000), POISON, device="cuda")
    _direct(backend)(*args, True, precise, out=out)
    _check_mode(out, ref, precise, args=args)
    with dsa_ops.use_backend(backend):
        assert p.supports(*args, True, precise) is None
        got = dsa_ops.indexer_logits(*args, precise=precise)
    assert torch.equal(got, out)  # the op runs the kernel of its mode


@pytest.mark.parametrize("precise", MODES, ids=_mode_id)
@pytest.mark.parametrize("backend", BACKENDS)
def test_indexer_logits_relu_plateau_and_unclean(backend, precise):
    """All-negative dots (every score exactly 0, fp8 MMAs too: a sum of negative products stays negative)
    and clean=False (only the windows are compared)."""
    q, kv, s, w, ks, ke = _dense(300, 2000, 64, FP8, "hostile", seed=5)
    kv = (-kv.float().abs()).to(FP8)
    q = q.float().abs().to(FP8)
    with dsa_ops.use_backend(backend):
        out = dsa_ops.indexer_logits(q, kv, s, w, ks, ke, precise=precise)
        unclean = dsa_ops.indexer_logits(q, kv, s, w, ks, ke, clean=False, precise=precise)
    ref = ref_dense(q, kv, s, w, ks, ke, True)
    _check(out, ref)
    vis = torch.isfinite(ref)
    assert torch.equal(unclean[vis], ref[vis])  # exact zeros


@pytest.mark.parametrize("precise", MODES, ids=_mode_id)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [FP8, torch.bfloat16], ids=["fp8", "bf16"])
@pytest.mark.parametrize("h", [64, 32])
def test_indexer_logits_strided_and_poisoned(backend, dtype, h, precise):
    """Row-strided q and kv (views of wider tensors), strided kv_scale / ks / ke / weights, every head
    count and dtype, into a poisoned output: every element written, hostile windows."""
    t, n = 333, 2999
    q, kv, s, w, ks, ke = _dense(t, n, h, dtype, "hostile", seed=7)
    q, kv = _row_strided(q, kv)
    if s is not None:
        s = torch.stack([s, -s], 1)[:, 0]  # stride 2
    w = torch.stack([w, w], 2)[:, :, 1]  # strides (2H, 2)
    kse = torch.stack([ks, ke], 1)
    ks, ke = kse[:, 0], kse[:, 1]  # stride 2
    args = (q, kv, s, w, ks, ke)
    out = torch.full((t, n), POISON, device="cuda")
    ref = ref_dense(*args, True)
    _direct(backend)(*args, True, precise, out=out)
    _check_mode(out, ref, precise, fp8=dtype == FP8, args=args)
    with dsa_ops.use_backend(backend):
        _check_mode(dsa_ops.indexer_logits(*args, precise=precise), ref, precise, fp8=dtype == FP8, args=args)


@pytest.mark.parametrize("precise", MODES, ids=_mode_id)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("h", [64, 32])
def test_indexer_logits_negative_scales(backend, h, precise):
    """kv_scale of both signs (and +0.0, -0.0): relu applies to dot * scale, so a negative scale keeps the
    negative dots. (Triton, precise: 500 x 64 (row, head) pairs take its widened-kv path;
    test_triton_fp8_paths forces each path.)"""
    q, kv, s, w, ks, ke = _dense(500, 3000, h, FP8, "hostile", seed=9)
    s = s * torch.where(torch.arange(3000, device="cuda") % 3 == 0, -1.0, 1.0)
    s[7::50] = 0.0
    s[5::50] = -0.0
    out = torch.full((500, 3000), POISON, device="cuda")
    _direct(backend)(q, kv, s, w, ks, ke, True, precise, out=out)
    _check_mode(out, ref_dense(q, kv, s, w, ks, ke, True), precise, args=(q, kv, s, w, ks, ke))


# The CUDA dense kernels by explicit config (IndexerLogitsParams::config; the op runs config 0, the
# launcher's choice: TMA where it takes the call). TMA (1: 4 math warpgroups, 2: 3) takes fp8 operands with
# fp8 MMAs only, checked against the default mode's bound on every dense case; for bf16 operands or
# precise=True the launcher must refuse it by name. CP_ASYNC (3) takes every mode. Always into a poisoned
# output with clean=True: every element written.
TMA_CONFIGS = [1, 2]  # providers_indexer.TMA, TMA3
TMA_SMALL_CASES = [(37, 100, 64, FP8, "hostile"), (37, 100, 32, FP8, "causal")]  # N below one TMA box


def _run_config(args, precise, out, config, clean=True):
    from dsa_ops.backends.cuda import providers_indexer as pi

    return pi.run(*args, clean, precise, config=config, out=out)


@pytest.mark.parametrize("config", TMA_CONFIGS, ids=lambda c: f"config{c}")
@pytest.mark.parametrize("precise", MODES, ids=_mode_id)
@pytest.mark.parametrize("case", DENSE_CASES + TMA_SMALL_CASES, ids=_ids)
def test_indexer_logits_tma_variant(case, precise, config):
    t, n, h, dtype, windows = case
    args = _dense(t, n, h, dtype, windows)
    out = torch.full((t, n), POISON, device="cuda")
    if dtype != FP8 or precise:
        with pytest.raises(RuntimeError, match="configs 1 and 2"):
            _run_config(args, precise, out, config)
        return
    _run_config(args, precise, out, config)
    torch.cuda.synchronize()
    _check_default(out, _ref_dense_cached(case, args), args=args)


@pytest.mark.parametrize("precise", MODES, ids=_mode_id)
@pytest.mark.parametrize("case", DENSE_CASES, ids=_ids)
def test_indexer_logits_cp_async_config(case, precise):
    """The cp.async kernel (config 3), which the default runs for exact products, by explicit config also
    in the fp8-MMA mode, where the default runs TMA."""
    from dsa_ops.backends.cuda import providers_indexer as pi

    t, n, h, dtype, windows = case
    args = _dense(t, n, h, dtype, windows)
    out = torch.full((t, n), POISON, device="cuda")
    _run_config(args, precise, out, pi.CP_ASYNC)
    torch.cuda.synchronize()
    _check_mode(out, _ref_dense_cached(case, args), precise, fp8=dtype == FP8, args=args)


@pytest.mark.parametrize("precise", MODES, ids=_mode_id)
@pytest.mark.parametrize("case", DENSE_CASES + TMA_SMALL_CASES, ids=_ids)
def test_indexer_logits_tma_f16_config(case, precise):
    """TMA in the exact mode (config 4): fp8 operands with precise=True only (refused by name otherwise);
    the same key rows, Q permutation, MMAs and epilogue as the cp.async kernel (config 3), so its scores are
    bitwise config 3's, and within the exact mode's bound."""
    from dsa_ops.backends.cuda import providers_indexer as pi

    t, n, h, dtype, windows = case
    args = _dense(t, n, h, dtype, windows)
    out = torch.full((t, n), POISON, device="cuda")
    if dtype != FP8 or not precise:
        with pytest.raises(RuntimeError, match="config 4"):
            _run_config(args, precise, out, pi.TMA_F16)
        return
    _run_config(args, True, out, pi.TMA_F16)
    want = _run_config(args, True, torch.full((t, n), POISON, device="cuda"), pi.CP_ASYNC)
    torch.cuda.synchronize()
    assert torch.equal(out, want), "config 4 scores differ from config 3's in the exact mode"
    _check_mode(out, _ref_dense_cached(case, args), True, fp8=True, args=args)


@pytest.mark.parametrize("windows", ["hostile", "causal"])
@pytest.mark.parametrize("config", TMA_CONFIGS + [4], ids=lambda c: f"config{c}")
@pytest.mark.parametrize("h", [64, 32])
def test_indexer_logits_tma_tail_split(h, config, windows):
    """The TMA kernels' last partial round of items cut into equal tile shares (TailSplitCursor): rows chosen
    from this GPU's SM count so that the items are 8.5 rounds of whole-key chunks, the tail's pieces start
    and end inside items, into a poisoned output. Config 4 (exact mode) bitwise config 3's."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    t, n = (128 // h) * (8 * sms + sms // 2), 3000  # one chunk a row block: 12 (16) key tiles at config 1 (2, 4)
    precise = config == 4
    args = _dense(t, n, h, FP8, windows, seed=23)
    out = torch.full((t, n), POISON, device="cuda")
    _run_config(args, precise, out, config)
    _check_mode(out, ref_dense(*args, True), precise, args=args)
    if precise:
        assert torch.equal(out, _run_config(args, True, torch.full_like(out, POISON), 3))  # CP_ASYNC


@pytest.mark.parametrize("h", [64, 32])
def test_indexer_logits_overlapping_kv_rows(h):
    """kv rows 64 bytes apart (overlapping: no tensor map takes them): the TMA configs refuse by name, the
    default runs the cp.async kernel, within the default mode's bound."""
    from dsa_ops.backends.cuda import providers_indexer as pi

    t, n = 300, 2000
    q, kv, s, w, ks, ke = _dense(t, n, h, FP8, "hostile", seed=21)
    kv = torch.as_strided(kv, (n // 2, 128), (64, 1))
    s = s[: n // 2].contiguous()
    args = (q, kv, s, w, ks, ke)
    out = torch.full((t, n // 2), POISON, device="cuda")
    for config in TMA_CONFIGS:
        with pytest.raises(RuntimeError, match="do not overlap"):
            _run_config(args, False, out, config)
    with pytest.raises(RuntimeError, match="do not overlap"):
        _run_config(args, True, out, pi.TMA_F16)
    pi.run(*args, True, False, out=out)  # config 0: the launcher picks cp.async here
    torch.cuda.synchronize()
    _check_default(out, ref_dense(*args, True), args=args)


@pytest.mark.parametrize("layout", ["strided", "misaligned"])
@pytest.mark.parametrize("h", [64, 32])
def test_indexer_logits_scales_not_tma(h, layout):
    """kv_scale strided (every other float) or 4 bytes off a 16-byte boundary: no 1-D tensor map takes it, so
    configs 1 and 2 (each stage's scales copied by TMA) refuse by name and the default runs the cp.async
    kernel, within the default mode's bound. N off the 256-key stage (the scale box's zero-filled tail)."""
    t, n = 300, 2001
    q, kv, s, w, ks, ke = _dense(t, n, h, FP8, "hostile", seed=23)
    wide = torch.full((2 * n + 1,), float("nan"), device="cuda")
    if layout == "strided":
        wide[0 : 2 * n : 2] = s
        s = wide[0 : 2 * n : 2]
    else:
        wide[1 : n + 1] = s
        s = wide[1 : n + 1]
    args = (q, kv, s, w, ks, ke)
    out = torch.full((t, n), POISON, device="cuda")
    for config in TMA_CONFIGS:
        with pytest.raises(RuntimeError, match="contiguous, 16-byte aligned kv_scale"):
            _run_config(args, False, out, config)
    _run_config(args, False, out, 0)
    torch.cuda.synchronize()
    _check_default(out, ref_dense(*args, True), args=args)


@pytest.mark.parametrize("config", TMA_CONFIGS + [4], ids=lambda c: f"config{c}")
@pytest.mark.parametrize("h", [64, 32])
def test_indexer_logits_tma_variant_strided_signed_unclean(h, config):
    """The TMA variant on a row-strided kv (the tensor map's row stride 384 bytes), strided q, scales of
    both signs and zeros (the signed epilogue), then clean=False (only the windows compared). Config 4
    (providers_indexer.TMA_F16) in the exact mode, bitwise config 3's there."""
    precise = config == 4
    t, n = 333, 2999
    q, kv, s, w, ks, ke = _dense(t, n, h, FP8, "hostile", seed=11)
    q, kv = _row_strided(q, kv)
    s = s * torch.where(torch.arange(n, device="cuda") % 3 == 0, -1.0, 1.0)
    s[7::50] = 0.0
    s[5::50] = -0.0
    args = (q, kv, s, w, ks, ke)
    ref = ref_dense(*args, True)
    out = torch.full((t, n), POISON, device="cuda")
    _run_config(args, precise, out, config)
    _check_mode(out, ref, precise, args=args)
    if precise:
        assert torch.equal(out, _run_config(args, True, torch.full_like(out, POISON), 3))  # CP_ASYNC
    unclean = torch.full((t, n), POISON, device="cuda")
    _run_config(args, precise, unclean, config, clean=False)
    vis = torch.isfinite(ref)
    assert torch.equal(unclean[vis], out[vis])  # the same kernel arithmetic inside the windows


@pytest.mark.parametrize("widen", [True, False], ids=["widened", "in-loop"])
@pytest.mark.parametrize("h", [64, 32])
def test_triton_fp8_paths(h, widen):
    """The Triton provider's two exact fp8 paths (precise=True), each forced on one small shape: kv widened to fp16 once
    before the kernel (the launcher's choice from WIDEN_MIN_HEAD_ROWS (row, head) pairs up; |scale| after
    the head sum, signs folded into kv), or widened tile by tile in the kernel (below it). Hostile
    windows, scales of both signs, +0.0 and -0.0."""
    from dsa_ops.backends.triton import indexer_logits as il

    t, n = 300, 1000
    q, kv, s, w, ks, ke = _dense(t, n, h, FP8, "hostile", seed=5)
    s = s * torch.where(torch.arange(n, device="cuda") % 3 == 0, -1.0, 1.0)
    s[7::50] = 0.0
    s[5::50] = -0.0
    floor, il.WIDEN_MIN_HEAD_ROWS = il.WIDEN_MIN_HEAD_ROWS, (0 if widen else 1 << 62)
    try:
        out = torch.full((t, n), POISON, device="cuda")
        il.launch(q, kv, s, w, ks, ke, True, True, out=out)
    finally:
        il.WIDEN_MIN_HEAD_ROWS = floor
    _check(out, ref_dense(q, kv, s, w, ks, ke, True), args=(q, kv, s, w, ks, ke))


@pytest.mark.parametrize("precise", MODES, ids=_mode_id)
@pytest.mark.parametrize("backend", BACKENDS)
def test_indexer_logits_empty(backend, precise):
    q, kv, s, w, ks, ke = _dense(4, 0, 64, FP8, "full")
    with dsa_ops.use_backend(backend):
        assert dsa_ops.indexer_logits(q, kv, s, w, ks, ke, precise=precise).shape == (4, 0)
        q0, w0, ks0, ke0 = q[:0], w[:0], ks[:0], ke[:0]
        kv1, s1 = _dense(1, 100, 64, FP8, "full")[1:3]
        assert dsa_ops.indexer_logits(q0, kv1, s1, w0, ks0, ke0, precise=precise).shape == (0, 100)


def _paged(b, next_n, h, ctx, nb, max_blocks, *, hostile, seed=0, pad=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    d = 128
    q = (torch.randn(b, next_n, h, d, device="cuda", generator=g) * 2).to(FP8)
    vals = (torch.randn(nb, 64, d, device="cuda", generator=g) * 2).to(FP8).view(torch.uint8).reshape(nb, -1)
    sc = (torch.rand(nb, 64, device="cuda", generator=g) + 0.25).view(torch.uint8).reshape(nb, -1)
    raw = torch.cat([vals, sc, torch.zeros(nb, pad, dtype=torch.uint8, device="cuda")], 1)
    cache = raw[:, : 64 * (d + 4)].view(nb, 64, 1, d + 4) if pad else raw.reshape(nb, 64, 1, d + 4)
    w = torch.randn(b * next_n, h, device="cuda", generator=g)
    table = torch.randint(0, nb, (b, max_blocks), device="cuda", generator=g, dtype=torch.int32)
    if hostile:
        junk = torch.randint(0, 6, (b, max_blocks), device="cuda", generator=g)
        table[junk == 0] = -1
        table[junk == 1] = nb + 5
        table[junk == 2] = -(2**31)
    ctx = torch.as_tensor(ctx, dtype=torch.int32, device="cuda")
    return q, cache, w, ctx, table


PAGED_CASES = [
    # (B, next_n, H, ctx lens, num_blocks, max_blocks, L, hostile, pad)
    (8, 1, 64, [5000, 1, 0, -7, 4096, 9000, 64, 65], 300, 100, 6000, True, 0),
    (8, 2, 64, [5000, 1, 0, -7, 4096, 9000, 64, 65], 300, 100, 6400, True, 0),
    (4, 4, 32, [3000, 2, 130, 6400], 200, 100, 6400, True, 0),
    (4, 3, 64, [3000, 2, 130, 6400], 200, 100, 6400, False, 64),
    (64, 1, 64, [65536] * 64, 65536, 1024, 65536, False, 0),  # the benchmark's decode size
]


# (backend, variant): the CUDA kernel's config (providers_paged_indexer.make_config): 2 or 3 math
# warpgroups with the default loader and schedule, then explicit ones (hundreds digit 1: chunks, 2:
# balanced; tens 1: cp.async, 2: bulk, 3: TMA pages read by the MMAs from shared memory; units 4: 3 math
# warpgroups fed by a producer warpgroup, 5: 4 fed by one). A config the launcher does not offer for a case (3
# warpgroups with a producer warp at MMA N = 128, 4 at N <= 64, 5 at N = 128 but with loader 3, loader 3 but
# with 4 or 5 at N = 128 in the fp8 mode) must be refused by name.
PAGED_VARIANTS = [("triton", None), ("cuda", 2), ("cuda", 3), ("cuda", 113), ("cuda", 213), ("cuda", 222),
                  ("cuda", 223), ("cuda", 224), ("cuda", 115), ("cuda", 225), ("cuda", 134), ("cuda", 234),
                  ("cuda", 235)]


@pytest.mark.parametrize("precise", MODES, ids=_mode_id)
@pytest.mark.parametrize("backend,wg", PAGED_VARIANTS, ids=lambda v: str(v))
@pytest.mark.parametrize("case", PAGED_CASES,
                         ids=lambda c: f"B{c[0]}-n{c[1]}-H{c[2]}-L{c[6]}-{'hostile' if c[7] else 'ok'}")
def test_paged_indexer_logits(backend, wg, case, precise):
    b, next_n, h, ctx, nb, mb, L, hostile, pad = case
    args = _paged(b, next_n, h, ctx, nb, mb, hostile=hostile, pad=pad)
    with dsa_ops.use_backend(backend):
        out = dsa_ops.paged_indexer_logits(*args, max_context_len=L, precise=precise)
    ref = ref_paged(*args, L, True)
    _check_mode(out, ref, precise, args=_paged_condition(args, L))
    poisoned = torch.full((b * next_n, L), POISON, device="cuda")
    if backend == "cuda" and not _offered(wg, next_n, h, precise):
        with pytest.raises(RuntimeError, match="config"):
            _paged_direct(backend, wg)(*args, L, True, precise, out=poisoned)
        return
    _paged_direct(backend, wg)(*args, L, True, precise, out=poisoned)
    if backend == "cuda" and _natural_order(wg, next_n, h, precise) != _natural_order(0, next_n, h, precise):
        # Loader 3's MMAs read the keys in natural D order (the others permute D in A and Q alike): the fp8
        # MMAs group the products otherwise, so across the two its scores are checked against the reference,
        # every element, with the same -inf pattern.
        _check_mode(poisoned, ref, precise, args=_paged_condition(args, L))
        assert torch.equal(torch.isfinite(poisoned), torch.isfinite(out))
        return
    # Every element written, and bitwise the op's result: every config of the op's loader class runs the same
    # per-page arithmetic.
    assert torch.equal(poisoned, out)


def _natural_order(config, next_n, h, precise):
    from dsa_ops.backends.cuda import providers_paged_indexer as ppi

    return ppi.natural_order(config or 0, h, next_n, precise)


def _offered(config, next_n, h, precise):
    """Whether the CUDA launcher takes `config` for the shape (3 warpgroups at MMA N <= 64 only, 3 fed by a
    producer warpgroup at N = 128 only, 4 fed by one at N <= 64 only but with loader 3; loader 3 with 3 or 4
    fed by a producer warpgroup at N = 128 in the fp8 mode only)."""
    from dsa_ops.backends.cuda import providers_paged_indexer as ppi

    if config // 10 % 10 == ppi.TMA:
        return config % 10 in (ppi.PRODUCER_WG, ppi.FOUR_WGS) and ppi.tma_offered(h, next_n, precise)
    if config % 10 == ppi.PRODUCER_WG:
        return ppi.producer_warpgroup_offered(h, next_n)
    if config % 10 == ppi.FOUR_WGS:
        return ppi.four_warpgroups_offered(h, next_n)
    return config % 10 != 3 or ppi.three_warpgroups_fit(h, next_n)


def _paged_direct(backend, wg=None):
    """The paged provider's kernel called directly into `out` (for the poisoned-output checks)."""
    if backend == "triton":
        from dsa_ops.backends.triton import paged_indexer_logits as pil

        return lambda *a, out: pil.launch(*a, out=out)
    from dsa_ops.backends.cuda import providers_paged_indexer as ppi

    return lambda *a, out: ppi.run(*a, out=out, config=wg or 0)


def _paged_condition(args, L):
    """The paged form's condition as a callable for _check / _check_default: the reference run on the
    absolute values (fp8 and fp32 sign bits cleared, |weights|), where relu is the identity, gives
    sum_h |w| |s| sum_d |q kv| at every visible position."""
    q, cache, w, ctx, table = args
    nb, d = cache.shape[0], cache.shape[3] - 4
    raw = cache.reshape(nb, -1).clone()  # a padded view's pages, made contiguous
    raw[:, : 64 * d] &= 0x7F
    raw[:, 64 * d:].view(torch.int32).bitwise_and_(0x7FFFFFFF)
    qa = (q.view(torch.uint8) & 0x7F).view(FP8)

    def cond(rows):
        full = ref_paged(qa, raw.view(nb, 64, 1, d + 4), w.abs(), ctx, table, L, True)[rows].double()
        return torch.where(torch.isfinite(full), full, 0)

    return cond


def _nan_unused(q, cache, w, ctx, table, next_n):
    """NaN into every cache byte no visible position reads: whole blocks no request's visible pages use,
    and the slots at or past each request's context in its last (partial) block. Values and scales."""
    nb = cache.shape[0]
    raw = cache.view(nb, -1)  # [nb, 64 * (D + 4)] bytes (contiguous cache)
    d = cache.shape[3] - 4
    used = torch.zeros(nb, dtype=torch.bool, device="cuda")
    nan_fp8 = torch.tensor([float("nan")], dtype=torch.float32).to(FP8).view(torch.uint8).item()
    nan_f32 = torch.tensor([float("nan")], dtype=torch.float32).view(torch.uint8).cuda()
    keep = []
    for r in range(q.shape[0]):
        n = max(int(ctx[r]), 0)  # the last token sees positions < ctx
        pages = min(-(-n // 64), table.shape[1])
        ids = table[r, :pages].long()
        ok = (ids >= 0) & (ids < nb)
        used[ids[ok]] = True
        if n % 64 and pages == -(-n // 64) and ok[-1]:
            keep.append((int(ids[-1]), n % 64))
    raw[~used] = nan_fp8  # fp8 0x7f is NaN; the scales' bytes become 0x7f7f7f7f (a large float) ...
    sc = raw[:, 64 * d:].view(nb, 64, 4)
    sc[~used] = nan_f32  # ... so the scales of unused blocks are set to a real fp32 NaN
    partial = {}
    for blk, m in keep:  # a block shared by two requests keeps the longer prefix
        partial[blk] = max(partial.get(blk, 0), m)
    for blk, m in partial.items():
        raw[blk, m * d: 64 * d] = nan_fp8
        sc[blk, m:] = nan_f32
    return q, cache, w, ctx, table


def _poison_table_tail(table, ctx, nb):
    """block_table entries past each request's context: -1, huge, INT32_MIN, or num_blocks (never read)."""
    table = table.clone()
    junk = torch.tensor([-1, 2**31 - 1, -(2**31), nb, nb + 1000], dtype=torch.int32, device="cuda")
    for r in range(table.shape[0]):
        pages = max(-(-int(ctx[r]) // 64), 0)
        tail = table.shape[1] - pages
        if tail > 0:
            table[r, pages:] = junk[torch.arange(tail, device="cuda") % len(junk)]
    return table


# (B, next_n, H, ctx lens, num_blocks, max_blocks, L): unique blocks per request (a permutation), the
# table past each context poisoned, NaN in every cache byte no visible position reads.
PAGED_NAN_CASES = [
    (8, 1, 64, [5000, 1, 0, 63, 64, 65, 4095, 129], 256, 80, 5120),
    (8, 2, 64, [5000, 1, 0, 2, 64, 65, 4097, 130], 256, 80, 5120),
    (6, 1, 32, [3001, 1, 0, 127, 128, 1000], 128, 60, 3840),
    (6, 2, 32, [3001, 2, 1, 127, 128, 1000], 128, 60, 3840),
    (3, 3, 64, [700, 3, 2], 40, 13, 832),
    (2, 1, 64, [64 * 300 + 17, 64 * 300 - 1], 700, 320, 64 * 301),
]


@pytest.mark.parametrize("precise", MODES, ids=_mode_id)
@pytest.mark.parametrize("backend,wg", PAGED_VARIANTS, ids=lambda v: str(v))
@pytest.mark.parametrize("case", PAGED_NAN_CASES, ids=lambda c: f"B{c[0]}-n{c[1]}-H{c[2]}-L{c[6]}")
def test_paged_nan_unused_and_poisoned_table(backend, wg, case, precise):
    b, next_n, h, ctx, nb, mb, L = case
    q, cache, w, ctx_t, _ = _paged(b, next_n, h, ctx, nb, mb, hostile=False, seed=21)
    g = torch.Generator(device="cuda").manual_seed(22)
    perm = torch.randperm(nb, device="cuda", generator=g).to(torch.int32)
    table = torch.zeros(b, mb, dtype=torch.int32, device="cuda")
    used = 0
    for r in range(b):  # each request's visible pages get blocks of their own
        pages = min(max(-(-ctx[r] // 64), 0), mb)
        table[r, :pages] = perm[used:used + pages]
        used += pages
    assert used <= nb
    table = _poison_table_tail(table, ctx_t, nb)
    args = _nan_unused(q, cache, w, ctx_t, table, next_n)
    ref = ref_paged(*args, L, True)
    out = torch.full((b * next_n, L), POISON, device="cuda")
    if backend == "cuda" and not _offered(wg, next_n, h, precise):
        with pytest.raises(RuntimeError, match="config"):
            _paged_direct(backend, wg)(*args, L, True, precise, out=out)
        return
    _paged_direct(backend, wg)(*args, L, True, precise, out=out)
    cond = _paged_condition(args, L)
    _check_mode(out, ref, precise, args=cond)
    with dsa_ops.use_backend(backend):
        _check_mode(dsa_ops.paged_indexer_logits(*args, max_context_len=L, precise=precise), ref, precise,
                    args=cond)


@pytest.mark.parametrize("precise", MODES, ids=_mode_id)
@pytest.mark.parametrize("backend", PAGED_BACKENDS)
@pytest.mark.parametrize("h", [64, 32])
@pytest.mark.parametrize("next_n", [1, 2])
def test_paged_weights_noncontig(backend, h, next_n, precise):
    b, L = 5, 2000
    q, cache, w, ctx, table = _paged(b, next_n, h, [1999, 1, 1000, 64, 0], 200, 40, hostile=True, seed=31)
    w = torch.randn(h, b * next_n, device="cuda").t()  # strides (1, B * next_n)
    assert not w.is_contiguous()
    args = (q, cache, w, ctx, table)
    with dsa_ops.use_backend(backend):
        _check_mode(dsa_ops.paged_indexer_logits(*args, max_context_len=L, precise=precise),
                    ref_paged(*args, L, True), precise, args=_paged_condition(args, L))


@pytest.mark.parametrize("precise", MODES, ids=_mode_id)
def test_cuda_paged_matches_dense_kernel_bitwise(precise):
    """The paged kernel scores with the dense cp.async kernel's core: for H = 64 and next_n = 1 (MMA N = 64
    against the dense kernel's 128, same head-sum order) the scores are bitwise that kernel's on the
    gathered keys, in each precision mode."""
    from dsa_ops.backends.cuda import providers_indexer as pi
    from dsa_ops.backends.cuda import providers_paged_indexer as ppi
    from dsa_ops.ops.paged_indexer_logits import split_cache

    b, h, L = 3, 64, 1000
    q, cache, w, ctx, table = _paged(b, 1, h, [1000, 777, 5], 60, 16, hostile=False, seed=51)
    out = ppi.run(q, cache, w, ctx, table, L, True, precise, config=2)
    assert torch.equal(out, ppi.run(q, cache, w, ctx, table, L, True, precise, config=3))
    vals, sc = split_cache(cache, 128)
    for r in range(b):
        ids = table[r].long()
        kv = vals[ids].reshape(-1, 128)[:L].to(FP8)
        s = sc[ids].reshape(-1)[:L].contiguous()
        ks = torch.zeros(1, dtype=torch.int32, device="cuda")
        ke = ctx[r:r + 1].clone()
        dense = pi.run(q[r], kv, s, w[r:r + 1], ks, ke, True, precise, config=pi.CP_ASYNC)
        assert torch.equal(dense[0], out[r]), f"request {r}"


# (B, next_n, H, ctx lens, num_blocks, max_blocks, L): tiles fewer than the SMs (balanced grid of
# a few CTAs), one request over many CTAs, CTA ranges that cross requests, and rows of 2 and 4 tokens.
PAGED_CONFIG_CASES = [
    (1, 1, 64, [200], 8, 4, 256),
    (1, 1, 64, [64 * 1000 - 5], 1200, 1000, 64 * 1000),
    (7, 1, 32, [3000, 64, 0, 1, 6400, 4097, 2500], 400, 100, 6400),
    (5, 2, 64, [3000, 2, 1, 6400, 4097], 400, 100, 6400),
    (3, 4, 32, [3000, 2, 6400], 200, 100, 6400),
]


@pytest.mark.parametrize("precise", MODES, ids=_mode_id)
@pytest.mark.parametrize("case", PAGED_CONFIG_CASES, ids=lambda c: f"B{c[0]}-n{c[1]}-H{c[2]}-L{c[6]}")
def test_cuda_paged_configs_bitwise(case, precise):
    """Every config of the CUDA paged kernel (math warpgroups x page loader x schedule) writes every
    element of a poisoned output, bitwise equal to the default config's where it runs the default's loader class,
    on hostile block tables (ids -1, past num_blocks, INT32_MIN); the default is checked against the reference.
    Across the classes (loader 3's natural D order in its MMAs against the others') a config is checked against
    the reference, with the default's -inf pattern."""
    from dsa_ops.backends.cuda import providers_paged_indexer as ppi

    b, next_n, h, ctx, nb, mb, L = case
    args = _paged(b, next_n, h, ctx, nb, mb, hostile=True, seed=71)
    ref_out = ppi.run(*args, L, True, precise)
    ref = ref_paged(*args, L, True)
    _check_mode(ref_out, ref, precise, args=_paged_condition(args, L))
    for config in ppi.variants(next_n, h, precise):
        out = torch.full((b * next_n, L), POISON, device="cuda")
        ppi.run(*args, L, True, precise, config=config, out=out)
        if ppi.natural_order(config, h, next_n, precise) != ppi.natural_order(0, h, next_n, precise):
            _check_mode(out, ref, precise, args=_paged_condition(args, L))
            assert torch.equal(torch.isfinite(out), torch.isfinite(ref_out)), f"config {config}"
        else:
            assert torch.equal(out, ref_out), f"config {config}"


@pytest.mark.parametrize("precise", MODES, ids=_mode_id)
@pytest.mark.parametrize("case", PAGED_CONFIG_CASES, ids=lambda c: f"B{c[0]}-n{c[1]}-H{c[2]}-L{c[6]}")
def test_cuda_paged_default_config(case, precise):
    """The launcher's default (config 0) is the explicit config providers_paged_indexer.default_config names for
    the shape and mode, bitwise (the Python side's mirror of `resolve`, which the tests' loader classes use)."""
    from dsa_ops.backends.cuda import providers_paged_indexer as ppi

    b, next_n, h, ctx, nb, mb, L = case
    args = _paged(b, next_n, h, ctx, nb, mb, hostile=True, seed=73)
    named = ppi.default_config(h, next_n, precise)
    assert torch.equal(ppi.run(*args, L, True, precise), ppi.run(*args, L, True, precise, config=named)), named


def test_cuda_paged_empty_cache():
    """An empty cache (0 blocks): every offered config, in both modes, writes -inf at every position, as the
    reference does (no page id is valid, so no page is read; loader 3 launches with its tensor map unencoded)."""
    from dsa_ops.backends.cuda import providers_paged_indexer as ppi

    for next_n, h in ((1, 64), (2, 64), (4, 32)):
        q = (torch.randn(2, next_n, h, 128, device="cuda") * 2).to(FP8)
        cache = torch.empty(0, 64, 1, 132, dtype=torch.uint8, device="cuda")
        w = torch.randn(2 * next_n, h, device="cuda")
        ctx = torch.tensor([100, 5], dtype=torch.int32, device="cuda")
        table = torch.zeros(2, 4, dtype=torch.int32, device="cuda")
        ref = ref_paged(q, cache, w, ctx, table, 256, True)
        for precise in (False, True):
            for config in [0] + ppi.variants(next_n, h, precise):
                out = torch.full((2 * next_n, 256), POISON, device="cuda")
                ppi.run(q, cache, w, ctx, table, 256, True, precise, config=config, out=out)
                assert torch.equal(out, ref), (next_n, h, precise, config)


def test_cuda_paged_config_rejected():
    """A config outside the three digits, 3 math warpgroups with a producer warp where they are not offered
    (MMA N = 128), 3 fed by a producer warpgroup (4) where not offered (N <= 64), 4 fed by one (5) where not
    offered (N = 128 but with loader 3), or loader 3 where not offered, is refused by name, never run as another
    variant."""
    from dsa_ops.backends.cuda import providers_paged_indexer as ppi

    args = _paged(1, 1, 64, [100], 4, 2, hostile=False)
    for bad in (4, 224, 6, 1, 31, 300, -1, 234, 235, 233, 232):
        with pytest.raises(RuntimeError, match="config"):
            ppi.run(*args, 128, True, False, config=bad)
    args2 = _paged(1, 2, 64, [100], 4, 2, hostile=False)
    for bad, precise in ((3, False), (223, False), (213, False), (113, True), (5, True), (225, True), (234, True),
                         (235, True), (232, False), (233, False)):
        with pytest.raises(RuntimeError, match="config"):
            ppi.run(*args2, 128, True, precise, config=bad)
    with pytest.raises(ValueError, match="loader"):
        ppi.make_config(3, 5, 2)
    with pytest.raises(ValueError, match="loader"):
        ppi.make_config(3, 4, 2)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("windows", ["hostile", "full"])
def test_default_mode_precision(backend, windows):
    """The default mode (fp8 MMAs) against its bound, 1e-3 of the row's largest |score|, through the op:
    dense and paged (the paged providers are the dense ones' kernels over pages)."""
    args = _dense(1000, 5000, 64, FP8, windows, seed=11)
    with dsa_ops.use_backend(backend):
        out = dsa_ops.indexer_logits(*args)
    _check_default(out, ref_dense(*args, True), args=args)
    pargs = _paged(8, 2, 64, [5000, 1, 0, -7, 4096, 9000, 64, 65], 300, 100, hostile=windows == "hostile")
    with dsa_ops.use_backend(backend):
        pout = dsa_ops.paged_indexer_logits(*pargs, max_context_len=6400)
    _check_default(pout, ref_paged(*pargs, 6400, True))


TOPK_K = 2048


def _overlap_inputs(kind, t=256, n=32768, h=64, seed=71):
    """Full windows over n keys. `random`: normal q and keys. `clustered`: keys and queries near 32
    shared centres, so each row's top 2048 sit among many close scores (the hard case for a
    lower-precision score)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    d = 128

    def normal(*shape):
        return torch.randn(*shape, device="cuda", generator=g)

    if kind == "random":
        q, kv = normal(t, h, d), normal(n, d)
    else:
        centres = normal(32, d)
        kv = centres[torch.randint(0, 32, (n,), device="cuda", generator=g)] + 0.3 * normal(n, d)
        q = centres[torch.randint(0, 32, (t, h), device="cuda", generator=g)] + 0.3 * normal(t, h, d)
    s = torch.rand(n, device="cuda", generator=g) + 0.5
    w = normal(t, h) / h
    ks = torch.zeros(t, dtype=torch.int32, device="cuda")
    ke = torch.full((t,), n, dtype=torch.int32, device="cuda")
    return q.to(FP8), kv.to(FP8), s, w, ks, ke


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["random", "clustered"])
def test_default_mode_topk_overlap(backend, kind):
    """The top-2048 (dsa_ops.topk) of the default mode's scores holds >= 99% of the exact scores' top-2048
    in every row; prints the per-row overlap's min and median."""
    args = _overlap_inputs(kind)
    with dsa_ops.use_backend(backend):
        fast = dsa_ops.indexer_logits(*args)
    _check_topk_overlap(fast, ref_dense(*args, True), f"{backend} {kind}")


def _check_topk_overlap(fast, exact, label):
    """Every row's top-TOPK_K of `fast` holds >= 99% of `exact`'s; prints the overlap's min and median."""
    t, n = fast.shape
    got, want = dsa_ops.topk(fast, TOPK_K).long(), dsa_ops.topk(exact, TOPK_K).long()
    assert (got >= 0).all() and (want >= 0).all()
    in_exact = torch.zeros(t, n, dtype=torch.bool, device="cuda").scatter_(1, want, True)
    overlap = in_exact.gather(1, got).sum(dim=1).double() / TOPK_K
    print(f"\n  {label}: top-{TOPK_K} overlap with the exact scores' top-{TOPK_K} over {t} rows: "
          f"min {overlap.min().item():.4f}, median {overlap.median().item():.4f}")
    assert overlap.min().item() >= 0.99


def test_paged_cuda_declines_and_dispatch_falls_to_triton():
    """A shape the CUDA kernel does not take (16 heads) gets a reason from its `supports`, and the
    automatic order serves it with the next provider (Triton), still against the reference."""
    from dsa_ops.backends.cuda import providers_paged_indexer as ppi

    args = _paged(3, 1, 16, [900, 5, 0], 40, 15, hostile=True, seed=61)
    assert "16 heads" in ppi.supports(*args, 960, True, False)
    for precise in MODES:
        assert registry.select("paged_indexer_logits", (*args, 960, True, precise)).backend == "triton"
        _check_mode(dsa_ops.paged_indexer_logits(*args, max_context_len=960, precise=precise),
                    ref_paged(*args, 960, True), precise, args=_paged_condition(args, 960))
