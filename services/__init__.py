"""goose-ingest services: normalizer (pure core) and the shells around it."""

from services.native import choose_core

# Before any module of the core is imported: compiled (the default where it was built), or its
# .py files (GOOSE_INGEST_PURE_PYTHON=1, or a build older than the sources).
choose_core()
