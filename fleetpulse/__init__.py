"""fleetpulse's Python API for application code: `from fleetpulse import serve`."""
