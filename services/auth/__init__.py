"""`fleetpulse auth`: the NATS auth callout that gives each connection its own permissions."""
