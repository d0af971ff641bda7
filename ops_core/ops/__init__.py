"""One module per op: schema, validation, fake, exact reference and the documented Python API."""

from .page_table_transform import page_table_transform  # noqa: F401

__all__ = ["page_table_transform"]
