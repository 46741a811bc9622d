"""The bridge's path probe: what a transport offers the two ends (:class:`Transport`), and how the sending end
probes the paths the receiving end offers (the direct path into its ring's slot, the landing path into buffers of its
own) with its first frame and takes one (:func:`probe_paths`; the rule is in :mod:`gpu_ipc.bridge_protocol`'s
module doc). ``gpu_ipc.bridge_protocol`` hands on every public name of this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from gpu_ipc.bridge_messages import PATHS, PROBE, BridgeError, Grant, Offer, PathReport, ProtocolError, Region, encode

__all__ = ["EXPECTS", "PATHS", "PROBE_WRITES", "Transport", "probe_paths"]

EXPECTS = ("any", "gpu-direct")  # what the sending end may insist on: any path, or a GPU path (CUDA IPC or RDMA)
PROBE_WRITES = 3  # WRITEs of the first frame per path probed


class Transport(Protocol):
    """What the ends need from a transport: notifications both ways, memory the peer may write, one-sided WRITEs,
    and an account of the path those WRITEs take."""

    def send(self, message: bytes) -> None:
        """Sends a notification to the peer; raises :class:`PeerGone` when the peer is unreachable."""

    def receive(self) -> list[bytes]:
        """The notifications from the peer that arrived since the last call, in order (does not wait)."""

    def expose(self, ptr: int, nbytes: int, device: int) -> bytes:
        """Receiving end: makes ``[ptr, ptr + nbytes)`` writable by the peer (once per region) and returns what the
        peer must learn to reach it (empty when nothing new)."""

    def learn(self, info: bytes) -> None:
        """Sending end: takes in what the peer's :meth:`expose` returned."""

    def write(self, ptr: int, nbytes: int, device: int, remote_ptr: int, remote_device: int,
              notification: bytes, lane: int = 0) -> Any:
        """Sending end: starts a WRITE of local ``[ptr, ptr + nbytes)`` to the peer's ``remote_ptr``; the peer
        receives ``notification`` after the data. ``lane``: which of the WRITEs in flight this is (``0 ..
        window - 1``; no two in flight share one). Returns a handle for :meth:`done`."""

    def done(self, handle: Any) -> bool:
        """Whether the WRITE is complete; raises :class:`TransportError` when it failed."""

    def probe(self, ptr: int, nbytes: int, device: int, remote_ptr: int, remote_device: int,
              notification: bytes, keep_alive: Callable[[], None]) -> PathReport:
        """Sending end: WRITEs ``[ptr, ptr + nbytes)`` to ``remote_ptr`` a few times (each with ``notification``),
        calling ``keep_alive`` while it waits, and says which path they took."""

    def recheck(self, nbytes: int) -> PathReport | None:
        """Sending end, during a run: a new account of the path of frames of ``nbytes`` when the transport chose
        a path anew since the last call (``None``: nothing new)."""


def probe_paths(transport: Transport, offer: Offer, frame: Any, device: int, path: str,
                keep_alive: Callable[[], None], log: Callable[[str], None],
                probes: list[dict[str, Any]]) -> tuple[str, PathReport, str | None]:
    """Probes the paths of ``offer`` that ``path`` allows with ``frame`` (the sending end's first, still held), in
    order (landing, then direct), appending each probe's account to ``probes``; returns the path taken, its report,
    and, when none went over a GPU path (the first path is then taken), the warning to give (else ``None``).
    ``keep_alive`` is called while the probe waits (the sending end's heartbeats)."""
    candidates: list[tuple[str, Grant | Region]] = []
    if path in ("auto", "landing") and offer.landing:
        candidates.append(("landing", offer.landing[0]))
    if path in ("auto", "direct") and offer.direct is not None:
        candidates.append(("direct", offer.direct))
    if not candidates:
        why = f" (landing buffers: {offer.landing_error})" if offer.landing_error else ""
        raise BridgeError(f"the receiving end offers no path for --path {path}{why}")
    reaches = [r.reach for r in offer.landing] + ([offer.direct.reach] if offer.direct is not None else [])
    for reach in reaches:
        transport.learn(reach)
        keep_alive()  # each registration learnt may take a while on a busy machine: keep the peer informed
    if offer.landing_error:
        log(f"the receiving end has no landing buffers: {offer.landing_error}")
    first: tuple[str, PathReport] | None = None
    for name, target in candidates:
        if target.nbytes != frame.nbytes:
            raise ProtocolError(f"offered {target.nbytes} bytes ({name}) for frames of {frame.nbytes}")
        report = transport.probe(frame.ptr, frame.nbytes, device, target.ptr, target.device, encode(PROBE),
                                 keep_alive)
        probes.append({"path": name, **report.as_dict()})
        log(f"probe of the {name} path: {report.account()}")
        first = first or (name, report)
        if report.gpu_direct is not False:
            return name, report, None
    assert first is not None
    over = ", ".join(first[1].transports) or "an unknown transport"
    warning = (f"GPU frames go over {over}, not CUDA IPC or RDMA, on every path offered "
               f"({', '.join(n for n, _ in candidates)}): expect host copies and a fraction of the "
               "bandwidth (check UCX_TLS, UCX_NET_DEVICES, the RDMA devices, nvidia-peermem)")
    return first[0], first[1], warning
