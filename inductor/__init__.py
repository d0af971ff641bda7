"""dsa_ops.inductor: the post-grad pass that turns unfused DSA indexer code into dsa ops.

``import dsa_ops`` calls :func:`install` once: Inductor's ``post_grad_custom_post_pass`` becomes a
:class:`DsaFusionPass` that first runs whatever pass was there before, then rewrites

1. ``dsa.topk(dsa.indexer_logits(...), k, row_starts=ks, lengths=ke - ks)`` [+ page mapping]
   -> ``dsa.indexer_topk``;
2. ``dsa.topk(...)`` + page mapping -> ``dsa.topk_page_table_transform``, and
   ``torch.topk(scores, k, sorted=False).indices`` + mapping into its ``nan_first=True`` form (torch's
   order: NaN above every number); over ``dsa.indexer_logits`` of whole rows (ks all 0, ke all N),
   with or without a mapping, -> ``dsa.indexer_topk(nan_first=True)``;
3. the page-table arithmetic ``where(idx < 0, -1, page_table.gather(1, idx // P) * P + idx % P)`` on
   int32 indices, however it is cast or indexed (``page_table[b, idx // P]``, ``page_table[row_to_batch]``
   rows, int64 casts of the index, slot, page or offset) -> ``dsa.page_table_transform``.

Turn it off with ``dsa_ops.inductor.uninstall()`` or ``dsa_ops.inductor.config.enabled = False``.
``counters`` counts the rewrites done in this process (a warm FX graph cache skips the pass, so it
counts nothing then). See the README section "torch.compile" for the exact conditions of each rewrite.
"""

from collections import Counter

# Rewrites done in this process, by "<fused op>/<source form>" and by fused op.
counters: Counter = Counter()

from ._pass import Config, DsaFusionPass, config, install, installed, uninstall  # noqa: E402

__all__ = ["Config", "DsaFusionPass", "config", "counters", "install", "installed", "uninstall"]
