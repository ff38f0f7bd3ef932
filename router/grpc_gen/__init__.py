"""Python stubs generated from ``protos/`` (committed, so installs need no protoc).

Regenerate with ``python -m router.grpc_gen.generate``; ``--check`` verifies the committed stubs.
Import the stubs as ``router.grpc_gen.baton.v1.generate_pb2`` / ``generate_pb2_grpc``. This file
imports nothing on purpose: the generator must run even when the stubs are stale or broken.
"""
