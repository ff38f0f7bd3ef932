"""Compiled CPU kernels (C, built once per machine with the system compiler, loaded with ctypes)."""
