"""Installing dsa_ops.inductor: once per process, chained with a pass set before import, and correct
under a warm FX graph cache. Each run is a fresh interpreter (the import is part of what is tested)
sharing one TORCHINDUCTOR_CACHE_DIR under tmp_path, FX graph cache on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

PRELUDE = """
import importlib, json, sys
import torch
from torch._inductor import config
from torch._inductor.custom_graph_pass import CustomGraphPass


class UserPass(CustomGraphPass):  # another library's pass, set before dsa_ops is imported
    saw_gather = []

    def __call__(self, graph):
        UserPass.saw_gather.append(any(n.target is torch.ops.aten.gather.default for n in graph.nodes))

    def uuid(self):
        return "user-pass-v1"


user = UserPass()
config.post_grad_custom_post_pass = user

import dsa_ops
import dsa_ops  # noqa: F811  (a second import changes nothing)
import dsa_ops.inductor as di

P, K = 64, 16


def indexer(q, kv, w, ks, ke, pt):  # pattern 1, with the page arithmetic of pattern 3 after it
    idx = dsa_ops.topk(dsa_ops.indexer_logits(q, kv, None, w, ks, ke), K, row_starts=ks, lengths=ke - ks)
    i = idx.clamp(min=0)
    return torch.where(idx < 0, -1, pt.gather(1, (i // P).long()) * P + i % P)


def topk_mapped(scores, lengths, pt):  # pattern 2 (unfused it is two extern calls: no C++ to build)
    return dsa_ops.page_table_transform(dsa_ops.topk(scores, K, lengths=lengths), pt)


g = torch.Generator().manual_seed(0)
ks = torch.randint(0, 50, (4,), generator=g, dtype=torch.int32)
pt = torch.randperm(64, generator=g)[:24].view(4, 6).int()
INDEXER_ARGS = (torch.randn(4, 2, 32, generator=g).bfloat16(), torch.randn(200, 32, generator=g).bfloat16(),
                torch.randn(4, 2, generator=g), ks, ks + 100, pt)
TOPK_ARGS = (torch.randn(4, 300, generator=g), torch.randint(0, 300, (4,), generator=g, dtype=torch.int32),
             pt)


def compile_once(model, args):
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    counters.clear()
    di.counters.clear()
    out, code = run_and_get_code(torch.compile(model, fullgraph=True, dynamic=True), *args)
    code = "\\n".join(code)
    want = model(*args)
    return dict(
        ours={k: v for k, v in di.counters.items() if "/" not in k},
        hit=counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"],
        miss=counters["inductor"]["fxgraph_cache_miss"],
        fused=any(s in code for s in ("dsa.indexer_topk", "dsa.topk_page_table_transform")),
        unfused=any(s in code for s in ("dsa.topk.", "indexer_logits", "aten.topk", "aten.gather")),
        # order within a row is unspecified: compare per-row sorted
        equal=bool(torch.equal(out.sort(1).values, want.sort(1).values)),
    )
"""


def run_py(tmp_path, body: str) -> dict:
    """PRELUDE + body in a fresh interpreter; body prints one JSON line last."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor_cache"),
               TORCHINDUCTOR_FX_GRAPH_CACHE="1", TORCHINDUCTOR_AUTOGRAD_CACHE="1")
    script = tmp_path / "run.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_import_installs_once_chains_and_survives_a_warm_cache(tmp_path):
    cold = run_py(tmp_path, """
        p = config.post_grad_custom_post_pass
        assert di.installed() is p and p.previous is user, p  # chained, not replaced
        assert di.install() is p and di.install() is p and config.post_grad_custom_post_pass is p
        assert "user-pass-v1" in repr(p.uuid())  # the chained pass is part of the cache key
        res = dict(indexer=compile_once(indexer, INDEXER_ARGS), topk=compile_once(topk_mapped, TOPK_ARGS),
                   user_saw_gather=UserPass.saw_gather)
        # Even a reloaded module (a new class object) recognises the pass already installed.
        assert importlib.reload(sys.modules["dsa_ops.inductor._pass"]).install() is p
        assert config.post_grad_custom_post_pass is p
        print(json.dumps(res))
    """)
    # The user's pass ran first (it still saw the gather), then ours rewrote; both graphs were stored.
    assert cold["user_saw_gather"] == [True, False]
    assert cold["indexer"]["ours"] == {"page_table_transform": 1, "indexer_topk": 1}
    assert cold["topk"]["ours"] == {"topk_page_table_transform": 1}
    for r in (cold["indexer"], cold["topk"]):
        assert r["miss"] >= 1 and r["hit"] == 0 and r["fused"] and not r["unfused"] and r["equal"]

    warm = run_py(tmp_path, """
        hits = [compile_once(indexer, INDEXER_ARGS), compile_once(topk_mapped, TOPK_ARGS)]
        di.config.enabled = False  # part of the uuid: a new key, so no stale fused graph comes back
        off = compile_once(topk_mapped, TOPK_ARGS)
        print(json.dumps(dict(hits=hits, off=off, user_calls=len(UserPass.saw_gather))))
    """)
    for r in warm["hits"]:
        assert r["hit"] >= 1 and r["ours"] == {}  # served from the cache: the pass did not run...
        assert r["fused"] and not r["unfused"] and r["equal"]  # ...and the cached code is the fused one
    off = warm["off"]
    assert off["hit"] == 0 and off["miss"] >= 1 and not off["fused"] and off["unfused"] and off["equal"]
    assert warm["user_calls"] == 1  # only the uncached compile ran the passes
