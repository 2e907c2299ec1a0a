"""`antwort-grpc serve --workers N`: N worker processes serving the same gRPC and HTTP ports.

The parent (supervisor.py) starts no core of its own. It reserves the ports (ports.py), starts the
embedded local model once when that is the backend, starts N workers (child.py) and waits for all
to serve before it prints the ready line. Each worker is an ordinary gateway process
(gateway.serve) whose doors bind with SO_REUSEPORT, so the kernel spreads new connections over
the workers; each is a replica of the store, so a cancel, a control or an attach reaches a run in
whichever worker runs it, as between replicas on different hosts. That takes a store the workers
share: PostgreSQL (plan.py refuses SQLite and memory past one worker).

SIGTERM or SIGINT to the parent is forwarded to every worker, which shuts down as one gateway
does (drain, grace, terminal events, stored statuses); the parent waits for them all. A worker
that dies is started again. A worker whose parent dies (its stdin closes) shuts itself down.
Metrics: the parent's /metrics serves every worker's, each series labelled `worker`
(metrics.py)."""
