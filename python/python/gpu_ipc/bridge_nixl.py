"""The bridge's transport over NIXL (its UCX backend): agent metadata through NIXL's own listener, notifications
through ``send_notif`` / ``get_new_notifs``, frames through one-sided WRITEs with the notification attached, and which
UCX transport carried them (UCX's protocol tables, ``UCX_PROTO_INFO``).

NIXL is optional: :func:`load_nixl` raises :class:`NixlMissing`, saying what to install, where it is absent.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from gpu_ipc.bridge_protocol import (
    POLL_S,
    PROBE_WRITES,
    BridgeError,
    PathReport,
    PeerGone,
    TransportError,
)
from gpu_ipc.bridge_staging import DeviceStaging

NIXL_MODULES = ("nixl_cu13", "nixl_cu12", "nixl")  # the CUDA wheels export the API themselves; `nixl` picks one
# Transports that carry GPU memory without staging it through host memory (CUDA IPC inside a node; RDMA verbs,
# with GPUDirect, across nodes). A VRAM WRITE over anything else (tcp) is the silent fallback worth a warning.
GPU_DIRECT = ("cuda_ipc", "rc", "dc", "ud", "gdr", "srd")
RETRY_S = 0.5  # how often the sending end asks the receiving end's listener again while it has no answer
SETTLE_S = 0.02  # how long :meth:`NixlTransport.close` moves UCX along, without a progress thread, before tearing down


def _failure(what: str, e: Exception) -> BridgeError:
    """NIXL's exception as the bridge's: the peer's disconnection as :class:`PeerGone`, the rest as
    :class:`TransportError`."""
    if "DISCONNECT" in repr(e) or "REMOTE" in type(e).__name__.upper():
        return PeerGone(f"{what}: {e!r}: the other end died or is unreachable", repr(e))
    return TransportError(f"{what}: {e!r}")


class NixlMissing(BridgeError):
    """NIXL's Python package is not installed (or does not load)."""


def load_nixl() -> ModuleType:
    """The NIXL module (``nixl_agent``, ``nixl_agent_config``); :class:`NixlMissing` with what to do otherwise."""
    errors = []
    for name in NIXL_MODULES:
        try:
            return importlib.import_module(name)
        except ImportError as e:
            errors.append(f"{name}: {e}")
    raise NixlMissing(
        "NIXL is not installed: `pip install nixl-cu13==1.5.1` (CUDA 13; nixl-cu12 for CUDA 12), or put an unpacked "
        "wheel on PYTHONPATH with NIXL_PLUGIN_DIR at its plugins (" + "; ".join(errors) + ")")


_PREFIX = re.compile(r"^\[[0-9.]+\]\s+\[([^\]]*)\]\s+")  # UCX's log prefix: [time] [host:pid:thread]
_MARK = b"\x1egpu-ipc-bridge-mark "  # a line this process writes to its own stdout to know the pipe was read to it
_TRANSPORT = re.compile(r"\b([a-z][a-z0-9_]*)/([A-Za-z0-9_:.\[\]-]+)")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
# Descriptions of protocols that move GPU memory through host buffers even over an RDMA transport.
_HOST_STAGED = ("copy-in", "copy-out", "bounce", "pipeline")
# Below this a probe's WRITEs of GPU memory cannot have taken a GPU path (loopback TCP moved 4K frames at about
# 0.4 GB/s on an H100; CUDA IPC, NVLink and 100 Gb/s RDMA move 12 GB/s or more): the verdict when UCX printed no table.
GPU_PATH_GBPS = 5.0


def _size(text: str) -> int | None:
    """``8184``, ``64K``, ``inf`` (None) as UCX prints the bounds of a table's range."""
    text = text.strip()
    if text == "inf":
        return None
    m = re.fullmatch(r"([0-9]+)([KMGT]?)B?", text)
    if m is None:
        raise ValueError(text)
    return int(m.group(1)) * _UNITS[m.group(2)]


@dataclass
class ProtoTable:
    """One of UCX's protocol tables (``UCX_PROTO_INFO=y``): its scope (``<context> intra-node cfg#1``), its title
    (``remote memory write by ucp_put*(multi) from cuda/GPU0 to cuda/dev[3]``) and its rows (first and last size,
    ``None``: no end; the protocol's description; the transports' cell)."""

    scope: str
    title: str = ""
    rows: list[tuple[int, int | None, str, str]] = field(default_factory=list)

    @property
    def reach(self) -> str:
        """``intra-node``, ``inter-node`` or ``self`` (this process)."""
        words = self.scope.split()
        return words[-2] if len(words) >= 2 else self.scope

    def is_remote_write(self) -> bool:
        """A table of WRITEs to another process's memory (what the bridge's frames are)."""
        return "remote memory write" in self.title and self.reach != "self"

    def source(self) -> str:
        """``cuda`` or ``host``: the memory written from (``from cuda/GPU0 ...``, ``from host memory ...``)."""
        m = re.search(r"\bfrom (\S+)", self.title)
        return "cuda" if m and m.group(1).startswith("cuda") else "host"

    def row_for(self, nbytes: int) -> tuple[str, str] | None:
        """``(description, transports cell)`` of the row whose range holds ``nbytes``."""
        for low, high, description, config in self.rows:
            if low <= nbytes and (high is None or nbytes <= high):
                return description, config
        return None

    def key(self) -> str:
        return f"{self.reach}: {self.title}"


def parse_tables(lines: list[tuple[str, str]]) -> list[ProtoTable]:
    """UCX's protocol tables from its log lines (``(thread, text)``, the prefix taken off), in the order they
    began; the lines of tables printed by different threads at once are told apart by their thread."""
    tables: list[ProtoTable] = []
    current: dict[str, ProtoTable] = {}
    for thread, line in lines:
        text = line.strip()
        if not text.startswith("|"):
            continue  # a border, or not a table's line
        cells = [c.strip() for c in text.strip("|").split("|")]
        if len(cells) == 1:
            if " cfg#" in cells[0]:
                current[thread] = ProtoTable(cells[0])
                tables.append(current[thread])
            elif thread in current and not current[thread].title:
                current[thread].title = cells[0]
        elif len(cells) == 3 and thread in current and cells[0] != "Range":
            low, _, high = cells[0].partition("..")
            try:
                first = _size(low) or 0
                last = _size(high) if high else first
            except ValueError:
                continue
            current[thread].rows.append((first, last, cells[1], cells[2]))
    return tables


def transports_of(cell: str) -> tuple[str, ...]:
    """The transports a table's cell names: ``52% on tcp/lo and 48% on tcp/eth0`` -> ``(tcp/lo, tcp/eth0)``."""
    found: list[str] = []
    for m in _TRANSPORT.finditer(cell):
        if m.group(0) not in found:
            found.append(m.group(0))
    return tuple(found)


def is_gpu_direct(transports: tuple[str, ...], description: str) -> bool:
    """Whether WRITEs of GPU memory over ``transports`` with protocol ``description`` stay on a GPU path: CUDA IPC,
    or RDMA verbs reading GPU memory (not through host bounce buffers)."""
    names = [t.split("/")[0] for t in transports]
    return (bool(names) and all(n.startswith(GPU_DIRECT) for n in names)
            and not any(word in description for word in _HOST_STAGED))


def path_verdict(during: list[ProtoTable], before: list[ProtoTable], nbytes: int, memory: str,
                 gbps: float) -> PathReport:
    """Which path WRITEs of ``nbytes`` of ``memory`` (``VRAM`` / ``DRAM``) took, from the remote-write tables UCX
    printed while they ran (``during``: UCX prints a table when it first chooses protocols for a configuration of
    endpoint and remote key) or, if it printed none then (the same configuration chosen before), the last such table
    of ``before``; from the rate ``gbps`` alone when there is no table at all (``UCX_PROTO_INFO`` set by the
    user)."""
    source = "cuda" if memory == "VRAM" else "host"

    def relevant(tables: list[ProtoTable]) -> list[ProtoTable]:
        return [t for t in tables if t.is_remote_write() and t.source() == source and t.row_for(nbytes)]

    tables, how = relevant(during), "UCX's protocol table for the probe's WRITEs"
    if not tables and relevant(before):
        tables, how = relevant(before)[-1:], "UCX's protocol table of the same configuration, printed before the probe"
    if not tables:
        verdict = None if memory != "VRAM" else gbps >= GPU_PATH_GBPS
        return PathReport((), "", verdict, f"the probe's rate alone (no UCX table; a GPU path moves >= "
                          f"{GPU_PATH_GBPS:g} GB/s)", gbps)
    transports: list[str] = []
    descriptions: list[str] = []
    verdicts = []
    for t in tables:
        row = t.row_for(nbytes)
        assert row is not None
        description, cell = row
        names = transports_of(cell)
        transports += [n for n in names if n not in transports]
        if description not in descriptions:
            descriptions.append(description)
        verdicts.append(is_gpu_direct(names, description))
    gpu_direct = all(verdicts) if memory == "VRAM" else None
    detail = ""
    if gpu_direct and gbps < GPU_PATH_GBPS:
        detail = f"but the probe ran at {gbps:.2f} GB/s only (a busy GPU, or a slow link?)"
    return PathReport(tuple(transports), "; ".join(descriptions), gpu_direct, how, gbps, detail)


class ProtocolTables:
    """Keeps UCX's protocol tables (``UCX_PROTO_INFO=y`` prints them on stdout when it chooses protocols) out of
    this process's stdout and reads them: which transports carry the frames' WRITEs.

    Stdout (file descriptor 1) goes through a pipe; a thread passes every line through but the tables' own.
    :meth:`mark` tells how many lines came so far, once the thread has read everything written before the call.
    """

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []  # (thread, text) of UCX's lines
        self._saved = -1
        self._thread: threading.Thread | None = None
        self._lock = threading.Condition()
        self._marks = 0
        self._marks_seen = 0

    @property
    def active(self) -> bool:
        """Whether the tables are being read (False when the user set UCX_PROTO_INFO)."""
        return self._saved >= 0

    def start(self) -> bool:
        """Turns the tables on (before NIXL creates its UCX context); False if the user set UCX_PROTO_INFO."""
        if "UCX_PROTO_INFO" in os.environ:
            return False
        os.environ["UCX_PROTO_INFO"] = "y"
        sys.stdout.flush()
        read, write = os.pipe()
        self._saved = os.dup(1)
        os.dup2(write, 1)
        os.close(write)
        self._thread = threading.Thread(target=self._pass_through, args=(read,), name="ucx-proto-info", daemon=True)
        self._thread.start()
        return True

    def _pass_through(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as pipe:
            for raw in pipe:
                if raw.startswith(_MARK):
                    with self._lock:
                        self._marks_seen = max(self._marks_seen, int(raw[len(_MARK):]))
                        self._lock.notify_all()
                    continue
                line = raw.decode("utf-8", "replace")
                m = _PREFIX.match(line)
                if m:
                    with self._lock:
                        self.lines.append((m.group(1), line[m.end():].rstrip()))
                else:
                    os.write(self._saved, raw)

    def mark(self, timeout: float = 1.0, keep_alive: Callable[[], None] | None = None) -> int:
        """The number of UCX lines read so far, counting every line written to stdout before this call (waits up
        to ``timeout`` for the thread to read them, calling ``keep_alive`` every 10 ms meanwhile)."""
        if not self.active:
            return len(self.lines)
        with self._lock:
            self._marks += 1
            mark = self._marks
        os.write(1, _MARK + b"%d\n" % mark)
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if self._lock.wait_for(lambda: self._marks_seen >= mark, 0.01) or time.monotonic() > deadline:
                    return len(self.lines)
            if keep_alive is not None:
                keep_alive()

    def tables(self, start: int = 0, end: int | None = None) -> list[ProtoTable]:
        """The tables in lines ``start`` to ``end`` (default: to the last)."""
        with self._lock:
            lines = self.lines[start:end]
        return parse_tables(lines)

    def stop(self) -> None:
        """Gives stdout back."""
        if self._saved < 0:
            return
        sys.stdout.flush()
        os.dup2(self._saved, 1)  # closes the pipe's last write end: the thread reads to the end
        if self._thread is not None:
            self._thread.join(1.0)
        os.close(self._saved)
        self._saved = -1

    def write_transports(self) -> dict[str, list[str]]:
        """For each kind of remote memory write UCX configured towards another process (``intra-node`` /
        ``inter-node``; not ``self``), the transports in its table: ``{"intra-node: remote memory write by ucp_put*
        from cuda memory to cuda": ["cuda_ipc/cuda"]}`` (every row: all sizes)."""
        found: dict[str, list[str]] = {}
        for t in self.tables():
            if not t.is_remote_write():
                continue
            cells = found.setdefault(t.key(), [])
            for _low, _high, _description, cell in t.rows:
                if cell and cell not in cells:
                    cells.append(cell)
        return found


def transport_findings(writes: dict[str, list[str]], memory: str) -> tuple[str, str | None]:
    """A one-line account of every remote-write table's transports (all sizes, all configurations: the run's
    record; the path of the frames is the probe's :class:`PathReport`), and a warning when no table of GPU memory
    names a GPU-direct transport at all, or nothing was seen."""
    if not writes:
        return "no UCX protocol table for remote writes was printed (UCX_PROTO_INFO set by the user?)", None
    account = "; ".join(f"{k} -> {', '.join(v)}" for k, v in sorted(writes.items()))
    names = {t.split("/")[0] for v in writes.values() for cell in v for t in transports_of(cell)}
    if memory == "VRAM" and not any(n.startswith(GPU_DIRECT) for n in names):
        return account, (f"GPU frames travel over {', '.join(sorted(names))}, not CUDA IPC or RDMA: expect host "
                         "copies and a fraction of the bandwidth (check UCX_TLS, UCX_NET_DEVICES, the RDMA devices)")
    return account, None


class NixlTransport:
    """One NIXL agent, one peer. The receiving end listens on ``port``; the sending end listens on a free port and
    exchanges metadata with the receiving end's listener (``ip``:``port``).

    ``memory``: ``"VRAM"`` (GPU rings) or ``"DRAM"`` (``backend="host"``). ``staging``: ``"auto"`` (copy frames
    through buffers of this process's own when NIXL cannot register the source memory), ``"always"``, ``"never"``;
    ``lanes``: how many WRITEs may be in flight (staging buffers to make). ``tables``: UCX's protocol tables, read
    (the sending end), which :meth:`probe` and :meth:`recheck` take the frames' path from.

    ``progress_thread``: NIXL's own thread that moves UCX along. Off by default: NIXL's Python API starts it with no
    delay between polls, so it spins, and contends with the end for UCX's worker on every call (on 2 cores, host
    memory: 150-390 us of CPU per frame for that thread alone, and the frames slower). Without it, UCX moves when
    this end calls NIXL (reading notifications, looking at a WRITE), which its loop does continuously while frames
    flow, and at least every ``slice_s`` (20 ms) while it waits.
    """

    def __init__(self, name: str, peer: str, memory: str, port: int, connect_to: str | None = None,
                 tables: ProtocolTables | None = None, staging: str = "auto", lanes: int = 1,
                 progress_thread: bool = False) -> None:
        nixl = load_nixl()
        self.memory = memory
        self.name = name
        self.peer = peer
        self.tables = tables
        self.progress_thread = progress_thread
        listen_port = 0 if connect_to is not None else port
        config = nixl.nixl_agent_config(enable_prog_thread=progress_thread, enable_listen_thread=True,
                                        listen_port=listen_port, backends=["UCX"])
        try:
            self.agent: Any = nixl.nixl_agent(name, config)
        except Exception as e:  # NIXL's own exception classes: the boundary of a foreign library
            raise TransportError(f"NIXL agent {name!r} (UCX backend, listener on port {listen_port}) could not "
                                 f"start: {e!r}; is the port taken?") from e
        if "UCX" not in self.agent.backends:
            raise TransportError(f"NIXL has no UCX backend (plugins found: {self.agent.plugin_list}); set "
                                 "NIXL_PLUGIN_DIR to the wheel's plugins directory")
        # Called once or more per frame: looked up once.
        self._notifs = self.agent.get_new_notifs
        self._state = self.agent.check_xfer_state
        self._post = self.agent.transfer
        self.connect_to = connect_to
        self.port = port
        self._local: dict[tuple[int, int], Any] = {}  # (ptr, nbytes) -> registration
        self._exposed: dict[tuple[int, int], Any] = {}
        self._handles: dict[tuple[int, int, int], Any] = {}
        # Frames from memory UCX cannot register (imported from another process) go through a buffer of our own:
        # "auto" when registering fails, "always", or "never" (the failure is the error).
        self.staging_mode = staging
        self.staging: DeviceStaging | None = None
        self.staging_reason = ""
        self.lanes = lanes  # WRITEs in flight at most: staging buffers to make
        self._probed = 0  # UCX's lines up to the end of the last probe
        self._reported = 0  # remote-write tables printed since, already reported by recheck

    def connect(self, timeout: float) -> None:
        """Exchanges agent metadata through NIXL's listener: the sending end fetches the receiving end's and sends
        its own (again every ``RETRY_S`` until it has the peer's: a listener that was not up yet drops them, and once
        more after); both wait until they know the peer, within ``timeout``."""
        deadline = time.monotonic() + timeout
        asked = 0.0
        while True:
            try:
                known = bool(self.agent.check_remote_metadata(self.peer))
                if self.connect_to is not None and (known or time.monotonic() - asked >= RETRY_S):
                    if not known:
                        self.agent.fetch_remote_metadata(self.peer, self.connect_to, self.port)
                    self.agent.send_local_metadata(self.connect_to, self.port)
                    asked = time.monotonic()
            except Exception as e:
                raise _failure(f"NIXL could not exchange metadata with {self.peer!r}", e) from e
            if known:
                return
            if time.monotonic() > deadline:
                where = (f"at {self.connect_to}:{self.port}" if self.connect_to is not None
                         else f"on port {self.port}")
                raise PeerGone(f"no metadata from NIXL agent {self.peer!r} {where} within {timeout} s: start the "
                               "other end (same --name), check the address and that the port is open")
            time.sleep(0.002)

    def send(self, message: bytes) -> None:
        try:
            self.agent.send_notif(self.peer, message)
        except Exception as e:
            raise _failure(f"NIXL could not notify {self.peer!r}", e) from e

    def receive(self) -> list[bytes]:
        try:
            notifs = self._notifs()
        except Exception as e:
            raise _failure("NIXL could not read notifications", e) from e
        received: list[bytes] = notifs.get(self.peer) or []  # a fresh dict of fresh lists at each call: no copy
        return received

    def expose(self, ptr: int, nbytes: int, device: int) -> bytes:
        if (ptr, nbytes) in self._exposed:
            return b""
        try:
            reg = self.agent.register_memory([(ptr, nbytes, device, "")], self.memory)
            info: bytes = self.agent.get_partial_agent_metadata(reg, False, ["UCX"])
        except Exception as e:
            raise TransportError(f"NIXL could not register {nbytes} bytes of {self.memory} at {ptr:#x} "
                                 f"(device {device}): {e!r}") from e
        self._exposed[(ptr, nbytes)] = reg
        return info

    def learn(self, info: bytes) -> None:
        if info:
            try:
                self.agent.add_remote_agent(info)
            except Exception as e:
                raise _failure("NIXL could not load the receiving end's new registration", e) from e

    def _register_source(self, ptr: int, nbytes: int, device: int, lane: int) -> int:
        """The address to WRITE frame memory ``[ptr, ptr + nbytes)`` from: itself, registered once, or (staging) a
        staging buffer of this process's own for ``lane``, the frame copied into it."""
        if self.staging is None and (ptr, nbytes) not in self._local:
            try:
                if self.staging_mode == "always" and self.memory == "VRAM":
                    raise TransportError("staging asked for (--staging always)")
                self._local[(ptr, nbytes)] = self.agent.register_memory([(ptr, nbytes, device, "")], self.memory)
            except Exception as e:
                if self.memory != "VRAM" or self.staging_mode == "never":
                    raise _failure(f"NIXL could not register {nbytes} bytes at {ptr:#x} (device {device})", e) from e
                self.staging = DeviceStaging(nbytes, device, self.lanes)
                self.staging_reason = repr(e)
                for buffer in self.staging.ptrs:
                    self._local[(buffer, nbytes)] = self.agent.register_memory(
                        [(buffer, nbytes, device, "")], self.memory)
        if self.staging is not None:
            return self.staging.copy_in(ptr, nbytes, lane % len(self.staging.ptrs))
        return ptr

    def write(self, ptr: int, nbytes: int, device: int, remote_ptr: int, remote_device: int,
              notification: bytes, lane: int = 0) -> Any:
        ptr = self._register_source(ptr, nbytes, device, lane)
        try:
            key = (ptr, remote_ptr, nbytes)
            handle = self._handles.get(key)
            if handle is None:
                local = self.agent.get_xfer_descs([(ptr, nbytes, device)], self.memory)
                remote = self.agent.get_xfer_descs([(remote_ptr, nbytes, remote_device)], self.memory)
                handle = self.agent.initialize_xfer("WRITE", local, remote, self.peer, notification)
                self._handles[key] = handle
            state = self._post(handle, notification)
        except Exception as e:
            raise _failure(f"NIXL could not start a WRITE of {nbytes} bytes to {self.peer!r}", e) from e
        if state == "ERR":
            raise TransportError(f"NIXL's WRITE of {nbytes} bytes to {self.peer!r} failed at once (peer gone?)")
        return handle

    def probe(self, ptr: int, nbytes: int, device: int, remote_ptr: int, remote_device: int,
              notification: bytes, keep_alive: Callable[[], None]) -> PathReport:
        """:data:`PROBE_WRITES` WRITEs of the frame, one at a time, timed (the best counts: the first also maps the
        peer's memory); the path from the tables UCX printed meanwhile (:func:`path_verdict`)."""
        before = self.tables.mark(keep_alive=keep_alive) if self.tables is not None else 0
        best = float("inf")
        for _ in range(PROBE_WRITES):
            started = time.perf_counter()
            handle = self.write(ptr, nbytes, device, remote_ptr, remote_device, notification)
            while not self.done(handle):
                keep_alive()
                time.sleep(POLL_S)
            best = min(best, time.perf_counter() - started)
        gbps = nbytes / best / 1e9 if best > 0 else 0.0
        if self.tables is None:
            return path_verdict([], [], nbytes, self.memory, gbps)
        after = self.tables.mark(keep_alive=keep_alive)
        self._probed, self._reported = after, 0
        report = path_verdict(self.tables.tables(before, after), self.tables.tables(0, before), nbytes, self.memory,
                              gbps)
        if self.staging is not None:
            report = PathReport(report.transports, report.description, report.gpu_direct, report.how, report.gbps,
                                "; ".join(filter(None, [report.detail, "from a staging buffer of the sending end's "
                                                        f"own ({self.staging_reason})"])))
        return report

    def recheck(self, nbytes: int) -> PathReport | None:
        """A new account of the frames' path when UCX printed a new remote-write table of this memory since the
        last look (it chose protocols anew: a new endpoint or remote key configuration). Does not wait for the
        tables' reader: a table printed a moment ago is seen at the next look."""
        if self.tables is None:
            return None
        source = "cuda" if self.memory == "VRAM" else "host"
        found = [t for t in self.tables.tables(self._probed)
                 if t.is_remote_write() and t.source() == source and t.row_for(nbytes)]
        fresh, self._reported = found[self._reported:], len(found)
        if not fresh:
            return None
        report = path_verdict(fresh, [], nbytes, self.memory, 0.0)
        return PathReport(report.transports, report.description, report.gpu_direct,
                          "UCX's protocol table printed during the run", 0.0, report.detail)

    def done(self, handle: Any) -> bool:
        try:
            state = self._state(handle)
        except Exception as e:
            raise _failure(f"NIXL could not tell the state of a WRITE to {self.peer!r}", e) from e
        if state == "ERR":
            raise TransportError(f"NIXL's WRITE to {self.peer!r} ended in error: the other end died or the "
                                 "network failed")
        return bool(state == "DONE")

    def close(self) -> None:
        """Releases the transfers and registrations (best effort: the peer may be gone). Without a progress
        thread, first moves UCX along for :data:`SETTLE_S`, so that a notification still queued (the receiving
        end's acknowledgement of the end of the stream) goes out."""
        if not self.progress_thread:
            until = time.monotonic() + SETTLE_S
            while time.monotonic() < until:
                try:
                    self._notifs()
                except Exception:  # the peer may be gone: nothing left to deliver
                    break
                time.sleep(POLL_S)
        for handle in self._handles.values():
            try:
                self.agent.release_xfer_handle(handle)
            except Exception:  # a transfer to a dead peer may refuse: the agent's teardown takes it
                pass
        self._handles.clear()
        for reg in [*self._local.values(), *self._exposed.values()]:
            try:
                self.agent.deregister_memory(reg)
            except Exception:
                pass
        self._local.clear()
        self._exposed.clear()
        if self.staging is not None:
            self.staging.close()
