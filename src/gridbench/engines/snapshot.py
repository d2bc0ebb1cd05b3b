"""Save one /metrics scrape: ``python -m gridbench.engines.snapshot URL DIR [KEY_VARIABLE]``.

llama-benchy runs this after every run (--post-run-cmd), so it imports nothing heavy. The
API key, when the engine needs one, is read from the environment variable named last."""

import os
import sys
import time
import urllib.request
from pathlib import Path


def main() -> None:
    url, out_dir = sys.argv[1], Path(sys.argv[2])
    headers = {"Authorization": f"Bearer {os.environ[sys.argv[3]]}"} if len(sys.argv) > 3 else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
        text = response.read()
    path = out_dir / f"{time.time_ns()}.prom"
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(text)
    tmp.replace(path)


if __name__ == "__main__":
    main()
