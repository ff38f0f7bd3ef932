"""The prefill pool's worker: an engine in the prefill role plus its transfer sender.

``messages`` is torch-free (the router imports it); ``worker`` needs torch.
"""
