"""Which machines a cluster runs on, and the `mlx.launch` command line that starts its ranks.

A cluster is named by `--hosts a,b[,…]` (ssh names or IPs, in rank order; rank 0 serves HTTP)
or by `--hostfile F`, MLX's own JSON hostfile (`mlx.distributed_config` writes one for a
Thunderbolt ring or RDMA), which `mlx.launch` reads as it is.

Which rank runs here is `mlx.launch`'s rule, not ours: it starts a rank as a local process
only when its host is the literal `127.0.0.1`, and every other name (`localhost`, `::1`, this
machine's hostname or address) over ssh, where nothing of this process's environment arrives
(rank 0's token travels there). So `is_local` is that same test, `--hosts` spells loopback as
`127.0.0.1` before anything sees it, and a hostfile (passed to mlx.launch as written) is
taken as written. Every host name is checked once (`check_host`) before any ssh runs.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import re
import shlex
import shutil
import socket
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mlxlaunch.errors import ConfigError
from mlxlaunch.loopback import is_loopback

Backend = Literal["ring", "jaccl"]
Parallel = Literal["auto", "tensor", "pipeline"]
BACKENDS: tuple[Backend, ...] = ("ring", "jaccl")
PARALLEL_MODES: tuple[Parallel, ...] = ("auto", "tensor", "pipeline")
# A host is an ssh destination or an IP: `[user@]name`, IPv4, IPv6 (with a `%zone`). Nothing
# that ssh could read as an option (a leading `-`), nor whitespace, quotes or anything a shell
# gives meaning to: mlx.launch puts the name on a `bash -c` line and hands it to ssh.
_HOST_NAME = re.compile(r"[A-Za-z0-9_.:%@][A-Za-z0-9_.:%@-]*")
MAX_HOST_CHARS = 255
# A hostfile is a few lines of JSON: bounded so that a wrong path (a log, /dev/zero) is refused
# at once, and so is a list no cluster has.
MAX_HOSTFILE_BYTES = 1024 * 1024
MAX_HOSTS = 256

# The one host mlx.launch starts without ssh (mlx/_distributed_utils/launch.py, RemoteProcess:
# `is_local = host == "127.0.0.1"`).
LOCAL_HOST = "127.0.0.1"


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


def check_host(host: object, where: str) -> str:
    """`host`, if it can be handed to ssh and mlx.launch as a destination (see _HOST_NAME).

    Raises:
        ConfigError: an empty name, or one ssh could take as an option or a shell as syntax.
    """
    if not isinstance(host, str) or not host:
        raise ConfigError(f"{where}: a host name is empty")
    if len(host) > MAX_HOST_CHARS or not _HOST_NAME.fullmatch(host):
        shown = ascii(host[:80]) + ("…" if len(host) > 80 else "")
        raise ConfigError(
            f"{where}: {shown} is not a host name: a host is an IP or an ssh name of letters, "
            "digits and . _ - : % @, not starting with - (ssh would read it as an option)",
            hint="an ssh option belongs in ~/.ssh/config, under a Host alias you name here",
        )
    return host


def parse_hosts(text: str) -> tuple[str, ...]:
    """`a,b,c` → its hosts in order.

    Raises:
        ConfigError: an empty or unsafe name (check_host), or fewer than two hosts (one
            host needs no cluster), or more than MAX_HOSTS.
    """
    hosts = tuple(part.strip() for part in text.split(","))
    if any(not host for host in hosts):
        raise ConfigError(f"--hosts {text[:200]!r}: a host name is empty")
    if len(hosts) < 2:
        raise ConfigError(
            f"--hosts {text!r} names one host: several are needed (one machine needs no --hosts)"
        )
    if len(hosts) > MAX_HOSTS:
        raise ConfigError(f"--hosts names {len(hosts)} hosts: at most {MAX_HOSTS}")
    for host in hosts:
        check_host(host, "--hosts")
    # mlx.launch runs only 127.0.0.1 here: any other loopback spelling would go over ssh.
    return tuple(LOCAL_HOST if is_loopback(host) else host for host in hosts)


def read_hostfile(path: Path) -> tuple[tuple[str, ...], Backend | None]:
    """The ssh names of an MLX hostfile (a list of hosts, or an object with "hosts") and the
    backend it names, if any.

    Raises:
        ConfigError: the file is missing, not a regular file, over MAX_HOSTFILE_BYTES, not
            JSON, names an unsafe host (check_host), or fewer than two or over MAX_HOSTS hosts.
    """
    try:
        data = json.loads(_read_bounded(path).decode("utf-8"))
    except OSError as exc:
        raise ConfigError(f"--hostfile {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise ConfigError(f"--hostfile {path} is not JSON: {exc}") from exc
    entries = data.get("hosts") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise ConfigError(f"--hostfile {path}: expected a list of hosts or {{'hosts': [...]}}")
    if len(entries) > MAX_HOSTS:
        raise ConfigError(f"--hostfile {path} names {len(entries)} hosts: at most {MAX_HOSTS}")
    hosts: list[str] = []
    for entry in entries:
        name = entry.get("ssh") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name:
            raise ConfigError(f'--hostfile {path}: every host needs an "ssh" name')
        hosts.append(check_host(name, f"--hostfile {path}"))
    if len(hosts) < 2:
        raise ConfigError(f"--hostfile {path} names {len(hosts)} host(s): several are needed")
    backend = data.get("backend") if isinstance(data, dict) else None
    if backend not in (None, "", *BACKENDS):
        raise ConfigError(f"--hostfile {path}: backend {backend!r} is not one of ring, jaccl")
    return tuple(hosts), (backend or None)


def _read_bounded(path: Path) -> bytes:
    """A regular file's bytes, at most MAX_HOSTFILE_BYTES (a FIFO, a device such as /dev/zero
    or a directory is refused before anything is read; O_NONBLOCK: opening a FIFO waits for
    no writer).

    Raises:
        OSError: it cannot be opened, is not a regular file, or is too large.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(0, "not a regular file")
        data = handle.read(MAX_HOSTFILE_BYTES + 1)
    if len(data) > MAX_HOSTFILE_BYTES:
        raise OSError(0, f"larger than {MAX_HOSTFILE_BYTES // 1024} KiB, too large for a hostfile")
    return data


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
        named_hosts = [host for host in names if not _is_ip(host)]
        if named_hosts:
            raise ConfigError(
                f"the ring backend connects to IP addresses, and {named_hosts[0]!r} is a name",
                hint="give the hosts' IPs (Thunderbolt bridge or Ethernet), or a --hostfile "
                "from `mlx.distributed_config` that pairs each ssh name with its IPs",
            )
    return Cluster(names, backend=chosen, hostfile=hostfile, parallel=parallel)


def is_local(host: str) -> bool:
    """`mlx.launch` starts this host's rank as a local process, without ssh (its own rule:
    the literal 127.0.0.1; see the module docstring)."""
    return host == LOCAL_HOST


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def ssh_argv(
    host: str, remote_command: Sequence[str], options: Sequence[str] = (), ssh: str = "ssh"
) -> list[str]:
    """The argv that runs `remote_command` on `host` through ssh: the host checked again
    (check_host) and after `--`, so it is never read as an option, and the command quoted
    word by word for the remote shell (ssh joins its arguments into one shell line)."""
    check_host(host, "ssh")
    return [ssh, *options, "--", host, shlex.join(remote_command)]


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


def ring_hostfile(cluster: Cluster, directory: Path) -> Path:
    """MLX's hostfile for a `--hosts` ring that spans machines, written into `directory`
    (the caller's scratch directory: it goes when the ranks do).

    `mlx.launch --hosts` makes each host its own ring address, so a rank named 127.0.0.1
    would listen on loopback, where no other machine can reach it. Here a local rank keeps
    "ssh": "127.0.0.1" (mlx.launch then starts it as a local process, with rank 0's token in
    its environment) but listens on this machine's address towards the first remote host.
    """
    remote = next(host for host in cluster.hosts if not is_local(host))
    here = address_towards(remote)
    entries = [
        {"ssh": LOCAL_HOST, "ips": [here]} if is_local(host) else {"ssh": host, "ips": [host]}
        for host in cluster.hosts
    ]
    path = directory / "ring-hostfile.json"
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as fh:
        json.dump({"backend": "ring", "hosts": entries}, fh)
    return path


def launch_argv(
    cluster: Cluster,
    command: Sequence[str],
    *,
    python: str | None = None,
    starting_port: int | None = None,
    env: Sequence[str] = (),
    scratch: Path | None = None,
) -> list[str]:
    """The `mlx.launch` command line that runs `command` (a Python script and its arguments)
    once per rank of `cluster`; `python`: the interpreter on every host (default: this one);
    `scratch`: the caller's directory for a hostfile made here (a ring across machines needs
    one), removed with it."""
    argv = [mlx_launch_binary(), "--backend", cluster.backend]
    if cluster.hostfile is not None:
        argv += ["--hostfile", str(cluster.hostfile)]
    elif cluster.backend == "ring" and not cluster.local_only:
        if scratch is None:
            raise ValueError("a ring across machines needs a scratch directory for its hostfile")
        argv += ["--hostfile", str(ring_hostfile(cluster, scratch))]
    else:
        argv += ["--hosts", ",".join(cluster.hosts)]
    if cluster.backend == "ring" or starting_port is not None:
        argv += ["--starting-port", str(starting_port or free_port_run(cluster.size))]
    argv += ["--python", python or sys.executable]
    for entry in env:
        argv += ["--env", entry]
    return [*argv, "--", *command]
