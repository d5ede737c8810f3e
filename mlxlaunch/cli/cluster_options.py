"""Options that spread one serve over several machines: `mlx serve` and `mlx launch <agent>`.

They only name the cluster; `cluster/hosts.py` checks them (`cluster_from_options`) and
`launch/cluster_commands.py` runs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

HostsOption = Annotated[
    str | None,
    typer.Option(
        "--hosts",
        help="Serve across these machines, rank 0 first (this one), e.g. "
        "127.0.0.1,10.0.0.2 (MLX's ring backend; IPs of a Thunderbolt bridge or Ethernet).",
        show_default=False,
    ),
]
HostfileOption = Annotated[
    Path | None,
    typer.Option(
        "--hostfile",
        help="An MLX hostfile (JSON, e.g. from mlx.distributed_config) instead of --hosts.",
        show_default=False,
    ),
]
BackendOption = Annotated[
    str | None,
    typer.Option(
        "--backend",
        help="How the ranks talk: ring (TCP) or jaccl (RDMA over Thunderbolt 5; macOS 26.2+). "
        "Default: the hostfile's, else ring.",
        show_default=False,
    ),
]
ParallelOption = Annotated[
    str,
    typer.Option(
        "--parallel",
        help="Split the model by tensor (every layer on every rank) or pipeline (layers "
        "split across ranks); auto: tensor where the model allows it.",
    ),
]
