//! The work queue's `ObjectOffer` body: what a worker needs to import the queue's memory and find its way in it
//! (byte for byte in `docs/protocol.md`, "Work queue offer").

use super::layout::{Geometry, LAYOUT_VERSION, OWNER_SLOT};
use gpu_ipc_driver::DeviceUuid;
use ipc_core::wire::codec::{Reader, put_u16, put_u32, put_u64};
use ipc_core::wire::{BackendKind, HandleType, IPC_HANDLE_BYTES, IpcHandleBytes, WireError};

/// Bytes of a work queue offer's body.
pub const QUEUE_OFFER_BYTES: usize = 144;

/// Flag bit 0: `legacy_mem_handle` holds the allocation's `CUipcMemHandle`.
const FLAG_LEGACY_HANDLE: u32 = 1;

/// The owner's description of its queue for one worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueOffer {
    /// The queue's backend (the handle type follows from it).
    pub backend: BackendKind,
    /// The worker slot this peer pushes, pops and completes as (1 and up; 0 is the owner's).
    pub worker: u16,
    /// Capacity, record size, worker slots and the offsets they give.
    pub geometry: Geometry,
    /// Bytes of the allocation to import (at least the layout's).
    pub allocation_bytes: u64,
    /// The GPU the allocation is on (all zero for the host backend).
    pub device_uuid: DeviceUuid,
    /// The legacy backend's `CUipcMemHandle`; `None` for the fd-based backends, whose allocation travels as fd 0.
    pub legacy_mem_handle: Option<IpcHandleBytes>,
}

impl QueueOffer {
    /// The fds that travel with the offer: the allocation's, except for the legacy backend.
    pub fn fd_count(&self) -> usize {
        usize::from(self.backend.handle_type() != HandleType::LegacyIpc)
    }

    /// The body's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let g = &self.geometry;
        let mut out = Vec::with_capacity(QUEUE_OFFER_BYTES);
        put_u16(&mut out, LAYOUT_VERSION as u16);
        put_u16(&mut out, self.backend.code());
        put_u16(&mut out, self.backend.handle_type().code());
        put_u16(&mut out, 0);
        put_u32(&mut out, u32::from(self.worker));
        put_u32(&mut out, g.max_workers);
        put_u64(&mut out, g.capacity);
        put_u32(&mut out, g.record_bytes);
        put_u32(&mut out, g.cell_bytes);
        put_u64(&mut out, self.allocation_bytes);
        put_u64(&mut out, g.workers_offset);
        put_u64(&mut out, g.cells_offset);
        out.extend_from_slice(&self.device_uuid.0);
        put_u32(&mut out, if self.legacy_mem_handle.is_some() { FLAG_LEGACY_HANDLE } else { 0 });
        put_u32(&mut out, 0);
        out.extend_from_slice(&self.legacy_mem_handle.unwrap_or([0; IPC_HANDLE_BYTES]));
        out
    }

    /// Reads and checks a body: every rule of the table in `docs/protocol.md`.
    ///
    /// # Errors
    /// The first field that breaks a rule, as a [`WireError`] naming it.
    pub fn decode(body: &[u8]) -> Result<Self, WireError> {
        let invalid = |field: &'static str, reason: String| WireError::InvalidField { field, reason };
        let mut r = Reader::new(body, "work queue offer");
        let version = r.u16()?;
        if u32::from(version) != LAYOUT_VERSION {
            return Err(invalid("queue.version", format!("{version}; this build reads version {LAYOUT_VERSION}")));
        }
        let backend = BackendKind::from_code(r.u16()?, "queue.backend")?;
        let handle_type = HandleType::from_code(r.u16()?, "queue.handle_type")?;
        if handle_type != backend.handle_type() {
            return Err(invalid("queue.handle_type", format!("{handle_type:?} is not the {backend} backend's")));
        }
        r.reserved_u16("queue.reserved0")?;
        let worker = r.u32()?;
        let max_workers = r.u32()?;
        let (capacity, record_bytes, cell_bytes) = (r.u64()?, r.u32()?, r.u32()?);
        let (allocation_bytes, workers_offset, cells_offset) = (r.u64()?, r.u64()?, r.u64()?);
        let device_uuid = DeviceUuid(r.array()?);
        let flags = r.u32()?;
        r.reserved_u32("queue.reserved1")?;
        let handle: IpcHandleBytes = r.array()?;
        r.finish()?;
        let geometry =
            Geometry::new(capacity, record_bytes, max_workers).map_err(|e| invalid("queue.geometry", e.to_string()))?;
        if (geometry.cell_bytes, geometry.workers_offset, geometry.cells_offset)
            != (cell_bytes, workers_offset, cells_offset)
        {
            return Err(invalid(
                "queue.geometry",
                format!(
                    "cell_bytes {cell_bytes}, workers_offset {workers_offset}, cells_offset {cells_offset}; the \
                     layout gives {}, {}, {}",
                    geometry.cell_bytes, geometry.workers_offset, geometry.cells_offset
                ),
            ));
        }
        let worker = u16::try_from(worker)
            .ok()
            .filter(|&w| w != OWNER_SLOT && u32::from(w) < max_workers)
            .ok_or_else(|| invalid("queue.worker", format!("{worker}: a worker slot is 1 to {}", max_workers - 1)))?;
        if allocation_bytes < geometry.total_bytes {
            return Err(invalid(
                "queue.allocation_bytes",
                format!("{allocation_bytes}, less than the {} bytes the layout needs", geometry.total_bytes),
            ));
        }
        let legacy = backend == BackendKind::Legacy;
        if flags & !FLAG_LEGACY_HANDLE != 0 {
            return Err(WireError::ReservedNotZero { field: "queue.flags" });
        }
        if (flags & FLAG_LEGACY_HANDLE != 0) != legacy {
            return Err(invalid("queue.flags", format!("bit 0 is {}, the backend is {backend}", flags & 1)));
        }
        if !legacy && handle != [0; IPC_HANDLE_BYTES] {
            return Err(WireError::ReservedNotZero { field: "queue.legacy_mem_handle" });
        }
        Ok(Self {
            backend,
            worker,
            geometry,
            allocation_bytes,
            device_uuid,
            legacy_mem_handle: legacy.then_some(handle),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn offer(backend: BackendKind) -> QueueOffer {
        let geometry = Geometry::new(1024, 16, 64).unwrap();
        QueueOffer {
            backend,
            worker: 3,
            geometry,
            allocation_bytes: geometry.total_bytes.next_multiple_of(2 << 20),
            device_uuid: DeviceUuid([7; 16]),
            legacy_mem_handle: (backend == BackendKind::Legacy).then_some([0x40; 64]),
        }
    }

    #[test]
    fn offers_round_trip_for_every_backend() {
        for backend in BackendKind::ALL {
            let offer = offer(backend);
            let bytes = offer.encode();
            assert_eq!(bytes.len(), QUEUE_OFFER_BYTES);
            assert_eq!(QueueOffer::decode(&bytes).unwrap(), offer);
            assert_eq!(offer.fd_count(), usize::from(backend != BackendKind::Legacy));
        }
    }

    #[test]
    fn every_broken_rule_is_named() {
        let good = offer(BackendKind::Vmm).encode();
        let cases: [(usize, &[u8], &str); 10] = [
            (0, &[2, 0], "queue.version"),
            (4, &[1, 0], "queue.handle_type"),
            (6, &[1, 0], "queue.reserved0"),
            (8, &[0, 0, 0, 0], "queue.worker"),
            (8, &[64, 0, 0, 0], "queue.worker"),
            (16, &[3, 0, 0, 0, 0, 0, 0, 0], "queue.geometry"),
            (28, &[64, 0, 0, 0], "queue.geometry"),
            (32, &[1, 0, 0, 0, 0, 0, 0, 0], "queue.allocation_bytes"),
            (72, &[1, 0, 0, 0], "queue.flags"),
            (80, &[1], "queue.legacy_mem_handle"),
        ];
        for (at, bytes, field) in cases {
            let mut bad = good.clone();
            bad[at..at + bytes.len()].copy_from_slice(bytes);
            let error = QueueOffer::decode(&bad).unwrap_err();
            assert!(error.to_string().contains(field), "byte {at}: {error} should name {field}");
        }
        assert!(matches!(QueueOffer::decode(&good[..100]), Err(WireError::Truncated { .. })));
        let mut long = good.clone();
        long.push(0);
        assert!(matches!(QueueOffer::decode(&long), Err(WireError::TrailingBytes { .. })));
        let mut legacy = offer(BackendKind::Legacy).encode();
        legacy[72] = 0;
        assert!(QueueOffer::decode(&legacy).unwrap_err().to_string().contains("queue.flags"));
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let good = offer(BackendKind::Host).encode();
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..20_000 {
            let mut bytes = good.clone();
            for _ in 0..3 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let at = (state % bytes.len() as u64) as usize;
                bytes[at] = (state >> 32) as u8;
            }
            let cut = (state >> 40) as usize % (bytes.len() + 8);
            let _ = QueueOffer::decode(&bytes[..cut.min(bytes.len())]);
            let _ = QueueOffer::decode(&bytes);
        }
    }
}
