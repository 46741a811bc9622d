//! The manifest of one generation: plain data, never pickle. It says which tensors an arena holds (name, element
//! type, shape, strides, byte offset, optional checksum), for which weight set, device and generation. It travels
//! in the arena itself, in front of the tensors, so that a reader's one import brings the tensors and their
//! description together, and a generation's manifest can never describe another generation's bytes.
//!
//! The format (version 1 for a set on one device, version 2 for one part of a set of parts, every integer
//! little-endian), specified for clients in other languages in `docs/weights.md`:
//!
//! | bytes | field |
//! |---:|---|
//! | 0..8 | magic `GIPCWGTS` |
//! | 8..10 | format version: 1, or 2 for a part of a set of parts |
//! | 10..12 | flags: bit 0, every entry carries a checksum |
//! | 12..16 | tensor count |
//! | 16..24 | generation (at least 1) |
//! | 24..32 | manifest bytes, this header included |
//! | 32..40 | arena bytes: the extent every tensor must lie in |
//! | 40..56 | device UUID (zeros on the host backend) |
//! | 56..58 | set name length in bytes (1 to [`MAX_SET_NAME_BYTES`]) |
//! | 58..64 | zero |
//! | 64.. | the set name, UTF-8; then (version 2 only) the parts section; then the entries, one after the other |
//!
//! The parts section (version 2: a set on several devices, one part per device, each its own arena and manifest):
//! this part's number (u16), the number of parts (u16, 2 to [`MAX_PARTS`]), the tensors of the whole set (u32),
//! every part's device UUID (16 bytes each, in part order), then each entry's place in the whole set (u32 each, in
//! entry order: the publisher's order of the tensors). A reader of version 1 refuses a part's manifest by its
//! version, so it can never take one part for the whole set.
//!
//! An entry: name length (u16, 1 to [`MAX_TENSOR_NAME_BYTES`]), element type code (u16, the codes of
//! [`DType::code`]), dimensions (u8, at most 8), entry flags (u8: bit 0 explicit strides), 2 zero bytes, the byte
//! offset of the first element in the arena (u64), the shape (u64 each), the strides in elements when flagged
//! (u64 each), the checksum (u64, when the header's flag says so), then the name, UTF-8.
//!
//! [`Manifest::decode`] checks everything before anything is used: truncation at every field, the magic and
//! version, counts, names (UTF-8, lengths, duplicates), element types, shapes and strides whose byte span
//! overflows, and every tensor inside `[manifest bytes, arena bytes)`, with the arena inside the extent the reader
//! mapped.

use std::collections::HashMap;
use std::fmt;

use gpu_ipc_driver::DeviceUuid;
use ipc_core::wire::{DType, MAX_TENSOR_DIMS, TensorDesc};

/// First eight bytes of a manifest: "GIPCWGTS".
pub const MANIFEST_MAGIC: [u8; 8] = *b"GIPCWGTS";
/// The format version of a set on one device, which this build writes and reads.
pub const MANIFEST_VERSION: u16 = 1;
/// The format version of a part of a set of parts (one per device), which this build writes and reads too.
pub const MANIFEST_PARTS_VERSION: u16 = 2;
/// Most parts (devices) of one set.
pub const MAX_PARTS: usize = 256;
/// Bytes of the fixed header.
pub const MANIFEST_HEADER_BYTES: usize = 64;
/// Longest set name, in bytes.
pub const MAX_SET_NAME_BYTES: usize = 96;
/// Longest tensor name, in bytes.
pub const MAX_TENSOR_NAME_BYTES: usize = 1024;
/// Most tensors in one generation.
pub const MAX_TENSORS: u32 = 1 << 20;
/// Alignment of every tensor's first byte in an arena (and of the end of the manifest).
pub const TENSOR_ALIGN: u64 = 256;

/// Where the generation lies in an encoded manifest (bytes 16..24 of the header).
pub(super) const GENERATION_BYTES: std::ops::Range<usize> = 16..24;

const FLAG_CHECKSUMS: u16 = 1;
const ENTRY_FLAG_STRIDES: u8 = 1;
const ENTRY_FIXED_BYTES: usize = 16;

/// One tensor of a generation: its name, what it is, and where its bytes lie in the arena.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    /// The name, as in the state_dict (`model.layers.0.mlp.up_proj.weight`).
    pub name: String,
    /// Element type, shape and strides (in elements).
    pub desc: TensorDesc,
    /// Byte offset of its first element from the start of the arena.
    pub offset: u64,
    /// 64-bit FNV-1a of its bytes (the span from the first element to the end of the last), when the owner
    /// computed checksums.
    pub checksum: Option<u64>,
}

impl TensorEntry {
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.desc.dtype()
    }

    /// Bytes from its first element to the end of its last.
    pub fn span_bytes(&self) -> u64 {
        self.desc.span_bytes()
    }
}

/// What one generation of a weight set holds: plain data, checked whole when decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// The weight set's name (`"llama"`).
    pub set_name: String,
    /// The generation (1 for the first published).
    pub generation: u64,
    /// The UUID of the device the arena lies on (zeros on the host backend).
    pub device_uuid: DeviceUuid,
    /// Bytes of the arena the entries lie in.
    pub arena_bytes: u64,
    /// The tensors, in the order the owner gave them.
    pub entries: Vec<TensorEntry>,
    /// For a part of a set on several devices: which part, every part's device and each entry's place in the
    /// whole set (format version 2); `None` for a set on one device (version 1).
    pub parts: Option<SetParts>,
}

/// What a part's manifest says of the set it is a part of (a set on several devices, one part per device).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetParts {
    /// This part's number (0 is the part whose note word is the set's published generation).
    pub part: u16,
    /// Every part's device UUID, in part order (at least 2, at most [`MAX_PARTS`]).
    pub devices: Vec<DeviceUuid>,
    /// The tensors of the whole set, all parts together.
    pub set_tensors: u32,
    /// Each entry's place among the whole set's tensors (the publisher's order), in entry order.
    pub positions: Vec<u32>,
}

impl SetParts {
    /// Bytes of the encoded section.
    fn encoded_len(&self) -> usize {
        8 + 16 * self.devices.len() + 4 * self.positions.len()
    }
}

/// Why bytes are not a valid manifest; each names what to look at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    /// The bytes end before a field.
    #[error("manifest truncated: {field} needs bytes {start}..{end} but only {len} are there")]
    Truncated {
        /// The field being read.
        field: &'static str,
        /// Its first byte.
        start: u64,
        /// One past its last byte.
        end: u64,
        /// Bytes there are.
        len: u64,
    },
    /// Not a manifest at all.
    #[error("not a weights manifest (magic {found:02x?}, expected \"GIPCWGTS\"): is this an arena of a weight set?")]
    BadMagic {
        /// The first eight bytes.
        found: [u8; 8],
    },
    /// A version this build does not read.
    #[error(
        "manifest format version {found}; this build reads versions {MANIFEST_VERSION} (a set on one device) and {MANIFEST_PARTS_VERSION} (a part of a set on several devices): use the same gpu-ipc release on both sides"
    )]
    UnsupportedVersion {
        /// The version found.
        found: u16,
    },
    /// A field holds a value outside its range.
    #[error("manifest field {field}: {problem}")]
    BadField {
        /// Which field (with the tensor's index or name when it is an entry's).
        field: String,
        /// What is wrong.
        problem: String,
    },
    /// An element type code this build does not know.
    #[error("tensor {index} ({name}): unknown element type code {code}")]
    UnknownDType {
        /// The entry's index.
        index: u32,
        /// Its name.
        name: String,
        /// The code.
        code: u16,
    },
    /// A shape or strides that are not a valid tensor (too many dimensions, a zero extent, a span that overflows).
    #[error("tensor {index} ({name}): {problem}")]
    BadTensor {
        /// The entry's index.
        index: u32,
        /// Its name.
        name: String,
        /// What the tensor description check said.
        problem: String,
    },
    /// A tensor whose bytes reach outside the arena (or into the manifest).
    #[error(
        "tensor {index} ({name}): {bytes} bytes at offset {offset} lie outside the arena's tensor bytes {start}..{end}"
    )]
    OutOfBounds {
        /// The entry's index.
        index: u32,
        /// Its name.
        name: String,
        /// Its offset.
        offset: u64,
        /// Its byte span.
        bytes: u64,
        /// First byte a tensor may use (the end of the manifest).
        start: u64,
        /// One past the last byte a tensor may use.
        end: u64,
    },
    /// A tensor whose offset is not a multiple of its element size.
    #[error("tensor {index} ({name}): offset {offset} is not aligned to its {align}-byte elements")]
    Misaligned {
        /// The entry's index.
        index: u32,
        /// Its name.
        name: String,
        /// Its offset.
        offset: u64,
        /// The alignment it needs.
        align: u64,
    },
    /// Two entries with one name.
    #[error("tensor name {name:?} appears twice (entries {first} and {second})")]
    DuplicateName {
        /// The name.
        name: String,
        /// The first entry with it.
        first: u32,
        /// The second.
        second: u32,
    },
    /// The manifest says its arena is larger than what the reader mapped.
    #[error("the manifest describes an arena of {claimed} bytes but {mapped} bytes are mapped")]
    ArenaTooSmall {
        /// Bytes the manifest claims.
        claimed: u64,
        /// Bytes mapped.
        mapped: u64,
    },
    /// Bytes left after the last entry.
    #[error("{extra} bytes follow the last entry (the header says the manifest has {declared})")]
    TrailingBytes {
        /// Bytes left over.
        extra: u64,
        /// The declared length.
        declared: u64,
    },
}

pub use super::checksum::checksum;

impl Manifest {
    /// Bytes [`encode`](Self::encode) makes for these entries (of a set on one device), before padding.
    pub fn encoded_len(set_name: &str, entries: &[TensorEntry], checksums: bool) -> usize {
        let per_entry = |e: &TensorEntry| {
            let dims = e.desc.ndim() * if e.desc.strides().is_some() { 16 } else { 8 };
            ENTRY_FIXED_BYTES + dims + if checksums { 8 } else { 0 } + e.name.len()
        };
        MANIFEST_HEADER_BYTES + set_name.len() + entries.iter().map(per_entry).sum::<usize>()
    }

    /// Bytes [`encode`](Self::encode) makes for these entries and parts section, before padding.
    pub fn encoded_len_with(
        set_name: &str,
        entries: &[TensorEntry],
        checksums: bool,
        parts: Option<&SetParts>,
    ) -> usize {
        Self::encoded_len(set_name, entries, checksums) + parts.map_or(0, SetParts::encoded_len)
    }

    /// Whether every entry carries a checksum.
    pub fn has_checksums(&self) -> bool {
        !self.entries.is_empty() && self.entries.iter().all(|e| e.checksum.is_some())
    }

    /// The bytes of this manifest (what [`decode`](Self::decode) reads back). Checksums are written when every
    /// entry has one.
    pub fn encode(&self) -> Vec<u8> {
        let checksums = self.has_checksums();
        let len = Self::encoded_len_with(&self.set_name, &self.entries, checksums, self.parts.as_ref());
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(&MANIFEST_MAGIC);
        let version = if self.parts.is_some() { MANIFEST_PARTS_VERSION } else { MANIFEST_VERSION };
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&(if checksums { FLAG_CHECKSUMS } else { 0 }).to_le_bytes());
        out.extend_from_slice(&u32::try_from(self.entries.len()).unwrap_or(u32::MAX).to_le_bytes());
        out.extend_from_slice(&self.generation.to_le_bytes());
        out.extend_from_slice(&(len as u64).to_le_bytes());
        out.extend_from_slice(&self.arena_bytes.to_le_bytes());
        out.extend_from_slice(&self.device_uuid.0);
        out.extend_from_slice(&u16::try_from(self.set_name.len()).unwrap_or(u16::MAX).to_le_bytes());
        out.extend_from_slice(&[0; 6]);
        out.extend_from_slice(self.set_name.as_bytes());
        if let Some(parts) = &self.parts {
            out.extend_from_slice(&parts.part.to_le_bytes());
            out.extend_from_slice(&u16::try_from(parts.devices.len()).unwrap_or(u16::MAX).to_le_bytes());
            out.extend_from_slice(&parts.set_tensors.to_le_bytes());
            for device in &parts.devices {
                out.extend_from_slice(&device.0);
            }
            for position in &parts.positions {
                out.extend_from_slice(&position.to_le_bytes());
            }
        }
        for entry in &self.entries {
            let strides = entry.desc.strides();
            out.extend_from_slice(&u16::try_from(entry.name.len()).unwrap_or(u16::MAX).to_le_bytes());
            out.extend_from_slice(&entry.desc.dtype().code().to_le_bytes());
            out.push(u8::try_from(entry.desc.ndim()).unwrap_or(u8::MAX));
            out.push(if strides.is_some() { ENTRY_FLAG_STRIDES } else { 0 });
            out.extend_from_slice(&[0; 2]);
            out.extend_from_slice(&entry.offset.to_le_bytes());
            for d in entry.desc.shape() {
                out.extend_from_slice(&d.to_le_bytes());
            }
            for s in strides.unwrap_or_default() {
                out.extend_from_slice(&s.to_le_bytes());
            }
            if checksums {
                out.extend_from_slice(&entry.checksum.unwrap_or(0).to_le_bytes());
            }
            out.extend_from_slice(entry.name.as_bytes());
        }
        out
    }

    /// Rewrites the generation of `encoded`, the bytes of an [`encode`](Self::encode)d manifest: an owner encodes
    /// its layout once and stamps each generation's number into a copy.
    ///
    /// # Errors
    /// [`ManifestError::Truncated`] for bytes shorter than the header.
    pub fn set_encoded_generation(encoded: &mut [u8], generation: u64) -> Result<(), ManifestError> {
        let len = encoded.len() as u64;
        let field = encoded.get_mut(GENERATION_BYTES).ok_or(ManifestError::Truncated {
            field: "generation",
            start: GENERATION_BYTES.start as u64,
            end: GENERATION_BYTES.end as u64,
            len,
        })?;
        field.copy_from_slice(&generation.to_le_bytes());
        Ok(())
    }

    /// The generation `bytes` name when they are `known`'s bytes but for the generation field: a later generation
    /// of a layout decoded and checked before, which needs no decoding again. `None` when they differ anywhere else
    /// (or the generation is 0).
    pub(super) fn same_but_generation(known: &[u8], bytes: &[u8]) -> Option<u64> {
        let same = known.len() == bytes.len()
            && known.get(..GENERATION_BYTES.start) == bytes.get(..GENERATION_BYTES.start)
            && known.get(GENERATION_BYTES.end..) == bytes.get(GENERATION_BYTES.end..);
        let field: [u8; 8] = bytes.get(GENERATION_BYTES)?.try_into().ok()?;
        let generation = u64::from_le_bytes(field);
        (same && generation > 0).then_some(generation)
    }

    /// Reads the declared length of the manifest at the start of `header` (at least [`MANIFEST_HEADER_BYTES`]
    /// bytes), after checking the magic and version: how many bytes a reader copies before it decodes.
    ///
    /// # Errors
    /// [`ManifestError::Truncated`], [`ManifestError::BadMagic`], [`ManifestError::UnsupportedVersion`], or a
    /// length shorter than the header.
    pub fn declared_len(header: &[u8]) -> Result<u64, ManifestError> {
        let mut r = Reader { bytes: header, at: 0 };
        let version = check_magic(&mut r)?;
        r.at = 12;
        let count = r.u32("tensor count")?;
        if count > MAX_TENSORS {
            return Err(bad("tensor count", format!("{count}, more than {MAX_TENSORS}")));
        }
        r.at = 24;
        let len = r.u64("manifest bytes")?;
        if len < MANIFEST_HEADER_BYTES as u64 {
            return Err(bad("manifest bytes", format!("{len}, shorter than the {MANIFEST_HEADER_BYTES}-byte header")));
        }
        let most = Self::most_bytes(version, count);
        if len > most {
            return Err(bad(
                "manifest bytes",
                format!("{len}, more than a manifest of {count} tensors can take ({most} at most)"),
            ));
        }
        Ok(len)
    }

    /// The longest encoding a manifest of format `version` with `count` entries can have: every name and dimension
    /// at its limit, strides and checksums present. A reader copies no more than this out of an arena, whatever
    /// the header claims.
    pub fn most_bytes(version: u16, count: u32) -> u64 {
        let entry = (ENTRY_FIXED_BYTES + 16 * MAX_TENSOR_DIMS + 8 + MAX_TENSOR_NAME_BYTES) as u64;
        let parts =
            if version == MANIFEST_PARTS_VERSION { 8 + 16 * MAX_PARTS as u64 + 4 * u64::from(count) } else { 0 };
        (MANIFEST_HEADER_BYTES + MAX_SET_NAME_BYTES) as u64 + parts + entry * u64::from(count)
    }

    /// Decodes and checks a manifest read from an arena of which `mapped_bytes` are mapped: every entry lies
    /// inside the arena, after the manifest, aligned to its element size; names are valid and distinct.
    ///
    /// # Errors
    /// A [`ManifestError`] naming the first problem found.
    pub fn decode(bytes: &[u8], mapped_bytes: u64) -> Result<Self, ManifestError> {
        let mut r = Reader { bytes, at: 0 };
        let version = check_magic(&mut r)?;
        let flags = r.u16("flags")?;
        if flags & !FLAG_CHECKSUMS != 0 {
            return Err(bad("flags", format!("unknown bits {flags:#x}")));
        }
        let count = r.u32("tensor count")?;
        if count > MAX_TENSORS {
            return Err(bad("tensor count", format!("{count}, more than {MAX_TENSORS}")));
        }
        if count == 0 && flags & FLAG_CHECKSUMS != 0 {
            // One encoding per manifest: an empty set has no checksums to flag (found by the fuzz target).
            return Err(bad("flags", "the checksums bit on a manifest of no tensors".into()));
        }
        let generation = r.u64("generation")?;
        if generation == 0 {
            return Err(bad("generation", "0 (generations start at 1)".into()));
        }
        let declared = r.u64("manifest bytes")?;
        if declared != bytes.len() as u64 {
            if declared > bytes.len() as u64 {
                return Err(ManifestError::Truncated {
                    field: "manifest",
                    start: 0,
                    end: declared,
                    len: bytes.len() as u64,
                });
            }
            return Err(ManifestError::TrailingBytes { extra: bytes.len() as u64 - declared, declared });
        }
        let arena_bytes = r.u64("arena bytes")?;
        if arena_bytes > mapped_bytes {
            return Err(ManifestError::ArenaTooSmall { claimed: arena_bytes, mapped: mapped_bytes });
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(r.take("device UUID", 16)?);
        let name_len = usize::from(r.u16("set name length")?);
        let reserved = r.take("reserved header bytes", 6)?;
        if reserved.iter().any(|b| *b != 0) {
            return Err(bad("reserved header bytes", "not zero".into()));
        }
        if name_len == 0 || name_len > MAX_SET_NAME_BYTES {
            return Err(bad("set name length", format!("{name_len}: 1 to {MAX_SET_NAME_BYTES}")));
        }
        let set_name = utf8(r.take("set name", name_len)?, "set name")?;
        let device_uuid = DeviceUuid(uuid);
        let parts =
            if version == MANIFEST_PARTS_VERSION { Some(read_parts(&mut r, count, device_uuid)?) } else { None };
        // Tensors start after the manifest, on the alignment the owner uses.
        let start = declared.next_multiple_of(TENSOR_ALIGN);
        let checksums = flags & FLAG_CHECKSUMS != 0;
        // Each entry takes at least its fixed bytes and a one-byte name: a count the bytes cannot hold is refused
        // before anything is allocated for it.
        let least = (ENTRY_FIXED_BYTES + 1) as u64 * u64::from(count);
        if least > (bytes.len() - r.at) as u64 {
            return Err(ManifestError::Truncated {
                field: "entries",
                start: r.at as u64,
                end: r.at as u64 + least,
                len: bytes.len() as u64,
            });
        }
        let mut entries = Vec::with_capacity(count as usize);
        for index in 0..count {
            entries.push(read_entry(&mut r, index, checksums, start, arena_bytes)?);
        }
        if r.at != bytes.len() {
            return Err(ManifestError::TrailingBytes { extra: (bytes.len() - r.at) as u64, declared });
        }
        // Names borrowed from the entries: no copy of any (this check was a third of a 19,000-name decode).
        let mut seen: HashMap<&str, u32> = HashMap::with_capacity(entries.len());
        for (index, entry) in (0u32..).zip(&entries) {
            if let Some(first) = seen.insert(&entry.name, index) {
                return Err(ManifestError::DuplicateName { name: entry.name.clone(), first, second: index });
            }
        }
        Ok(Self { set_name, generation, device_uuid, arena_bytes, entries, parts })
    }

    /// The entry named `name`.
    pub fn get(&self, name: &str) -> Option<&TensorEntry> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// Bytes of all tensors' spans together.
    pub fn tensor_bytes(&self) -> u64 {
        self.entries.iter().map(TensorEntry::span_bytes).sum()
    }
}

impl fmt::Display for Manifest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} generation {}: {} tensors, {} bytes in an arena of {}",
            self.set_name,
            self.generation,
            self.entries.len(),
            self.tensor_bytes(),
            self.arena_bytes
        )
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, field: &'static str, n: usize) -> Result<&'a [u8], ManifestError> {
        let end = self.at.checked_add(n);
        match end.and_then(|end| self.bytes.get(self.at..end)) {
            Some(slice) => {
                self.at += n;
                Ok(slice)
            }
            None => Err(ManifestError::Truncated {
                field,
                start: self.at as u64,
                end: (self.at as u64).saturating_add(n as u64),
                len: self.bytes.len() as u64,
            }),
        }
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, ManifestError> {
        Ok(self.take(field, 1)?.first().copied().unwrap_or(0))
    }

    fn u16(&mut self, field: &'static str) -> Result<u16, ManifestError> {
        let b = self.take(field, 2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, ManifestError> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(field, 4)?);
        Ok(u32::from_le_bytes(a))
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, ManifestError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(field, 8)?);
        Ok(u64::from_le_bytes(a))
    }

    /// `n` u64s (at most [`MAX_TENSOR_DIMS`]: the caller checks), in a vector of exactly `n`.
    fn u64s(&mut self, field: &'static str, n: usize) -> Result<Vec<u64>, ManifestError> {
        let bytes = self.take(field, 8 * n)?;
        let mut out = Vec::with_capacity(n);
        out.extend(bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default())));
        Ok(out)
    }
}

fn bad(field: &str, problem: String) -> ManifestError {
    ManifestError::BadField { field: field.to_owned(), problem }
}

fn utf8(bytes: &[u8], field: &str) -> Result<String, ManifestError> {
    std::str::from_utf8(bytes).map(str::to_owned).map_err(|e| bad(field, format!("not UTF-8 ({e})")))
}

/// Checks the magic and returns the format version (1 or 2).
fn check_magic(r: &mut Reader<'_>) -> Result<u16, ManifestError> {
    let mut found = [0u8; 8];
    found.copy_from_slice(r.take("magic", 8)?);
    if found != MANIFEST_MAGIC {
        return Err(ManifestError::BadMagic { found });
    }
    let version = r.u16("format version")?;
    if version != MANIFEST_VERSION && version != MANIFEST_PARTS_VERSION {
        return Err(ManifestError::UnsupportedVersion { found: version });
    }
    Ok(version)
}

/// The parts section of a version-2 manifest of `count` entries on device `device`, every rule checked: a part
/// among 2 to [`MAX_PARTS`], this part's device where the header says, places distinct and inside the set.
fn read_parts(r: &mut Reader<'_>, count: u32, device: DeviceUuid) -> Result<SetParts, ManifestError> {
    let part = r.u16("part")?;
    let part_count = usize::from(r.u16("part count")?);
    if !(2..=MAX_PARTS).contains(&part_count) {
        return Err(bad("part count", format!("{part_count}: 2 to {MAX_PARTS} (a set on one device has no parts)")));
    }
    if usize::from(part) >= part_count {
        return Err(bad("part", format!("{part} of a set of {part_count} parts")));
    }
    let set_tensors = r.u32("set tensors")?;
    if set_tensors > MAX_TENSORS || set_tensors < count {
        return Err(bad("set tensors", format!("{set_tensors}: this part alone has {count}, at most {MAX_TENSORS}")));
    }
    let devices: Vec<DeviceUuid> = r
        .take("part devices", 16 * part_count)?
        .chunks_exact(16)
        .map(|c| DeviceUuid(c.try_into().unwrap_or_default()))
        .collect();
    if devices.get(usize::from(part)) != Some(&device) {
        return Err(bad("part devices", format!("part {part}'s device is not the header's device UUID")));
    }
    let places = r.take("tensor places", 4 * count as usize)?;
    let positions: Vec<u32> =
        places.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap_or_default())).collect();
    let mut seen = std::collections::HashSet::with_capacity(positions.len());
    for (index, &place) in positions.iter().enumerate() {
        if place >= set_tensors || !seen.insert(place) {
            return Err(bad(
                &format!("tensor {index} place"),
                format!("{place}: beyond the set's {set_tensors} tensors, or given to two tensors"),
            ));
        }
    }
    Ok(SetParts { part, devices, set_tensors, positions })
}

fn read_entry(
    r: &mut Reader<'_>,
    index: u32,
    checksums: bool,
    start: u64,
    end: u64,
) -> Result<TensorEntry, ManifestError> {
    let field = |what: &str| format!("tensor {index} {what}");
    let name_len = usize::from(r.u16("tensor name length")?);
    let code = r.u16("tensor element type")?;
    let ndim = usize::from(r.u8("tensor dimensions")?);
    let flags = r.u8("tensor flags")?;
    let reserved = r.take("tensor reserved bytes", 2)?;
    if reserved.iter().any(|b| *b != 0) {
        return Err(bad(&field("reserved bytes"), "not zero".into()));
    }
    if flags & !ENTRY_FLAG_STRIDES != 0 {
        return Err(bad(&field("flags"), format!("unknown bits {flags:#x}")));
    }
    if ndim > MAX_TENSOR_DIMS {
        return Err(bad(&field("dimensions"), format!("{ndim}, more than {MAX_TENSOR_DIMS}")));
    }
    let offset = r.u64("tensor offset")?;
    // Exactly as long as needed: the description keeps the vector as it is (a collect would allocate more, then
    // shrink it: an allocation per entry more, measured in `benches/benches/weights_manifest.rs`).
    let shape = r.u64s("tensor shape", ndim)?;
    let strides = if flags & ENTRY_FLAG_STRIDES != 0 { Some(r.u64s("tensor strides", ndim)?) } else { None };
    let checksum = if checksums { Some(r.u64("tensor checksum")?) } else { None };
    if name_len == 0 || name_len > MAX_TENSOR_NAME_BYTES {
        return Err(bad(&field("name length"), format!("{name_len}: 1 to {MAX_TENSOR_NAME_BYTES}")));
    }
    let name = std::str::from_utf8(r.take("tensor name", name_len)?)
        .map(str::to_owned)
        .map_err(|e| bad(&field("name"), format!("not UTF-8 ({e})")))?;
    let dtype =
        DType::from_code(code, "dtype").map_err(|_| ManifestError::UnknownDType { index, name: name.clone(), code })?;
    let desc = TensorDesc::new(dtype, shape, strides).map_err(|e| ManifestError::BadTensor {
        index,
        name: name.clone(),
        problem: e.to_string(),
    })?;
    let bytes = desc.span_bytes();
    if offset < start || offset.checked_add(bytes).is_none_or(|last| last > end) {
        return Err(ManifestError::OutOfBounds { index, name, offset, bytes, start, end });
    }
    let align = dtype.size_bytes().max(1);
    if !offset.is_multiple_of(align) {
        return Err(ManifestError::Misaligned { index, name, offset, align });
    }
    Ok(TensorEntry { name, desc, offset, checksum })
}
