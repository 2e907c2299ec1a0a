"""Response storage: the ResponseStore protocol (base.py) and its implementations: memory,
SQLite (the embedded default) and PostgreSQL (shared by gateway replicas). factory.py opens the
one ANTWORT_STORE names; docs/storage.md explains the choices."""
