"""Running a kernel into a poisoned output buffer (GPU suites): the buffer is pre-filled with NaN
(-1 for integer outputs), donated and aliased to the program's output, so any element the
kernel fails to write keeps the poison and fails the comparison that follows."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np


def poison_value(dtype):
    return -1 if jnp.issubdtype(dtype, jnp.integer) else np.nan


def run_poisoned(fn, *operands, target: str, scratch=False, absent: tuple[str, ...] = ()):
    """fn(*operands) written into a poisoned, donated output buffer. Checks the compiled program
    first: the custom call named `target` (or starting with it) is there, it produces the
    program's output (its root; with scratch=True, for a call that also returns a scratch
    buffer, the root may be the tuple element taken from it), the poison is aliased to that
    output, and no instruction named in `absent` (what a fused kernel replaces, e.g.
    "convolution") is left."""
    out = jax.eval_shape(fn, *operands)
    poison = jnp.full(out.shape, poison_value(out.dtype), out.dtype)
    # keep_unused: the poison is not read, and jit would otherwise drop it (and the aliasing).
    compiled = jax.jit(lambda p, *a: fn(*a), donate_argnums=0, keep_unused=True).lower(
        poison, *operands).compile()
    text = compiled.as_text()
    assert f'custom_call_target="{target}' in text, text
    root = [line for line in text.splitlines() if "ROOT" in line][-1]
    if scratch:
        assert "get-tuple-element" in root or "custom-call" in root, root
    else:
        assert "custom-call" in root and target in root, root
    assert "input_output_alias" in text, "the poisoned output buffer must be donated: " + text[:2000]
    for instruction in absent:
        assert instruction not in text, (instruction, text)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "donated buffers were not usable" would void the poison
        return compiled(poison, *operands)
