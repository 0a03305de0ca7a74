"""The CUDA lowering's StableHLO text, read on any machine (lowering for "cuda" needs no GPU):
the lowering itself, its custom calls to one target, and the mark for tests that need the
library's handlers registered (a lowering without them falls back to the reference)."""

import jax
import pytest

from jaxcnn._native import library

needs_library = pytest.mark.skipif(
    not library.handlers_registered(), reason=library.library_state().reason or "library loaded"
)


def cuda_text(fn, *args) -> str:
    """StableHLO text of fn(*args) lowered for CUDA. A fresh function each time: a cached
    lowering would hide a changed handler state (a monkeypatched registration, JAXCNN_STRICT)."""
    return jax.jit(lambda *a: fn(*a)).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def custom_calls(text: str, target: str) -> list[str]:
    """The lines of text that call the FFI custom call `target`."""
    return [line for line in text.splitlines() if f"custom_call @{target}(" in line]
