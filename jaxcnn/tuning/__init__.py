"""The decision owner: what jaxcnn measures and decides on this machine, and how it keeps it on disk.

decision (one site's candidates: measured, cached or ruled), conv_choice (conv2d "auto"),
measure and case_timing (measuring), autotune_cache and cache_file (the cache files), and the
layout choice whose public names jaxcnn.layouts re-exports: layer, layout_rules, layer_autotune,
layer_choice, layout_plan, layout_apply; tuner_args and text_table serve the tuners."""
