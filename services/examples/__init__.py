"""Small example deployments used by the docs, `fleetpulse up` and the tests."""
