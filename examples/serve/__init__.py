"""Applications written in Ray Serve's style, deployable from Ray Serve config files
(docs/deploy.md, "Applications defined in code")."""
