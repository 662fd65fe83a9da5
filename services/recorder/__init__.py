"""`fleetpulse record` / `fleetpulse replay`: NATS messages to Arrow IPC files and back, and the
what-if replay that runs a recording through the autoscaling policy on a simulated clock."""
