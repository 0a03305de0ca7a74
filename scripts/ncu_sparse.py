"""One jaxcnn.sparse_conv2d call to profile under ncu (VGG conv3_2 by default).

  ncu -k regex:sparse_tile_conv -c 1 --set full python scripts/ncu_sparse.py --n 64 --sparsity 0.9
"""
import argparse

import jax
import jax.numpy as jnp

import jaxcnn
from jaxcnn.tuning import sparse_dispatch

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--n", type=int, default=64)
p.add_argument("--hw", type=int, default=56)
p.add_argument("--c", type=int, default=256)
p.add_argument("--k", type=int, default=256)
p.add_argument("--sparsity", type=float, default=0.9)
p.add_argument("--dtype", default="float32")
a = p.parse_args()
x = sparse_dispatch.sparse_input(jax.random.PRNGKey(0), (a.n, a.hw, a.hw, a.c), a.sparsity, a.dtype)
w = (jax.random.normal(jax.random.PRNGKey(1), (3, 3, a.c, a.k)) * 0.03).astype(a.dtype)
b = jnp.zeros((a.k,), a.dtype)
f = jax.jit(lambda x, w, b: jaxcnn.sparse_conv2d(x, w, b, padding=1, activation="relu"))
print(f(x, w, b).block_until_ready().shape)
