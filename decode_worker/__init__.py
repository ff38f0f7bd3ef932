"""The decode pool's worker: an engine in the decode role plus its transfer receiver and output outbox.

``messages`` is torch-free (the router imports it); ``worker`` needs torch.
"""
