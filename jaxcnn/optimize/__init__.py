"""`jaxcnn.optimize(fn)`: fn with the lax convolutions, pools and softmaxes it traces to replaced
by jaxcnn kernels (a jaxpr rewriter; see api.optimize for what is recognised), and with
`fuse=` or `optimize_fused` its fire / inception / conv->max-pool groups fused (fused_groups.py).

The module itself is callable, so `jaxcnn.optimize(fn)` works whether `jaxcnn.optimize` was
reached through the package's lazy table or by importing a submodule first (which binds the
module, not the function, to that attribute).
"""

import sys
import types

from jaxcnn.optimize.api import optimize
from jaxcnn.optimize.fused_groups import FusedOptimized, JaxprGroup, find_jaxpr_groups, optimize_fused
from jaxcnn.optimize.patterns import Site
from jaxcnn.optimize.rewrite import Optimized, Rewrite

__all__ = ["FusedOptimized", "JaxprGroup", "Optimized", "Rewrite", "Site", "find_jaxpr_groups", "optimize",
           "optimize_fused"]


class _CallableModule(types.ModuleType):
    def __call__(self, fn, **kwargs):
        return optimize(fn, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
