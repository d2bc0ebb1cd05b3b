"""A sweep's cells: their kinds (kinds/, one module each), the plan that enumerates them
(plan.py), the context files a config's cells share (context.py), the runner that measures
one cell on a leased engine and writes its result or its failure record (run.py), what a
cell writes (records.py, provenance.py), and where a sweep stands (progress.py)."""
