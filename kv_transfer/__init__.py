"""KV-cache transfer between workers: per pair a CPU control plane apart from the payload's data
plane, a self-describing FIFO wire format, sender/receiver agents, deadlines, fault injection, and
an NCCL-semantics double the tests run the data plane through.

``peer`` and ``fault`` are torch-free (the router and the driver use them); the rest needs torch.
"""
