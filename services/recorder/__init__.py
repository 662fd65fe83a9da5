"""`fleetpulse record` / `fleetpulse replay`: NATS messages to Arrow IPC files and back.

The file format is `shared.recording`; the what-if model that runs a recording through the
autoscaling policy is `services.whatif`."""
