"""The grid config: its schema-checked loading (loading.py), the references and secrets
checks (resolve.py), the typed model the rest of the package reads (grid.py), and the
reference rendered from the schema (reference.py)."""
