"""XLA's compiled memory analysis as a dict, and the footprint a program needs, from it:

    footprint = argument_size + output_size - alias_size + temp_size

XLA keeps the arguments, the outputs that do not reuse a donated argument, and one arena of
temporaries apart, so all of it is allocated while the program runs. (peak_memory_in_bytes is
not used: the CPU backend leaves the temp arena out of it.) Batch planning, donation and
rematerialization advice all measure a program by it.
"""

from __future__ import annotations

_MEMORY_FIELDS = (
    "temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes",
    "alias_size_in_bytes", "generated_code_size_in_bytes", "peak_memory_in_bytes",
)


def memory_stats(compiled) -> dict[str, int]:
    """compiled.memory_analysis() as a dict; fields a backend does not report are left out."""
    try:
        analysis = compiled.memory_analysis()
    except Exception:  # some backends raise Unimplemented instead of returning None
        return {}
    if analysis is None:
        return {}
    out = {}
    for field in _MEMORY_FIELDS:
        if isinstance(analysis, dict):
            value = analysis.get(field)
        else:
            value = getattr(analysis, field, None)
        if value is not None:
            out[field] = int(value)
    return out


def footprint_bytes(stats: dict[str, int]) -> int:
    """argument + output - alias + temp bytes of a memory_stats dict (see the module doc)."""
    missing = [k for k in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes")
               if k not in stats]
    if missing:
        raise ValueError(f"memory stats lack {', '.join(missing)}: the backend gave no memory analysis")
    return (stats["argument_size_in_bytes"] + stats["output_size_in_bytes"]
            - stats.get("alias_size_in_bytes", 0) + stats["temp_size_in_bytes"])
