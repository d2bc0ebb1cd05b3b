"""Small shared utilities: records to JSON and back (codec.py), atomic files (files.py)."""
