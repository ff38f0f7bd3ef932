"""``baton profile``: measure the engine's step time on this machine and fit a cost model.

- ``step_shape``: what a step computes (tokens, sequences, attention work), from a scheduler output;
- ``cost_model``: the fitted model and its JSON file (``baton.cost_model/1``);
- ``fit``: relative-error least squares with non-negative coefficients;
- ``measure``: the real engine timed over a grid of decode, prefill and mixed steps;
- ``overheads``: the serving system's costs outside the step (engine loop, Ray calls, KV transfer).

Only ``measure`` and ``overheads`` import torch/Ray; the rest is pure Python + numpy, so the
simulator can load a cost model without them.
"""
