"""Replica runtime: hosts user code behind an rpc subject, with admission control and pushed health.

A replica process imports only what serving needs (docs/operations.md, "Replica footprint"):
nats-py comes in without aiohttp (shared/natslean.py) before any module here imports it, and
tests/unit/test_replica_imports.py keeps pyarrow, numpy and aiohttp out of the import closure.
"""

from shared.natslean import import_nats_lean

import_nats_lean()
