"""The bridge's messages (see :mod:`gpu_ipc.bridge_protocol` for the protocol they make): every notification
between its two ends, their bytes on the transport and the checks a notification from the other end passes before
it is believed, and the errors of a bridge end. ``gpu_ipc.bridge_protocol`` hands on every public name of this
module, so code that imports them from there keeps working.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
from dataclasses import dataclass
from typing import Any

from gpu_ipc._gpu_ipc import GpuIpcError

MAGIC = b"gib2"  # every notification of the bridge starts with this (and names the protocol's version)
HELLO, OFFER, CHOICE, GRANT, PROBE = b"H", b"O", b"C", b"G", b"P"
WRITTEN, BEAT, END, FAIL = b"W", b"B", b"E", b"X"
_GRANT = struct.Struct("<QIQQI")  # seq, slot (or landing buffer), addr, nbytes, device
_WRITTEN = struct.Struct("<QQ")  # seq in the receiving ring, seq in the sending ring
_END = struct.Struct("<Q")  # frames written
MAX_WINDOW = 64
PATHS = ("auto", "landing", "direct")  # what the sending end asks for; "auto": landing, else direct (see module doc)


class BridgeError(GpuIpcError):
    """A bridge end cannot go on; the message says why and what to do."""


class PeerGone(BridgeError):
    """The other end of the bridge died, went silent, or reported a failure of its own (``reason``)."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class ProtocolError(BridgeError):
    """The other end sent something this end does not expect (another program on the port, another version)."""


class TransportError(BridgeError):
    """The transport (NIXL / UCX) failed: a transfer in error, a registration refused."""


class TransportRefused(BridgeError):
    """``expect="gpu-direct"`` and GPU frames would go (or went) over something else than CUDA IPC or RDMA: the
    message names the transport UCX chose and where to look."""


@dataclass(frozen=True)
class PathReport:
    """How the WRITEs of a probe (or of a run) went: the transports that carried them (``cuda_ipc/cuda``,
    ``rc_mlx5/mlx5_0:1``, ``tcp/lo``), UCX's description of the protocol (``zero-copy``), whether that is a GPU path
    (``None`` for host memory, where the question does not arise), how this is known, and the rate measured."""

    transports: tuple[str, ...]
    description: str
    gpu_direct: bool | None
    how: str
    gbps: float
    detail: str = ""

    def account(self) -> str:
        """One line: ``cuda_ipc/cuda (zero-copy), 142.1 GB/s; from UCX's protocol table for the probe``."""
        over = ", ".join(self.transports) or "an unknown transport"
        desc = f" ({self.description})" if self.description else ""
        verdict = {True: "a GPU path", False: "NOT a GPU path", None: "host memory"}[self.gpu_direct]
        extra = f"; {self.detail}" if self.detail else ""
        return f"{over}{desc}, {self.gbps:.3g} GB/s: {verdict} (from {self.how}){extra}"

    def as_dict(self) -> dict[str, Any]:
        return {"transports": list(self.transports), "description": self.description, "gpu_direct": self.gpu_direct,
                "how": self.how, "gbps": self.gbps, "detail": self.detail}


@dataclass(frozen=True)
class Grant:
    """A place of the receiving end that the sending end may write once: frame ``seq`` of the receiving ring, into
    its slot (direct) or into landing buffer ``slot`` (landing)."""

    seq: int
    slot: int
    ptr: int
    nbytes: int
    device: int
    reach: bytes = b""  # what the transport needs to reach this memory, the first time it is granted


@dataclass(frozen=True)
class Region:
    """A landing buffer the receiving end offers: where it is and what the transport needs to reach it."""

    ptr: int
    nbytes: int
    device: int
    reach: bytes = b""


@dataclass(frozen=True)
class Offer:
    """Where the receiving end may take frames: its ring's first slot (``direct``, granted already) and its landing
    buffers (``landing``: ``window`` of them), and why there are none when there are none. ``direct_window``: the
    ring's slots it grants at once on the direct path (1 from a receiving end that says nothing of it)."""

    window: int
    direct: Grant | None
    landing: tuple[Region, ...]
    landing_error: str = ""
    direct_window: int = 1


@dataclass(frozen=True)
class Choice:
    """The path the sending end took and what its probe found."""

    path: str
    report: PathReport


_KIND_AT = len(MAGIC)  # the kind's byte; the body follows it
# The per-frame notifications' first bytes, made once (the ends send one of each per frame).
_GRANT_HEAD, _WRITTEN_HEAD = MAGIC + GRANT, MAGIC + WRITTEN


def encode(kind: bytes, body: bytes = b"") -> bytes:
    """A notification of the bridge: the magic, one byte of kind, the body."""
    return MAGIC + kind + body


def decode(message: bytes) -> tuple[bytes, bytes]:
    """``(kind, body)`` of a notification; :class:`ProtocolError` for anything else."""
    if len(message) <= _KIND_AT or message[:_KIND_AT] != MAGIC:
        raise ProtocolError(f"unexpected notification {message[:16]!r}: is the peer a gpu_ipc bridge of this version?")
    return message[_KIND_AT:_KIND_AT + 1], message[_KIND_AT + 1:]


def encode_grant(g: Grant) -> bytes:
    return grant_message(g.seq, g.slot, g.ptr, g.nbytes, g.device, g.reach)


def grant_message(seq: int, slot: int, ptr: int, nbytes: int, device: int, reach: bytes = b"") -> bytes:
    """:func:`encode_grant` of these fields, without making a :class:`Grant` (the receiving end's per-frame
    grant)."""
    return _GRANT_HEAD + _GRANT.pack(seq, slot, ptr, nbytes, device) + reach


def written_message(seq: int, upstream: int) -> bytes:
    """The written notification of frame ``seq`` of the receiving ring (``upstream``: its sequence in the sending
    ring): ``encode(WRITTEN, _WRITTEN.pack(seq, upstream))``."""
    return _WRITTEN_HEAD + _WRITTEN.pack(seq, upstream)


def decode_grant(body: bytes) -> Grant:
    if len(body) < _GRANT.size:
        raise ProtocolError(f"a grant of {len(body)} bytes (expected at least {_GRANT.size})")
    seq, slot, ptr, nbytes, device = _GRANT.unpack_from(body)
    return Grant(seq, slot, ptr, nbytes, device, bytes(body[_GRANT.size:]))


def _json_object(body: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as e:  # bad UTF-8 or JSON (both ValueErrors), or nesting too deep
        raise ProtocolError(f"{what} that is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} that is not a JSON object: {bytes(body[:120])!r}")
    return value


def _is_count(value: Any, least: int = 0) -> bool:
    return type(value) is int and value >= least


def decode_hello(body: bytes) -> dict[str, Any]:
    """The sending end's layout (``shape``, ``dtype``, ``nbytes``, ``slots``) and the path it asks for (``path``,
    one of :data:`PATHS`; ``auto`` when absent) from its hello; :class:`ProtocolError` for a body that is not that
    JSON object, whatever it holds (a ring is made from it)."""
    layout = _json_object(body, "a hello")
    ok = (isinstance(layout.get("shape"), list)
          and all(_is_count(d) for d in layout["shape"])
          and isinstance(layout.get("dtype"), str)
          and _is_count(layout.get("nbytes"))
          and _is_count(layout.get("slots"), 1))
    if not ok:
        raise ProtocolError(f"a hello without a frame layout (shape, dtype, nbytes, slots): {bytes(body[:120])!r}")
    layout.setdefault("path", "auto")
    if layout["path"] not in PATHS:
        raise ProtocolError(f"a hello asking for path {layout['path']!r} (one of {', '.join(PATHS)})")
    return layout


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise ProtocolError(f"{what}: reach that is not a string")
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as e:
        raise ProtocolError(f"{what}: reach that is not base64: {e}") from None


def encode_offer(o: Offer) -> bytes:
    direct = None
    if o.direct is not None:
        g = o.direct
        direct = {"seq": g.seq, "slot": g.slot, "ptr": g.ptr, "nbytes": g.nbytes, "device": g.device,
                  "reach": _b64(g.reach)}
    landing = [{"ptr": r.ptr, "nbytes": r.nbytes, "device": r.device, "reach": _b64(r.reach)} for r in o.landing]
    body = {"window": o.window, "direct": direct, "landing": landing, "landing_error": o.landing_error,
            "direct_window": o.direct_window}
    return encode(OFFER, json.dumps(body).encode())


def _counts(value: Any, keys: tuple[str, ...], what: str) -> tuple[list[int], Any]:
    """The fields ``keys`` of JSON object ``value``, each an unsigned 64-bit count, and its ``reach``."""
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} that is not a JSON object: {str(value)[:120]}")
    counts = [value.get(k) for k in keys]
    if not all(type(c) is int and 0 <= c < 2**64 for c in counts):
        raise ProtocolError(f"{what} without {', '.join(keys)} as counts: {str(value)[:120]}")
    return [int(c) for c in counts if c is not None], value.get("reach")


def decode_offer(body: bytes) -> Offer:
    """The receiving end's offer; :class:`ProtocolError` for anything that is not one (each address and size an
    unsigned 64-bit count, as many landing buffers as the window, at most :data:`MAX_WINDOW`)."""
    o = _json_object(body, "an offer")
    window, landing, error = o.get("window"), o.get("landing"), o.get("landing_error", "")
    direct_window = o.get("direct_window", 1)
    if (type(window) is not int or not 0 <= window <= MAX_WINDOW or not isinstance(landing, list)
            or not isinstance(error, str) or type(direct_window) is not int or not 1 <= direct_window <= MAX_WINDOW):
        raise ProtocolError(f"an offer without a window (0..{MAX_WINDOW}), landing buffers and their error, or a "
                            f"direct window (1..{MAX_WINDOW}): {bytes(body[:120])!r}")
    if landing and len(landing) != window:
        raise ProtocolError(f"an offer of {len(landing)} landing buffers for a window of {window}")
    regions = []
    for i, r in enumerate(landing):
        (ptr, nbytes, device), reach = _counts(r, ("ptr", "nbytes", "device"), f"landing buffer {i}")
        regions.append(Region(ptr, nbytes, device, _unb64(reach, f"landing buffer {i}")))
    direct = None
    if o.get("direct") is not None:
        (seq, slot, ptr, nbytes, device), reach = _counts(o["direct"], ("seq", "slot", "ptr", "nbytes", "device"),
                                                          "the direct slot")
        direct = Grant(seq, slot, ptr, nbytes, device, _unb64(reach, "the direct slot"))
    return Offer(window, direct, tuple(regions), error, direct_window)


def encode_choice(c: Choice) -> bytes:
    return encode(CHOICE, json.dumps({"path": c.path, **c.report.as_dict()}).encode())


def decode_choice(body: bytes) -> Choice:
    """The sending end's choice; :class:`ProtocolError` for anything that is not one."""
    c = _json_object(body, "a choice")
    transports = c.get("transports")
    if not isinstance(transports, list):
        raise ProtocolError(f"a choice without the transports of its path: {bytes(body[:120])!r}")
    ok = (c.get("path") in ("landing", "direct")
          and all(isinstance(t, str) for t in transports)
          and isinstance(c.get("description"), str)
          and "gpu_direct" in c and (c["gpu_direct"] is None or type(c["gpu_direct"]) is bool)
          and isinstance(c.get("how"), str)
          and type(c.get("gbps")) in (int, float) and math.isfinite(c["gbps"]) and c["gbps"] >= 0
          and isinstance(c.get("detail", ""), str))
    if not ok:
        raise ProtocolError(f"a choice without a path and its report: {bytes(body[:120])!r}")
    report = PathReport(tuple(transports), c["description"], c["gpu_direct"], c["how"], float(c["gbps"]),
                        c.get("detail", ""))
    return Choice(c["path"], report)


def _unpack(s: struct.Struct, body: bytes, what: str) -> tuple[int, ...]:
    if len(body) != s.size:
        raise ProtocolError(f"a {what} notification of {len(body)} bytes (expected {s.size})")
    return tuple(s.unpack(body))
