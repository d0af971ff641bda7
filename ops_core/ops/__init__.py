"""One module per op: schema, validation, fake, exact reference and the documented Python API."""

from .dequant_k_cache_paged import dequant_k_cache_paged
from .indexer_logits import indexer_logits
from .indexer_topk import indexer_topk
from .page_table_transform import page_table_transform
from .paged_indexer_logits import paged_indexer_logits
from .sparse_attention import sparse_attention
from .sparse_mla_decode import sparse_mla_decode
from .topk import topk
from .topk_page_table_transform import topk_page_table_transform
from .topk_ragged_transform import topk_ragged_transform

__all__ = [
    "dequant_k_cache_paged",
    "indexer_logits",
    "indexer_topk",
    "page_table_transform",
    "paged_indexer_logits",
    "sparse_attention",
    "sparse_mla_decode",
    "topk",
    "topk_page_table_transform",
    "topk_ragged_transform",
]
