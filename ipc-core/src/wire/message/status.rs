//! [`StatusRequest`] and [`StatusReport`]: who is attached to a ring or another shared object, as its owner knows
//! it (`gpu-ipc ps`). A client sends the request as its first message instead of a hello; the owner answers and
//! hangs up.

use super::codec::{Reader, check_text, put_u16, put_u32, put_u64};
use super::constants::{MAX_CONSUMER_NAME_BYTES, MAX_PAYLOAD_BYTES};
use crate::wire::error::WireError;
use crate::wire::types::{BackendKind, ObjectKind};

/// Bytes of a [`StatusReport`] payload before its peers.
pub const STATUS_REPORT_FIXED_BYTES: usize = 16;
/// Bytes of one peer entry before its name and detail.
pub const STATUS_PEER_FIXED_BYTES: usize = 32;
/// Longest `detail` of a peer entry, in UTF-8 bytes.
pub const MAX_STATUS_DETAIL_BYTES: usize = 255;

/// Client -> owner, first message: "who is attached?". Payload: 4 reserved zero bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatusRequest;

/// Where a peer stands, as its owner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum PeerState {
    /// Attached and counted (a ring consumer whose record is LIVE).
    Attached,
    /// Handshake in flight: offered, not yet confirmed.
    Joining,
    /// Left cleanly; its place is not free yet.
    Left,
    /// Gone without leaving (its process died or it was evicted); its place is not free yet.
    Lost,
}

impl PeerState {
    /// Stable wire code.
    pub const fn code(self) -> u16 {
        match self {
            Self::Attached => 1,
            Self::Joining => 2,
            Self::Left => 3,
            Self::Lost => 4,
        }
    }

    /// Decodes a wire code.
    pub fn from_code(code: u16) -> Result<Self, WireError> {
        match code {
            1 => Ok(Self::Attached),
            2 => Ok(Self::Joining),
            3 => Ok(Self::Left),
            4 => Ok(Self::Lost),
            _ => Err(WireError::UnknownCode { field: "StatusReport.peer.state", code: u32::from(code) }),
        }
    }

    /// The name `gpu-ipc ps` prints.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Attached => "attached",
            Self::Joining => "joining",
            Self::Left => "left",
            Self::Lost => "lost",
        }
    }
}

impl std::fmt::Display for PeerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One peer in a [`StatusReport`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PeerStatus {
    /// Its number (a ring consumer's record index, an object's peer number).
    pub id: u32,
    /// Its pid in the owner's PID namespace; `None` for a peer in a PID namespace the owner cannot see.
    pub pid: Option<u32>,
    /// Its effective uid.
    pub uid: u32,
    /// Its effective gid.
    pub gid: u32,
    /// When it attached, in milliseconds since the Unix epoch (0: unknown).
    pub since_unix_ms: u64,
    /// How long ago the owner last saw a sign of life from it, in milliseconds (`None`: the owner has no such sign
    /// beyond its open connection).
    pub last_sign_ms: Option<u64>,
    /// Where it stands.
    pub state: PeerState,
    /// The name it gave (at most 64 bytes).
    pub name: String,
    /// What the object knows of it, in words (a ring: the last frame it released), at most 255 bytes.
    pub detail: String,
}

/// Owner -> client: what the socket serves and who is attached.
///
/// Payload: `kind` u16, `backend` u16, `owner_pid` u32, `peer_count` u32, reserved u32, then `peer_count` entries
/// of `id` u32, `pid` u32 (0: another PID namespace), `uid` u32, `gid` u32, `since_unix_ms` u64, `last_sign_ms`
/// u32 (`0xffffffff`: none; larger values saturate below it), `state` u16, `name_len` u8, `detail_len` u8, then the
/// name and the detail. The owner sends as many peers as fit in one message.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StatusReport {
    /// What the socket serves.
    pub kind: ObjectKind,
    /// The object's backend.
    pub backend: BackendKind,
    /// The owner's pid, as it sees itself.
    pub owner_pid: u32,
    /// The peers, oldest first; as many as fit in one message.
    pub peers: Vec<PeerStatus>,
}

const NO_SIGN: u32 = u32::MAX;

pub(super) fn encode_status_report(report: &StatusReport, out: &mut Vec<u8>) -> Result<(), WireError> {
    put_u16(out, report.kind.code());
    put_u16(out, report.backend.code());
    put_u32(out, report.owner_pid);
    let count_at = out.len();
    put_u32(out, 0);
    put_u32(out, 0);
    let mut count = 0u32;
    for peer in &report.peers {
        check_text(&peer.name, MAX_CONSUMER_NAME_BYTES, "StatusReport.peer.name")?;
        check_text(&peer.detail, MAX_STATUS_DETAIL_BYTES, "StatusReport.peer.detail")?;
        let entry = STATUS_PEER_FIXED_BYTES + peer.name.len() + peer.detail.len();
        if out.len() + entry > MAX_PAYLOAD_BYTES as usize {
            break;
        }
        put_u32(out, peer.id);
        put_u32(out, peer.pid.unwrap_or(0));
        put_u32(out, peer.uid);
        put_u32(out, peer.gid);
        put_u64(out, peer.since_unix_ms);
        put_u32(out, peer.last_sign_ms.map_or(NO_SIGN, |ms| u32::try_from(ms).unwrap_or(NO_SIGN - 1).min(NO_SIGN - 1)));
        put_u16(out, peer.state.code());
        out.push(u8::try_from(peer.name.len()).unwrap_or(u8::MAX));
        out.push(u8::try_from(peer.detail.len()).unwrap_or(u8::MAX));
        out.extend_from_slice(peer.name.as_bytes());
        out.extend_from_slice(peer.detail.as_bytes());
        count += 1;
    }
    if let Some(field) = out.get_mut(count_at..count_at + 4) {
        field.copy_from_slice(&count.to_le_bytes());
    }
    Ok(())
}

pub(super) fn decode_status_report(r: &mut Reader<'_>) -> Result<StatusReport, WireError> {
    let kind = ObjectKind::from_code(r.u16()?, "StatusReport.kind")?;
    let backend = BackendKind::from_code(r.u16()?, "StatusReport.backend")?;
    let owner_pid = r.u32()?;
    let count = r.u32()?;
    r.reserved_u32("StatusReport.reserved")?;
    let mut peers = Vec::new();
    for _ in 0..count {
        let id = r.u32()?;
        let pid = Some(r.u32()?).filter(|pid| *pid != 0);
        let uid = r.u32()?;
        let gid = r.u32()?;
        let since_unix_ms = r.u64()?;
        let last_sign_ms = Some(r.u32()?).filter(|ms| *ms != NO_SIGN).map(u64::from);
        let state = PeerState::from_code(r.u16()?)?;
        let [name_len, detail_len] = r.array::<2>()?.map(usize::from);
        if name_len > MAX_CONSUMER_NAME_BYTES {
            return Err(WireError::InvalidField {
                field: "StatusReport.peer.name_len",
                reason: format!("{name_len} bytes, at most {MAX_CONSUMER_NAME_BYTES}"),
            });
        }
        let name = r.text(name_len, "StatusReport.peer.name")?;
        let detail = r.text(detail_len, "StatusReport.peer.detail")?;
        peers.push(PeerStatus { id, pid, uid, gid, since_unix_ms, last_sign_ms, state, name, detail });
    }
    Ok(StatusReport { kind, backend, owner_pid, peers })
}
