"""Which machines a cluster runs on, and the `mlx.launch` command line that starts its ranks.

A cluster is named by `--hosts a,b[,…]` (ssh names or IPs, in rank order; rank 0 serves HTTP)
or by `--hostfile F`, MLX's own JSON hostfile (`mlx.distributed_config` writes one for a
Thunderbolt ring or RDMA), which `mlx.launch` reads as it is. Hosts that are this machine
(127.0.0.1, localhost) are started as local processes, the others over ssh, both by
`mlx.launch` itself.
"""

from __future__ import annotations

import ipaddress
import json
import random
import shutil
import socket
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mlxlaunch.errors import ConfigError

Backend = Literal["ring", "jaccl"]
Parallel = Literal["auto", "tensor", "pipeline"]
BACKENDS: tuple[Backend, ...] = ("ring", "jaccl")
PARALLEL_MODES: tuple[Parallel, ...] = ("auto", "tensor", "pipeline")
LOCAL_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


@dataclass(frozen=True)
class Cluster:
    """The machines of one serve, in rank order, and how their ranks talk."""

    hosts: tuple[str, ...]  # ssh names or IPs; a name may repeat (several ranks on a host)
    backend: Backend = "ring"
    hostfile: Path | None = None  # the user's MLX hostfile, passed to mlx.launch as given
    parallel: Parallel = "auto"

    @property
    def size(self) -> int:
        return len(self.hosts)

    @property
    def local_only(self) -> bool:
        """Every rank runs on this machine (tests, a correctness check)."""
        return all(is_local(host) for host in self.hosts)


def parse_hosts(text: str) -> tuple[str, ...]:
    """`a,b,c` → its hosts in order.

    Raises:
        ConfigError: an empty name, or fewer than two hosts (one host needs no cluster).
    """
    hosts = tuple(part.strip() for part in text.split(","))
    if any(not host for host in hosts):
        raise ConfigError(f"--hosts {text!r}: a host name is empty")
    if len(hosts) < 2:
        raise ConfigError(
            f"--hosts {text!r} names one host: several are needed (one machine needs no --hosts)"
        )
    return hosts


def read_hostfile(path: Path) -> tuple[tuple[str, ...], Backend | None]:
    """The ssh names of an MLX hostfile (a list of hosts, or an object with "hosts") and the
    backend it names, if any.

    Raises:
        ConfigError: the file is missing, not JSON, or names fewer than two hosts.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"--hostfile {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise ConfigError(f"--hostfile {path} is not JSON: {exc}") from exc
    entries = data.get("hosts") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise ConfigError(f"--hostfile {path}: expected a list of hosts or {{'hosts': [...]}}")
    hosts: list[str] = []
    for entry in entries:
        name = entry.get("ssh") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name:
            raise ConfigError(f'--hostfile {path}: every host needs an "ssh" name')
        hosts.append(name)
    if len(hosts) < 2:
        raise ConfigError(f"--hostfile {path} names {len(hosts)} host(s): several are needed")
    backend = data.get("backend") if isinstance(data, dict) else None
    if backend not in (None, "", *BACKENDS):
        raise ConfigError(f"--hostfile {path}: backend {backend!r} is not one of ring, jaccl")
    return tuple(hosts), (backend or None)


def cluster_from_options(
    hosts: str | None,
    hostfile: Path | None,
    *,
    backend: str | None = None,
    parallel: str = "auto",
) -> Cluster | None:
    """The cluster the options name; None when they name none (one machine).

    Raises:
        ConfigError: both --hosts and --hostfile, a bad list or file, an unknown backend or
            parallel mode, or a ring over host names (the ring backend connects to IPs).
    """
    if hosts is None and hostfile is None:
        if backend is not None or parallel != "auto":
            raise ConfigError("--backend and --parallel need --hosts or --hostfile")
        return None
    if hosts is not None and hostfile is not None:
        raise ConfigError("give --hosts or --hostfile, not both")
    if parallel not in PARALLEL_MODES:
        raise ConfigError(f"--parallel {parallel!r}: one of {', '.join(PARALLEL_MODES)}")
    named: Backend | None = None
    if hostfile is not None:
        names, named = read_hostfile(hostfile)
    else:
        assert hosts is not None
        names = parse_hosts(hosts)
    chosen = backend or named or "ring"
    if chosen not in BACKENDS:
        raise ConfigError(f"--backend {chosen!r}: one of {', '.join(BACKENDS)}")
    if chosen == "ring" and hostfile is None:
        named_hosts = [host for host in names if not _is_ip(host) and host != "localhost"]
        if named_hosts:
            raise ConfigError(
                f"the ring backend connects to IP addresses, and {named_hosts[0]!r} is a name",
                hint="give the hosts' IPs (Thunderbolt bridge or Ethernet), or a --hostfile "
                "from `mlx.distributed_config` that pairs each ssh name with its IPs",
            )
    names = tuple("127.0.0.1" if host == "localhost" else host for host in names)
    return Cluster(names, backend=chosen, hostfile=hostfile, parallel=parallel)


def is_local(host: str) -> bool:
    """The host is this machine, so `mlx.launch` starts its rank without ssh."""
    return host in LOCAL_NAMES


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def mlx_launch_binary() -> str:
    """`mlx.launch`, the launcher mlx installs next to this interpreter (else one on PATH).

    Raises:
        ConfigError: mlx's launcher cannot be found.
    """
    beside = Path(sys.executable).with_name("mlx.launch")
    if beside.is_file():
        return str(beside)
    found = shutil.which("mlx.launch")
    if found is None:
        raise ConfigError("mlx.launch (installed with mlx) is not found next to this Python")
    return found


def free_port_run(count: int, host: str = "127.0.0.1") -> int:
    """A base port with `count` consecutive ports free on `host`: the ring listens on base,
    base+1, … (its default, 32323, collides with any other cluster on the machine)."""
    for _ in range(100):
        base = random.randrange(20000, 60000 - count)
        sockets: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(sock)
                sock.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise ConfigError(f"no {count} consecutive free ports on {host}")


def address_towards(peer: str) -> str:
    """This machine's address on its route to `peer` (connecting a UDP socket sends nothing)."""
    family = socket.AF_INET6 if ":" in peer else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((peer, 9))
            return str(sock.getsockname()[0])
    except OSError as exc:
        raise ConfigError(
            f"this machine has no route to {peer}: {exc.strerror or exc}",
            hint="check the cable or network, or give a --hostfile with this machine's IP",
        ) from exc


def ring_hostfile(cluster: Cluster) -> Path:
    """MLX's hostfile for a `--hosts` ring that spans machines.

    `mlx.launch --hosts` makes each host its own ring address, so a rank named 127.0.0.1
    would listen on loopback, where no other machine can reach it. Here a local rank keeps
    "ssh": "127.0.0.1" (mlx.launch then starts it as a local process, with rank 0's token in
    its environment) but listens on this machine's address towards the first remote host.
    """
    remote = next(host for host in cluster.hosts if not is_local(host))
    here = address_towards(remote)
    entries = [
        {"ssh": "127.0.0.1", "ips": [here]} if is_local(host) else {"ssh": host, "ips": [host]}
        for host in cluster.hosts
    ]
    fd, name = tempfile.mkstemp(prefix="mlxlaunch-ring-", suffix=".json")
    with open(fd, "w") as fh:
        json.dump({"backend": "ring", "hosts": entries}, fh)
    return Path(name)


def launch_argv(
    cluster: Cluster,
    command: Sequence[str],
    *,
    python: str | None = None,
    starting_port: int | None = None,
    env: Sequence[str] = (),
) -> list[str]:
    """The `mlx.launch` command line that runs `command` (a Python script and its arguments)
    once per rank of `cluster`; `python`: the interpreter on every host (default: this one)."""
    argv = [mlx_launch_binary(), "--backend", cluster.backend]
    if cluster.hostfile is not None:
        argv += ["--hostfile", str(cluster.hostfile)]
    elif cluster.backend == "ring" and not cluster.local_only:
        argv += ["--hostfile", str(ring_hostfile(cluster))]
    else:
        argv += ["--hosts", ",".join(cluster.hosts)]
    if cluster.backend == "ring" or starting_port is not None:
        argv += ["--starting-port", str(starting_port or free_port_run(cluster.size))]
    argv += ["--python", python or sys.executable]
    for entry in env:
        argv += ["--env", entry]
    return [*argv, "--", *command]
