"""The HTTP runner: what the socket and the thread do before the first request arrives."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import textwrap

import pytest

from mlxlaunch.server.runner import bind_socket


async def test_accepted_connections_send_small_writes_at_once() -> None:
    # Nagle's algorithm holds a small write until the previous one is acknowledged; clients
    # delay their acknowledgements (40 ms on Linux), so each SSE event of a streamed answer on
    # a kept-alive connection waited that long. asyncio turns it off only on sockets that
    # name their protocol, and accepted sockets copy the listener's.
    listener = bind_socket("127.0.0.1", 0)
    nodelay: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        nodelay.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(accepted, sock=listener)
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", listener.getsockname()[1])
        assert await asyncio.wait_for(nodelay, 10) != 0
        writer.close()
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.slow
def test_the_first_streamed_answer_does_not_wait_for_imports() -> None:
    # Starlette streams inside an anyio task group; anyio imports its asyncio backend (~40 ms)
    # when the first one opens. A fresh process shows whether the runner did it up front.
    script = textwrap.dedent(
        """
        import sys
        from mlxlaunch.server.app import ServerSettings
        from mlxlaunch.server.runner import start_server

        backend = "anyio._backends._asyncio"
        before = backend in sys.modules
        handle = start_server(object(), ServerSettings())
        print(before, backend in sys.modules)
        handle.stop()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split() == ["False", "True"], done.stderr
