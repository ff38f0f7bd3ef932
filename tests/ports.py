"""A free port for a server a test starts in another process."""

import random
import socket


def free_port() -> int:
    """A free port below the kernel's ephemeral range (32768+) and above Ray's worker ports (10002-19999):
    an ephemeral one can be handed to the server's own Redis or Ray processes after this check, before
    the server binds it (seen: the gRPC port taken, "Address already in use"; and the HTTP port of a
    `ray job submit` cluster, whose Ray head had started its own processes meanwhile)."""
    for port in random.sample(range(20000, 32000), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32000")
