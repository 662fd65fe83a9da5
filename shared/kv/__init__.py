"""Control state: the documents services keep in NATS KV, as a protocol like the wire.

One home: `buckets` declares every bucket (name, key shape, TTL, writer, readers), `envelope` holds
the one envelope rule (`v`, `kind`, unknown fields ignored, typed WireError reasons), one module
per document family (`targets`, `membership`, `status`, `agents`, `group`, `routes`, `apps`), and
`view` a typed view over `Bus.kv`. The contract as data: `schemas/v1/kv/` (a JSON Schema per
document, golden vectors) and docs/wire.md, "Control state".
"""
