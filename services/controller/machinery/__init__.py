"""The controller's performance machinery, apart from its domain (issue 35).

What makes the control loop fast rather than what it decides: the columnar decode worker thread
(`decode_pipeline`), the tick's visit schedule (`schedule`) and deployment layout (`layout`),
reductions over a report's few rows (`tiny`), the KV write-behind queue (`kv_writer`), the garbage
collector's timing (`collector`) and the `--stats-file` dump for benchmarks (`stats`). The domain
(ingest, health registry, policy, deployment state, placement, the consumer group) stays in
`services/controller/`.
"""
