"""The paged launcher's config rule, run on the CPU: paged_indexer_logits_unsupported (kernels/paged_indexer_logits.cu,
which resolves a config's default fields as the launch does) against providers_paged_indexer's mirror of it.

Every explicit config that `variants` lists is accepted and every other explicit one is refused; a config that leaves
fields to the launcher's defaults (a 0 digit) is accepted whatever the other fields name, when they name something the
shape offers. The launcher is compiled by nvcc to PTX only (no GPU code is run; ~15 s)."""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path

import pytest
from dsa_ops import gates
from dsa_ops.backends.cuda import providers_paged_indexer as ppi

ROOT = Path(__file__).resolve().parents[1]

DRIVER = r"""
#include "kernels/paged_indexer_logits.cu"
#include <cstdio>
int main() {  // stdin: lines of "heads next_n fp8_mma config"; stdout: "ok" or the refusal, a line each
  dsa_cuda::PagedIndexerLogitsParams p{};
  p.head_dim = 128;
  p.batch = 2;
  p.max_context_len = 1000;
  long heads, next_n;
  int fp8, config;
  while (std::scanf("%ld %ld %d %d", &heads, &next_n, &fp8, &config) == 4) {
    p.heads = heads;
    p.next_n = next_n;
    p.fp8_mma = fp8 != 0;
    p.config = config;
    const char* why = dsa_cuda::paged_indexer_logits_unsupported(p);
    std::printf("%s\n", why ? why : "ok");
  }
  return 0;
}
"""

SHAPES = [(64, 1), (64, 2), (32, 1), (32, 2), (32, 3), (32, 4)]


@pytest.fixture(scope="module")
def unsupported(tmp_path_factory):
    """A function (heads, next_n, precise, configs) -> the launcher's answer for each config."""
    d = tmp_path_factory.mktemp("paged_config")
    src, exe = d / "driver.cu", d / "driver"
    src.write_text(DRIVER)
    cuda = ROOT / "backends_cuda"
    subprocess.run([gates.find_any_nvcc(), "-std=c++17", "-O1", f"-I{cuda}", f"-I{cuda / 'include'}",
                    "-gencode", "arch=compute_90a,code=compute_90a", str(src), "-o", str(exe)],
                   check=True, capture_output=True, text=True)

    def ask(heads, next_n, precise, configs):
        lines = "".join(f"{heads} {next_n} {int(not precise)} {c}\n" for c in configs)
        out = subprocess.run([str(exe)], input=lines, capture_output=True, text=True, check=True).stdout
        answers = out.splitlines()
        assert len(answers) == len(configs), out
        return dict(zip(configs, answers))

    return ask


def test_explicit_configs_match_variants(unsupported):
    explicit = [ppi.make_config(g, ld, sc) for g in (2, 3, ppi.PRODUCER_WG, ppi.FOUR_WGS)
                for ld in (ppi.CP_ASYNC, ppi.BULK, ppi.TMA) for sc in (ppi.CHUNKS, ppi.BALANCED)]
    for (heads, next_n), precise in itertools.product(SHAPES, (False, True)):
        offered = set(ppi.variants(next_n, heads, precise))
        answers = unsupported(heads, next_n, precise, explicit)
        for c, why in answers.items():
            assert (why == "ok") == (c in offered), (heads, next_n, precise, c, why)


@pytest.mark.parametrize("heads,next_n,precise,accepted,refused", [
    # MMA N = 128, fp8: the defaults are loader TMA and 4 math warpgroups; an explicit CP_ASYNC or BULK loader
    # keeps 3 math warpgroups fed by a producer warpgroup (224's kernel), an explicit 4 or 5 keeps TMA.
    (64, 2, False, [0, 10, 20, 110, 220, 30, 230, 4, 5, 204, 205, 2, 22], [3, 25, 215]),
    (32, 4, False, [0, 10, 20, 30, 4, 5], [3, 25]),
    # MMA N = 128, exact: loader BULK and 3 fed by a producer warpgroup; TMA and 4 math warpgroups refused.
    (64, 2, True, [0, 10, 20, 4, 24, 2], [30, 5, 35, 3]),
    # MMA N = 64: loader BULK and 4 math warpgroups fed by a producer warpgroup; no TMA, no 3 + producer.
    (64, 1, False, [0, 10, 20, 5, 25, 3, 2], [30, 35, 4]),
])
def test_default_fields_follow_the_named_ones(unsupported, heads, next_n, precise, accepted, refused):
    """A 0 digit takes the default that fits the digits named beside it."""
    answers = unsupported(heads, next_n, precise, accepted + refused)
    assert {c for c in accepted if answers[c] != "ok"} == set(), answers
    assert {c for c in refused if answers[c] == "ok"} == set(), answers
