"""The old import path of the user API types; they live in `fleetpulse.serve` (user code: `from
fleetpulse.serve import Request, Response`). Kept so that apps written against it keep working."""

from fleetpulse.serve.api import Request, Response

__all__ = ["Request", "Response"]
