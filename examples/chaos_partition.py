"""A worker host cut off from the network, for the chaos audit (``durable_chaos --partition``).

:class:`Partition` is a Linux network namespace (the "host") wired to the root namespace
through a switch: a bridge in a second namespace, two veth pairs, one private /30
(``10.200.0.0``-``10.249.255.255``, chosen from this process's pid so that audits run
side by side). Processes started under :meth:`Partition.command` live in the host: their
only way out is that wire, to the root side's address (:attr:`Partition.gateway`), where
TCP forwarders (a thread of this process) relay the given ports to ``127.0.0.1`` --
PostgreSQL, Redis and the example services listen there only, and are left as they are.

:meth:`Partition.cut` sets the switch down: every frame between the two ends is dropped
*in the middle*. Both ends keep their link up and their (permanent) neighbour entries,
so neither kernel sees an error, sends a reset or gives up early: open connections hang
and retransmit (a query, a heartbeat, an HTTP call), new ones wait for their SYN to be
answered, as when a switch dies. Dropping at either end instead would not do: Linux
counts a packet its own qdisc refused, or a route gone with a downed interface, as a
local failure and times the connection out within seconds. The worker process goes on
running and does not know. :meth:`Partition.restore` brings the switch back, and TCP's
retransmissions deliver what was held back: the cut-off host's *late* writes.

Needs root and iproute2 (``ip netns``); :func:`unavailable` says why not. Leaving the
``with`` block always deletes the namespace and the veth and stops the forwarders.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import threading
from collections.abc import Iterable
from types import TracebackType

__all__ = ["Partition", "unavailable"]

#: seconds a forwarder waits for its connection to 127.0.0.1
CONNECT_TIMEOUT = 10.0


def unavailable() -> str | None:
    """Why a partition cannot be made on this machine, or None when it can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "a network partition needs root (ip netns, veth)"
    if shutil.which("ip") is None:
        return "a network partition needs iproute2's `ip` command"
    return None


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")


def subnet_for(number: int) -> tuple[str, str]:
    """The (host-side, namespace-side) addresses of the /30 numbered ``number`` (a pid):
    one of 819,200 blocks in ``10.200.0.0``-``10.249.255.255``."""
    n = number % (50 * 256 * 64)
    a, b, c = 200 + n // (256 * 64), (n // 64) % 256, (n % 64) * 4
    return f"10.{a}.{b}.{c + 1}", f"10.{a}.{b}.{c + 2}"


class Partition:
    """A network namespace whose only link to this host can be cut (a context manager).

    ``ports``: the TCP ports of ``127.0.0.1`` the namespace reaches through the link.
    Inside, they are at :attr:`gateway` (the host side of the veth), same port numbers.
    """

    def __init__(self, ports: Iterable[int], *, tag: int | None = None) -> None:
        tag = os.getpid() if tag is None else tag
        self.ports = sorted(set(ports))
        self.name = f"durable-chaos-{tag}"
        self.switch = f"durable-chaos-{tag}-switch"
        self.host_if = f"dch{tag}"[:15]  # IFNAMSIZ; root side
        self.ns_if = f"dcn{tag}"[:15]  # in the namespace
        self.port_a, self.port_b = f"dca{tag}"[:15], f"dcb{tag}"[:15]  # the switch's ports
        self.gateway, self.address = subnet_for(tag)
        self.is_cut = False
        self.cuts = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._made: list[str] = []
        #: upstream port -> the local ports of the relays' live connections to it (how
        #: ``pg_stat_activity.client_port`` names the namespace's database sessions)
        self.relays: dict[int, set[int]] = {port: set() for port in self.ports}

    # -------------------------------------------------------------- lifecycle

    def __enter__(self) -> Partition:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Create the namespace and the link, and start the forwarders.

        Raises :class:`RuntimeError` when an ``ip`` command fails (not root, the name or
        the subnet taken) or a port cannot be listened on."""
        why = unavailable()
        if why:
            raise RuntimeError(why)
        _ip("netns", "add", self.name)
        self._made.append("netns")
        _ip("netns", "add", self.switch)
        self._made.append("switch")
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.port_a)
        self._made.append("link")
        _ip("link", "set", self.port_a, "netns", self.switch)
        _ip("-n", self.name, "link", "add", self.ns_if, "type", "veth", "peer", "name", self.port_b)
        _ip("-n", self.name, "link", "set", self.port_b, "netns", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        for port in (self.port_a, self.port_b):
            _ip("-n", self.switch, "link", "set", port, "master", "br0")
            _ip("-n", self.switch, "link", "set", port, "up")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        _ip("addr", "add", f"{self.gateway}/30", "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        _ip("-n", self.name, "addr", "add", f"{self.address}/30", "dev", self.ns_if)
        _ip("-n", self.name, "link", "set", self.ns_if, "up")
        _ip("-n", self.name, "link", "set", "lo", "up")
        # no ARP across the switch: a neighbour left unresolved during a cut would fail
        # connections at once (host unreachable) instead of leaving them hanging
        _ip(
            "neigh",
            "replace",
            self.address,
            "lladdr",
            self._mac(self.ns_if, self.name),
            "dev",
            self.host_if,
            "nud",
            "permanent",
        )
        _ip(
            "-n",
            self.name,
            "neigh",
            "replace",
            self.gateway,
            "lladdr",
            self._mac(self.host_if),
            "dev",
            self.ns_if,
            "nud",
            "permanent",
        )
        self._start_forwarders()

    @staticmethod
    def _mac(interface: str, namespace: str | None = None) -> str:
        where = ["-n", namespace] if namespace else []
        out = subprocess.run(
            ["ip", *where, "-br", "link", "show", interface],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.split()
        return out[2]

    def stop(self) -> None:
        """Stop the forwarders, delete the veth and the namespace (what was made of them)."""
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop = self._thread = None
        if "link" in self._made:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                _ip("link", "del", self.host_if)  # its peer goes with it
        for made, name in (("switch", self.switch), ("netns", self.name)):
            if made in self._made:  # deleting a namespace deletes its interfaces
                with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                    _ip("netns", "del", name)
        self._made = []

    # ----------------------------------------------------------------- the fault

    def cut(self) -> None:
        """Drop every frame between the namespace and the host, in the switch: both
        ends' links stay up, nothing is refused or reset."""
        _ip("-n", self.switch, "link", "set", "br0", "down")
        self.is_cut = True
        self.cuts += 1

    def restore(self) -> None:
        """Bring the switch back; held-back packets are retransmitted."""
        _ip("-n", self.switch, "link", "set", "br0", "up")
        self.is_cut = False

    # ------------------------------------------------------------ inside it

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def env(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` with ``127.0.0.1`` and ``localhost`` in its values pointed at the
        gateway, where the forwarded ports are."""
        return {
            key: value.replace("127.0.0.1", self.gateway).replace("localhost", self.gateway)
            for key, value in env.items()
        }

    # ------------------------------------------------------------- forwarders

    def _start_forwarders(self) -> None:
        ready = threading.Event()
        failure: list[BaseException] = []
        loop = asyncio.new_event_loop()

        async def listen() -> None:
            for port in self.ports:
                await asyncio.start_server(
                    lambda r, w, port=port: _relay(r, w, port, self.relays[port]),
                    self.gateway,
                    port,
                )

        def main() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(listen())
            except BaseException as exc:  # noqa: BLE001 - reported to start()
                failure.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            for task in asyncio.all_tasks(loop):
                task.cancel()
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=main, name="partition-forwarders", daemon=True)
        self._thread.start()
        ready.wait(timeout=30)
        if failure:
            raise RuntimeError(f"cannot listen on {self.gateway}: {failure[0]}")


async def _relay(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int, live: set[int]
) -> None:
    """Relay one connection to ``127.0.0.1:port``, both ways, until either side ends;
    the local port of the upstream connection is in ``live`` meanwhile."""
    try:
        up_reader, up_writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port), CONNECT_TIMEOUT
        )
    except (TimeoutError, OSError):
        writer.close()
        return

    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.close()

    local = up_writer.get_extra_info("sockname")[1]
    live.add(local)
    try:
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
    finally:
        live.discard(local)
