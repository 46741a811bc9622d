//! The checksum of a tensor's bytes in a manifest (64-bit FNV-1a), whole or fed in pieces, and read out of an
//! arena in chunks so that a tensor of any size is checked with bounded host memory.

/// 64-bit FNV-1a of `bytes`: the checksum of a tensor's bytes in a manifest.
pub fn checksum(bytes: &[u8]) -> u64 {
    let mut sum = Checksum::new();
    sum.update(bytes);
    sum.value()
}

/// [`checksum`] fed in pieces: the value of the pieces one after the other.
#[derive(Debug, Clone, Copy)]
pub struct Checksum(u64);

impl Default for Checksum {
    fn default() -> Self {
        Self::new()
    }
}

impl Checksum {
    /// The checksum of no bytes.
    pub fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    /// Feeds the next bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    /// The checksum of every byte fed.
    pub fn value(self) -> u64 {
        self.0
    }
}

/// Bytes a checksum of an arena's tensor copies to the host at once.
const CHECKSUM_CHUNK_BYTES: u64 = 64 << 20;

/// The [`checksum`] of `len` bytes from `offset`, which `read(at, dst)` copies to the host in pieces of at most
/// 64 MiB through `chunk`: a tensor larger than the host's free memory is checked as well as a small one.
///
/// # Errors
/// The first error of `read`.
pub(super) fn checksum_in_chunks<E>(
    offset: u64,
    len: u64,
    chunk: &mut Vec<u8>,
    read: impl FnMut(u64, &mut [u8]) -> Result<(), E>,
) -> Result<u64, E> {
    checksum_in_pieces(offset, len, CHECKSUM_CHUNK_BYTES, chunk, read)
}

/// As [`checksum_in_chunks`], in pieces of at most `most` bytes.
fn checksum_in_pieces<E>(
    offset: u64,
    len: u64,
    most: u64,
    chunk: &mut Vec<u8>,
    mut read: impl FnMut(u64, &mut [u8]) -> Result<(), E>,
) -> Result<u64, E> {
    let mut sum = Checksum::new();
    let mut at = 0;
    while at < len {
        let piece = (len - at).min(most);
        chunk.resize(piece as usize, 0);
        read(offset + at, chunk)?;
        sum.update(chunk);
        at += piece;
    }
    Ok(sum.value())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_checksum_in_pieces_is_the_checksum_of_the_whole() {
        let bytes: Vec<u8> = (0..1000u32).map(|i| (i * 37 % 251) as u8).collect();
        let whole = checksum(&bytes);
        assert_ne!(whole, Checksum::new().value());
        for most in [1, 7, 256, 999, 1000, 4096] {
            let mut chunk = Vec::new();
            let mut reads = 0;
            let sum = checksum_in_pieces(100, 900, most, &mut chunk, |at, dst| {
                reads += 1;
                assert!(dst.len() as u64 <= most);
                dst.copy_from_slice(&bytes[at as usize..at as usize + dst.len()]);
                Ok::<(), ()>(())
            })
            .unwrap();
            assert_eq!(sum, checksum(&bytes[100..]), "pieces of {most}");
            assert_eq!(reads, 900u64.div_ceil(most));
        }
        assert_eq!(checksum_in_pieces(0, 0, 8, &mut Vec::new(), |_, _| Err(())), Ok(Checksum::new().value()));
        assert_eq!(checksum_in_pieces(0, 10, 8, &mut Vec::new(), |_, _| Err("read")), Err("read"));
    }
}
