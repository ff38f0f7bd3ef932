"""Fields of this machine's /proc/cpuinfo (Linux): the CPU's name, vendor and feature flags, which
choose kernels (engine/native/build.py, engine/model/linear.py) and label benchmark results."""

from __future__ import annotations


def cpuinfo_field(*names: str, path: str = "/proc/cpuinfo") -> str:
    """The value of the first line named one of ``names`` (the first processor's); empty where the file is absent."""
    try:
        with open(path) as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() in names:
                    return value.strip()
    except OSError:
        pass
    return ""
