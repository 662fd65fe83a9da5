"""Replica runtime: hosts user code behind an rpc subject, with admission control and pushed health."""
