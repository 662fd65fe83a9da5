"""The controller: ingest, health registry, autoscaler, deployment state (see docs/architecture.md)."""
