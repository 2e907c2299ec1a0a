"""Durable runs (docs/durable-runs.md): background responses, re-attaching to their event log,
idempotency keys, and runs that survive their replica.

- `creates`: a durable create begun (the idempotency key bound first, then the run started and,
  when background, logged); what a retry finds.
- `runner`: one background run on this replica — driven in a task, its events logged in
  batches, checkpointed at turn boundaries and before tools run, fenced by its lease.
- `takeover`: the runs of this replica — leases renewed, lost runs of other replicas claimed and
  resumed through the engine (`Engine.resume`, engine/durable.py), runs handed over on shutdown.
- `attach`: reading a response's event log from a sequence number on, to its end.
- `settings`: leases, retention, size cap, key lifetime.

What the store keeps is its part (storage/runlog.py: four small protocols — event log,
checkpoints, leases, idempotency keys — each implemented by the memory, SQLite and PostgreSQL
stores); what a resumed run starts with is the engine's (engine/durable.py). The composition root
(core.py) builds the `Durability` over the responses layer's creates, from `DurableParts`; the front
(front/) decides what a durable create answers, for every door.
"""
