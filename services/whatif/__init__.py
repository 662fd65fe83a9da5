"""The what-if model and tuner: a recording through the autoscaling policy on a simulated clock.

`run` is `fleetpulse replay --what-if`; `tune` is `fleetpulse tune`. The model: `model` (open loop,
the recorded load as it was), `simulate`/`fluid`/`admission`/`calibrate`/`closedloop` (closed
loop: fewer replicas make requests queue longer). It reads recordings through `shared.recording`
and runs the controller's pure decision modules (policy, demand window, staleness, metrics store)
as the controller does, so replay is exact; it never imports the controller's shells.
"""
