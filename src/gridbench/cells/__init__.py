"""A sweep's cells: their kinds (kinds/, one module each), the plan that enumerates them
(plan.py), where a sweep stands (progress.py), what a cell writes (records.py, provenance.py), the context files a config's cells share (context.py) and the runner that measures
one cell on a leased engine and writes its result or its failure record (run.py)."""
