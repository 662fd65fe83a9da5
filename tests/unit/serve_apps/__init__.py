"""Small apps in Ray Serve's style for the unit tests of fleetpulse.serve and the build step."""
