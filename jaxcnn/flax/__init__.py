"""Drop-in Flax layers on jaxcnn kernels (needs the optional `flax` package: `pip install
jaxcnn[flax]`; `import jaxcnn` alone never imports flax).

    from jaxcnn.flax import Conv, Fire, max_pool, avg_pool   # linen
    from jaxcnn.flax import nnx as jnnx                       # jnnx.Conv, jnnx.Fire, ...

Each takes flax's own arguments for the 2-D NHWC subset jaxcnn runs and has the same parameter
names and shapes, so existing checkpoints load; an unsupported argument raises ValueError
naming it.
"""

from jaxcnn.flax import nnx
from jaxcnn.flax.linen import Conv, Fire, avg_pool, max_pool

__all__ = ["Conv", "Fire", "avg_pool", "max_pool", "nnx"]
