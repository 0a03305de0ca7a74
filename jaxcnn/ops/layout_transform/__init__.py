"""`jaxcnn.to_layout`: api (the layout-transform primitive and its entry)."""

from jaxcnn.ops.layout_transform.api import to_layout

__all__ = ["to_layout"]
