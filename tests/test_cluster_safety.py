"""Issue 35, items 1–2: a cluster never serves open, and no host name reaches ssh as an option.

Which rank runs here is mlx.launch's rule (only the literal 127.0.0.1; every other spelling of
this machine goes over ssh, where rank 0's token does not travel): checked against the real
`mlx.launch` behind a fake `ssh` that logs where it was asked to go. A rank 0 started over ssh
refuses to serve without the token. Host names are checked once for every entry point
(`--hosts`, hostfiles, `models pull`, `doctor`) before any ssh runs; hostfiles are bounded
regular files; remote probe answers are data, typed and escaped before they are shown.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import mlx.core as mx
import pytest
from rich.console import Console

from mlxlaunch.cli.doctor import print_checks
from mlxlaunch.cli.main import main
from mlxlaunch.cluster.hosts import (
    MAX_HOSTFILE_BYTES,
    MAX_HOSTS,
    Cluster,
    check_host,
    cluster_from_options,
    is_local,
    mlx_launch_binary,
    parse_hosts,
    read_hostfile,
    ssh_argv,
)
from mlxlaunch.cluster.preflight import HostFacts, Preflight, probe_host
from mlxlaunch.cluster.remote_text import printable
from mlxlaunch.errors import ConfigError
from mlxlaunch.launch.cluster_commands import checked_parallel
from mlxlaunch.launch.cluster_rank import NO_TOKEN_EXIT, RankSpec, missing_token
from mlxlaunch.launch.cluster_serve import ClusterFailed, RankProcesses
from mlxlaunch.launch.doctor import cluster_checks

# ssh stand-in: drop ssh's options (and `--`), log the destination, and run the remote command
# here as real ssh would: in a login of its own, so nothing of the caller's environment that
# ssh does not send (rank 0's token) arrives.
FAKE_SSH = """#!/bin/bash
while [ $# -gt 0 ]; do
  case "$1" in -o|-p|-i|-l) shift 2 ;; --) shift; break ;; -*) shift ;; *) break ;; esac
done
host="$1"; shift
echo "$host" >> "$FAKE_SSH_DIR/calls.log"
if [ -f "$FAKE_SSH_DIR/answer" ]; then cat "$FAKE_SSH_DIR/answer"; exit 0; fi
exec env -u MLXLAUNCH_CLUSTER_TOKEN bash -c "$*"
"""

BAD_HOSTS = [
    "-oProxyCommand=touch /tmp/pwned",
    "-F/dev/null",
    "host name",
    "host\tname",
    "a'b",
    'a"b',
    "a;touch x",
    "$(touch x)",
    "`id`",
    "a|b",
    "a&b",
    "a>b",
    "a\nb",
    "[/]",
    "\x1b[2Jhost",
    "x" * 300,
]


@pytest.fixture
def fake_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake `ssh` first on PATH; returns its directory (calls.log: the hosts it was given;
    an `answer` file: what every "remote" command prints instead of running)."""
    bindir, state = tmp_path / "bin", tmp_path / "ssh"
    bindir.mkdir()
    state.mkdir()
    ssh = bindir / "ssh"
    ssh.write_text(FAKE_SSH, encoding="utf-8")
    ssh.chmod(ssh.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SSH_DIR", str(state))
    return state


def ssh_calls(state: Path) -> list[str]:
    log = state / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


# --- item 1: what runs here is what mlx.launch runs here ------------------------------------


def test_loopback_spellings_in_hosts_become_the_one_mlx_launch_runs_here() -> None:
    assert parse_hosts("localhost,::1,127.0.0.2,LOCALHOST") == ("127.0.0.1",) * 4
    cluster = cluster_from_options("::1,::1", None)
    assert cluster is not None and cluster.hosts == ("127.0.0.1", "127.0.0.1")
    assert cluster.local_only
    for other in ("localhost", "::1", socket.gethostname(), "10.0.0.2"):
        assert not is_local(other)


def test_a_first_host_mlx_launch_would_reach_over_ssh_is_refused(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts.json"
    for first in ("localhost", "::1", socket.gethostname()):
        hostfile.write_text(json.dumps([{"ssh": first, "ips": ["127.0.0.1"]}, {"ssh": "m2"}]))
        cluster = cluster_from_options(None, hostfile)
        assert cluster is not None and cluster.hosts[0] == first  # as mlx.launch reads it
        with pytest.raises(ConfigError, match=r"must be this machine, written 127\.0\.0\.1"):
            checked_parallel(cluster, "tiny-moe")  # before any probe or rank


def test_rank_zero_refuses_to_start_without_the_token_the_launch_has() -> None:
    spec = RankSpec(model="m", parallel="tensor", auth_required=True)
    refusal = missing_token(spec, 0)
    assert refusal is not None and "refusing to serve without authentication" in refusal
    assert missing_token(spec, 1) is None  # the other ranks never hold the token
    assert missing_token(RankSpec(model="m", parallel="tensor", auth_token="t"), 0) is None
    assert missing_token(RankSpec(model="m", parallel="tensor"), 0) is None  # --no-auth


@pytest.mark.slow  # starts mlx.launch (two Python processes importing mlx)
def test_mlx_launch_runs_here_exactly_the_hosts_is_local_says(
    tmp_path: Path, fake_ssh: Path
) -> None:
    spellings = ["127.0.0.1", "localhost", "::1", "127.0.0.2", socket.gethostname()]
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(
        json.dumps({"hosts": [{"ssh": host, "ips": ["127.0.0.1"]} for host in spellings]})
    )
    done = subprocess.run(
        [mlx_launch_binary(), "--backend", "ring", "--hostfile", str(hostfile),
         "--python", sys.executable, "--", "-c", "pass"],
        capture_output=True, text=True, timeout=120, stdin=subprocess.PIPE,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    over_ssh = set(ssh_calls(fake_ssh))
    assert over_ssh == {host for host in spellings if not is_local(host)}


@pytest.mark.slow  # starts two ranks through mlx.launch
@pytest.mark.skipif(not mx.distributed.is_available("ring"), reason="no ring backend")
def test_a_rank_zero_started_over_ssh_refuses_to_serve_open(tmp_path: Path, fake_ssh: Path) -> None:
    # A launcher that took another spelling of this machine for local: mlx.launch starts rank
    # 0 over ssh, and the token stays behind. Rank 0 must not serve.
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(
        json.dumps(
            [{"ssh": "this-mac", "ips": ["127.0.0.1"]}, {"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]
        )
    )
    spec = RankSpec(model="no-such-model-anywhere", parallel="tensor", auth_token="secret")
    lines: list[str] = []
    lock = threading.Lock()

    def relay(line: str) -> None:
        with lock:
            lines.append(line)

    ranks = RankProcesses(Cluster(("this-mac", "127.0.0.1"), hostfile=hostfile), spec, relay)
    ranks.start()
    try:
        with pytest.raises(ClusterFailed):
            ranks.wait_ready(timeout=120)
    finally:
        ranks.stop()
    assert ssh_calls(fake_ssh) and ssh_calls(fake_ssh)[0] == "this-mac"
    text = "\n".join(lines)
    assert "refusing to serve without authentication" in text, text
    assert f"Node with rank 0 exited with code {NO_TOKEN_EXIT}" in text


# --- item 2: host names, ssh argvs, hostfiles ----------------------------------------------


@pytest.mark.parametrize("host", BAD_HOSTS)
def test_a_host_ssh_could_read_as_an_option_or_a_shell_as_syntax_is_refused(
    host: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_hosts(f"127.0.0.1,{host}")
    assert "\x1b" not in caught.value.message and "\n" not in caught.value.message
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([{"ssh": "127.0.0.1"}, {"ssh": host}]))
    with pytest.raises(ConfigError):
        read_hostfile(hostfile)
    with pytest.raises(ConfigError):
        ssh_argv(host, ["true"])


def test_ordinary_hosts_pass() -> None:
    for host in ("10.0.0.2", "mac-studio.local", "me@mac-2", "fe80::1%en0", "host_1", "::1"):
        assert check_host(host, "--hosts") == host


@pytest.mark.parametrize(
    "argv",
    [
        ["models", "pull", "org/model", "--hosts", "127.0.0.1,-oProxyCommand=touch${IFS}x"],
        ["doctor", "--hosts", "127.0.0.1,-oProxyCommand=touch${IFS}x"],
        ["serve", "--model", "tiny-moe", "--hosts", "127.0.0.1,a;b"],
        ["launch", "claude", "--model", "tiny-moe", "--hosts", "127.0.0.1,$(id)"],
    ],
)
def test_every_entry_point_refuses_a_bad_host_before_any_ssh(
    argv: list[str], fake_ssh: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert "is not a host name" in capsys.readouterr().err
    assert ssh_calls(fake_ssh) == []


def test_every_ssh_argv_ends_its_options_and_quotes_the_remote_words() -> None:
    evil = "m; touch /tmp/pwned $(id) 'q'"
    argv = ssh_argv("10.0.0.2", ["python", "-m", "x", f"--model={evil}"], ("-o", "BatchMode=yes"))
    assert argv[:5] == ["ssh", "-o", "BatchMode=yes", "--", "10.0.0.2"]
    assert shlex.split(argv[5]) == ["python", "-m", "x", f"--model={evil}"]  # words, not syntax


@pytest.mark.parametrize("special", ["/dev/zero", "fifo", "directory"])
def test_a_hostfile_that_is_not_a_regular_file_is_refused_unread(
    special: str, tmp_path: Path
) -> None:
    path = Path(special)
    if special == "fifo":
        path = tmp_path / "hosts.fifo"
        os.mkfifo(path)  # opening it for reading would wait for a writer forever
    elif special == "directory":
        path = tmp_path
    with pytest.raises(ConfigError, match=r"not a regular file|Is a directory"):
        read_hostfile(path)


def test_a_hostfile_is_bounded(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_text(" " * (MAX_HOSTFILE_BYTES + 1) + "[]")
    with pytest.raises(ConfigError, match="too large"):
        read_hostfile(big)
    many = tmp_path / "many.json"
    many.write_text(
        json.dumps([{"ssh": f"10.0.{i // 250}.{i % 250}"} for i in range(MAX_HOSTS + 1)])
    )
    with pytest.raises(ConfigError, match=f"at most {MAX_HOSTS}"):
        read_hostfile(many)
    with pytest.raises(ConfigError, match=f"at most {MAX_HOSTS}"):
        parse_hosts(",".join(["127.0.0.1"] * (MAX_HOSTS + 1)))


def test_the_ring_hostfile_goes_when_the_serve_ends() -> None:
    spec = RankSpec(model="m", parallel="tensor")
    ranks = RankProcesses(Cluster(("127.0.0.1", "192.0.2.7")), spec, relay=lambda line: None)
    argv, env = ranks.command()
    written = Path(argv[argv.index("--hostfile") + 1])
    assert written.is_file() and stat.S_IMODE(written.stat().st_mode) == 0o600
    assert Path(env["TMPDIR"]) == written.parent  # mlx.launch's own per-rank files go there
    ranks.stop()
    assert not written.exists() and not written.parent.exists()


# --- item 2: what a host answers is data ---------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        {"memory": [1, 2]},
        {"versions": "mlx 0.32"},
        {"memory": {"total": "64 GB"}},
        {"backends": {"ring": "yes"}},
        {"errors": "broken"},
        {"model": {"found": True, "weight_bytes": "big"}},
        {"model": ["tiny"]},
        {"hostname": 7},
    ],
)
def test_a_probe_answer_of_the_wrong_types_is_that_hosts_problem(
    answer: dict[str, object], fake_ssh: Path
) -> None:
    (fake_ssh / "answer").write_text(json.dumps(answer) + "\n")
    facts = probe_host("10.0.0.2", "tiny-moe")
    assert not facts.reachable and facts.error is not None
    assert "malformed" in facts.error


def test_a_probe_answers_text_reaches_the_terminal_escaped(fake_ssh: Path) -> None:
    hostile = "\x1b]0;owned\x07\x1b[2J[bold red]x[/]\r\u202e"
    answer = {
        "hostname": hostile,
        "versions": {"mlx": hostile, "mlx-lm": "0.32.2", "mlxlaunch": "0.1.0"},
        "memory": {"total": 10, "available": 5},
        "backends": {"ring": True},
        "errors": [hostile],
        "model": {"found": False, "error": hostile},
    }
    (fake_ssh / "answer").write_text(json.dumps(answer) + "\n")
    facts = probe_host("10.0.0.2", "tiny-moe")
    assert facts.reachable
    shown = [facts.hostname, facts.versions["mlx"], facts.errors[0], facts.model.error]  # type: ignore[union-attr]
    for text in shown:
        assert text is not None and text.isprintable() and "\\x1b" in text
    preflight = Preflight(Cluster(("127.0.0.1", "10.0.0.2")), "tiny-moe", (facts,), None, ())
    out = io.StringIO()
    print_checks(Console(file=out, width=250, force_terminal=True), cluster_checks(preflight, None))
    printed = out.getvalue()
    assert "\x1b]0;" not in printed and "\x1b[2J" not in printed and "\r" not in printed
    assert "[bold red]x[/]" in printed  # markup in a host's text is shown, not obeyed


def test_a_refusal_that_quotes_a_hosts_text_is_shown_not_interpreted(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps({"backend": "[/]", "hosts": [{"ssh": "a"}, {"ssh": "b"}]}))
    assert main(["models", "pull", "org/model", "--hostfile", str(hostfile)]) == 2
    assert "backend '[/]' is not one of" in capsys.readouterr().err  # not a MarkupError


def test_printable_bounds_and_escapes() -> None:
    assert printable("plain text") == "plain text"
    assert printable("a\x1bb\tc\u202e") == "a\\x1bb\\tc\\u202e"
    assert printable("x" * 50, limit=10) == "x" * 10 + "…"
    assert HostFacts("h", False).reachable is False
