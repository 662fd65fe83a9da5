"""The node agent: runs the replica processes that fp_targets assigns to this machine."""
