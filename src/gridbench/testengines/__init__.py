"""CPU stand-ins for GPU engines, used by the demo grid and the tests.

Every work-around needed to run an engine on this CPU-only machine lives here, never in
the code path that serves GPU users.
"""
