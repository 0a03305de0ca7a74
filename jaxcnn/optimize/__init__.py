"""`jaxcnn.optimize(fn)`: fn with the lax convolutions, pools and softmaxes it traces to replaced
by jaxcnn kernels (a jaxpr rewriter; see rewrite.optimize for what is recognised).

The module itself is callable, so `jaxcnn.optimize(fn)` works whether `jaxcnn.optimize` was
reached through the package's lazy table or by importing a submodule first (which binds the
module, not the function, to that attribute).
"""

import sys
import types

from jaxcnn.optimize.patterns import Site
from jaxcnn.optimize.rewrite import Optimized, Rewrite, optimize

__all__ = ["Optimized", "Rewrite", "Site", "optimize"]


class _CallableModule(types.ModuleType):
    def __call__(self, fn, **kwargs):
        return optimize(fn, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
