"""The HTTP ingress (`fleetpulse proxy`): routes requests by app route prefix to each app's
ingress deployment, and keeps a registry of reachable apps under the serviceability rule, so that
scaling to zero never makes an app unreachable. See docs/proxy.md.
"""
