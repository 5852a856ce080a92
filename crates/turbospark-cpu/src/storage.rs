//! A weight's values, owned or left in place in the memory-mapped
//! checkpoint they were read from.
//!
//! The CPU computes on host memory, so a bf16, f16, f32 or MXFP4 tensor
//! that the checkpoint already holds in the layout the kernels read needs
//! no copy: the weight keeps the mapping alive (an `Arc`) and reads the
//! file's pages, which the page cache shares with every process that maps
//! the file. A copy cost as much memory again and a write of every byte at
//! load: gpt-oss-20b (13.8 GB) took 30 s to load on the developers' 2-core
//! VM, most of it the kernel zeroing fresh pages (BENCHMARKS.md, fortieth
//! session). This module decides which bytes can stay in place; it does not
//! read or convert values beyond the little-endian decoding of a copy.

use std::ops::Deref;
use std::sync::Arc;

use memmap2::Mmap;
use turbospark_format::HostTensor;

/// A value type whose every bit pattern is valid, read from little-endian
/// bytes.
///
/// # Safety
/// Implementors must be plain data (no padding, no invalid bit patterns),
/// so that any aligned bytes of their size can be read as one.
pub unsafe trait Plain: Copy + Send + Sync + 'static {
    fn from_le(bytes: &[u8]) -> Self;
}

// SAFETY: integers and floats are plain data.
unsafe impl Plain for u8 {
    fn from_le(bytes: &[u8]) -> Self {
        bytes[0]
    }
}
// SAFETY: as above.
unsafe impl Plain for u16 {
    fn from_le(bytes: &[u8]) -> Self {
        u16::from_le_bytes([bytes[0], bytes[1]])
    }
}
// SAFETY: as above.
unsafe impl Plain for f32 {
    fn from_le(bytes: &[u8]) -> Self {
        f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
    }
}

/// Values of type `T`: a vector, or `len` of them at `offset` bytes into a
/// read-only mapping (aligned for `T`, on a little-endian host: checked
/// when made, [`Storage::of`]).
#[derive(Clone)]
pub enum Storage<T: Plain> {
    Owned(Vec<T>),
    Mapped {
        map: Arc<Mmap>,
        offset: usize,
        len: usize,
    },
}

impl<T: Plain> Storage<T> {
    /// The tensor's values: left in its mapping where they can be read in
    /// place there, else decoded into a vector.
    pub fn of(t: &HostTensor<'_>) -> Self {
        Self::in_place(t).unwrap_or_else(|| {
            let size = std::mem::size_of::<T>();
            Storage::Owned(t.bytes.chunks_exact(size).map(T::from_le).collect())
        })
    }

    fn in_place(t: &HostTensor<'_>) -> Option<Self> {
        let map = t.map?;
        let size = std::mem::size_of::<T>();
        let base = map.as_ptr() as usize;
        let start = t.bytes.as_ptr() as usize;
        // The bytes must lie inside the mapping (a caller may pair a map
        // with other bytes), start aligned for T and hold whole values, on
        // a host whose byte order is the file's.
        let inside = start >= base && start + t.bytes.len() <= base + map.len();
        let fits =
            start.is_multiple_of(std::mem::align_of::<T>()) && t.bytes.len().is_multiple_of(size);
        if !(cfg!(target_endian = "little") && inside && fits) {
            return None;
        }
        // A checkpoint has read the pages in as it handed the tensor out
        // (`Checkpoint::get`), so the load's progress tells the truth and
        // the first token does not fault the weights in page by page.
        Some(Storage::Mapped {
            map: Arc::clone(map),
            offset: start - base,
            len: t.bytes.len() / size,
        })
    }

    /// Whether the values are read in place from a mapping.
    pub fn is_mapped(&self) -> bool {
        matches!(self, Storage::Mapped { .. })
    }
}

impl<T: Plain> Deref for Storage<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            Storage::Owned(v) => v,
            // SAFETY: `in_place` checked that the range lies inside the
            // mapping and is aligned for T, which is plain data; the `Arc`
            // keeps the read-only mapping alive as long as `self`.
            Storage::Mapped { map, offset, len } => unsafe {
                std::slice::from_raw_parts(map.as_ptr().add(*offset).cast::<T>(), *len)
            },
        }
    }
}

impl<T: Plain> From<Vec<T>> for Storage<T> {
    fn from(v: Vec<T>) -> Self {
        Storage::Owned(v)
    }
}

impl<T: Plain> FromIterator<T> for Storage<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        Storage::Owned(iter.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use turbospark_format::DType;

    use super::*;

    fn mapped_file(bytes: &[u8]) -> Arc<Mmap> {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(bytes).unwrap();
        // SAFETY: a private temporary file nobody else writes.
        Arc::new(unsafe { Mmap::map(&f) }.unwrap())
    }

    fn tensor<'a>(bytes: &'a [u8], map: Option<&'a Arc<Mmap>>) -> HostTensor<'a> {
        HostTensor {
            name: "w",
            dtype: DType::BF16,
            shape: &[2],
            bytes,
            map,
        }
    }

    /// Bytes of a mapping stay there; the values read the same either way.
    #[test]
    fn mapped_bytes_are_read_in_place() {
        let values: Vec<u16> = vec![0x3f80, 0xc000, 0x1234];
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let map = mapped_file(&bytes);
        let s = Storage::<u16>::of(&tensor(&map[..], Some(&map)));
        assert!(s.is_mapped());
        assert_eq!(&s[..], &values[..]);
        let copy = Storage::<u16>::of(&tensor(&bytes, None));
        assert!(!copy.is_mapped());
        assert_eq!(&copy[..], &values[..]);
    }

    /// Bytes that are not the mapping's, or not aligned for the type, are
    /// copied (and still decode to the same values).
    #[test]
    fn foreign_or_misaligned_bytes_are_copied() {
        let bytes = [1u8, 0, 2, 0, 3, 0, 4];
        let map = mapped_file(&bytes);
        let foreign = [5u8, 0, 6, 0];
        let s = Storage::<u16>::of(&tensor(&foreign, Some(&map)));
        assert!(!s.is_mapped());
        assert_eq!(&s[..], &[5, 6]);
        // One byte in: a u16 there is misaligned.
        let odd = Storage::<u16>::of(&tensor(&map[1..5], Some(&map)));
        assert!(!odd.is_mapped());
        assert_eq!(&odd[..], &[512, 768]);
        let bytes_ok = Storage::<u8>::of(&tensor(&map[1..5], Some(&map)));
        assert!(bytes_ok.is_mapped());
        assert_eq!(&bytes_ok[..], &[0, 2, 0, 3]);
    }
}
