"""An engine start's command line: the engine's command prefix, then its kind's serve flags.

Pure functions; values are never joined into a shell string, so a value such as
``x; touch pwned`` stays one literal argument.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from gridbench.config.grid import ServingConfig
from gridbench.engines.kinds import engine_kind


@dataclass(frozen=True)
class LaunchPlan:
    """What an engine start runs: the argv (after any docker entrypoint) and where it listens."""

    argv: tuple[str, ...]
    host: str
    port: int
    served_model_name: str

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def shell_line(self) -> str:
        return shlex.join(self.argv)


def launch_plan(cfg: ServingConfig, port: int) -> LaunchPlan:
    """The engine's argv: its command prefix, then the kind's serve flags."""
    engine = cfg.engine
    # a bridged container must listen on all its interfaces; the host side stays on engine.host
    listen = "0.0.0.0" if engine.runtime == "docker" and engine.network == "bridge" else engine.host
    argv = (*engine.command, *engine_kind(engine.kind).serve_args(cfg, listen, port))
    return LaunchPlan(
        argv=argv, host=engine.host, port=port, served_model_name=cfg.checkpoint.served_model_name
    )
