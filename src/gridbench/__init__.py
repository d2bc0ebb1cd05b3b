"""gridbench: engine x quantization x speculative-decoding sweeps for LLM inference servers."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("gridbench")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0+unknown"
