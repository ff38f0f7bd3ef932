"""KV-cache transfer between workers: pairwise process groups, a self-describing FIFO wire format,
sender/receiver agents, deadlines and fault injection.

``peer`` and ``fault`` are torch-free (the router and the driver use them); the rest needs torch.
"""
