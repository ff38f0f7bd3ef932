"""Keep the cyclic garbage collector off a long-lived worker's start-up objects.

A loaded engine leaves ~180k objects the collector tracks (the model's Python objects, the
tokenizer, every imported module's). A full collection walks all of them with the stepping thread
stopped: an inter-token gap of several decode steps.
It happens whenever enough young objects survive. ``gc.freeze`` moves the start-up objects to a
generation the collector never walks. Reference counting still frees them; only a reference cycle
among them would never be collected. That is harmless for objects that live as long as the
process, and it is why only worker processes call this, once, when their engine is ready.
"""

from __future__ import annotations

import gc


def freeze_startup_objects() -> int:
    """Collect once, then freeze what is left; returns how many objects are now frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
