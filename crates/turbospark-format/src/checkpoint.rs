//! Safetensors checkpoints: one `model.safetensors`, or shards listed by
//! `model.safetensors.index.json`. Files are memory-mapped (memmap2); a tensor
//! is handed out as a borrowed byte slice with its dtype and shape, and the
//! backend decides how to store it. This module copies no data; it widens
//! values to f32 only when a caller asks (`HostTensor::to_f32`).
//!
//! [`TensorSource`] is what the model loader reads from: a [`Checkpoint`]
//! lends mapped bytes, other sources (random weights generated in memory for
//! benchmarks) hand out tensors they make when asked, one at a time.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use safetensors::tensor::{Dtype as StDtype, SafeTensors};

use crate::error::{FormatError, Result};
use crate::spec::DType;

/// A tensor as stored in the checkpoint (little-endian bytes).
#[derive(Clone, Copy, Debug)]
pub struct HostTensor<'a> {
    pub name: &'a str,
    pub dtype: DType,
    pub shape: &'a [usize],
    pub bytes: &'a [u8],
    /// The memory-mapped file `bytes` lie in, when they come straight from
    /// one: a backend that computes on host memory may keep the weight
    /// there (a clone of the `Arc`) instead of copying it. `None` for
    /// bytes a caller made (transposed, stacked, generated).
    pub map: Option<&'a Arc<Mmap>>,
}

impl HostTensor<'_> {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Requires `shape == expected`, naming the tensor otherwise.
    pub fn expect_shape(&self, expected: &[usize]) -> Result<()> {
        if self.shape != expected {
            return Err(FormatError::Shape {
                name: self.name.to_string(),
                expected: expected.to_vec(),
                got: self.shape.to_vec(),
            });
        }
        Ok(())
    }

    /// The values widened to f32 (for small tensors: norms, biases; a
    /// large one is widened a piece at a time, [`HostTensor::to_f32_into`]).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.bytes.len() / self.dtype.size()];
        self.to_f32_into(0, &mut out);
        out
    }

    /// Values `start .. start + out.len()` (in storage order) widened to f32
    /// into `out`. Panics past the tensor's end.
    pub fn to_f32_into(&self, start: usize, out: &mut [f32]) {
        let size = self.dtype.size();
        let b = &self.bytes[start * size..(start + out.len()) * size];
        fn widen<const N: usize>(out: &mut [f32], b: &[u8], f: impl Fn([u8; N]) -> f32) {
            for (o, c) in out.iter_mut().zip(b.chunks_exact(N)) {
                *o = f(c.try_into().expect("N bytes"));
            }
        }
        match self.dtype {
            DType::F32 => widen(out, b, f32::from_le_bytes),
            DType::BF16 => widen(out, b, |c| half::bf16::from_le_bytes(c).to_f32()),
            DType::F16 => widen(out, b, |c| half::f16::from_le_bytes(c).to_f32()),
            DType::U8 => widen(out, b, |[c]| c as f32),
        }
    }
}

/// A tensor from a [`TensorSource`]: borrowed from a mapped file, or owned
/// by the caller when the source made it on request.
#[derive(Clone, Debug)]
pub struct SourceTensor<'a> {
    pub name: Cow<'a, str>,
    pub dtype: DType,
    pub shape: Cow<'a, [usize]>,
    pub bytes: Cow<'a, [u8]>,
    /// As [`HostTensor::map`], for borrowed bytes.
    pub map: Option<&'a Arc<Mmap>>,
}

impl SourceTensor<'_> {
    /// The tensor as the backends take it.
    pub fn view(&self) -> HostTensor<'_> {
        HostTensor {
            name: &self.name,
            dtype: self.dtype,
            shape: &self.shape,
            bytes: &self.bytes,
            map: match self.bytes {
                Cow::Borrowed(_) => self.map,
                Cow::Owned(_) => None,
            },
        }
    }
}

impl<'a> From<HostTensor<'a>> for SourceTensor<'a> {
    fn from(t: HostTensor<'a>) -> Self {
        SourceTensor {
            name: Cow::Borrowed(t.name),
            dtype: t.dtype,
            shape: Cow::Borrowed(t.shape),
            bytes: Cow::Borrowed(t.bytes),
            map: t.map,
        }
    }
}

/// Named tensors for the model loader: a checkpoint on disk, or a source
/// that makes each tensor when it is fetched (so at most the tensors being
/// uploaded are in host memory at once).
pub trait TensorSource {
    fn contains(&self, name: &str) -> bool;

    /// Bytes of all tensor data (for load progress).
    fn total_bytes(&self) -> u64;

    /// The tensor `name`; an error naming it when there is none.
    fn fetch(&self, name: &str) -> Result<SourceTensor<'_>>;

    /// Like [`fetch`](Self::fetch), then checks the shape.
    fn fetch_shaped(&self, name: &str, shape: &[usize]) -> Result<SourceTensor<'_>> {
        let t = self.fetch(name)?;
        t.view().expect_shape(shape)?;
        Ok(t)
    }
}

impl TensorSource for Checkpoint {
    fn contains(&self, name: &str) -> bool {
        Checkpoint::contains(self, name)
    }

    fn total_bytes(&self) -> u64 {
        Checkpoint::total_bytes(self)
    }

    fn fetch(&self, name: &str) -> Result<SourceTensor<'_>> {
        self.get(name).map(SourceTensor::from)
    }

    fn fetch_shaped(&self, name: &str, shape: &[usize]) -> Result<SourceTensor<'_>> {
        self.get_shaped(name, shape).map(SourceTensor::from)
    }
}

struct Entry {
    shard: usize,
    dtype: DType,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

/// An opened checkpoint directory.
pub struct Checkpoint {
    dir: PathBuf,
    shards: Vec<Arc<Mmap>>,
    tensors: HashMap<String, Entry>,
}

fn io_err(path: &Path, e: std::io::Error) -> FormatError {
    match e.kind() {
        std::io::ErrorKind::NotFound => FormatError::Missing {
            path: path.to_path_buf(),
        },
        _ => FormatError::Io {
            path: path.to_path_buf(),
            what: e.to_string(),
        },
    }
}

impl Checkpoint {
    pub fn open(dir: &Path) -> Result<Self> {
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        let files = if single.exists() {
            vec![single]
        } else if index.exists() {
            shard_files(dir, &index)?
        } else {
            return Err(FormatError::Missing { path: single });
        };
        let mut ckpt = Checkpoint {
            dir: dir.to_path_buf(),
            shards: Vec::new(),
            tensors: HashMap::new(),
        };
        for file in files {
            ckpt.add_shard(&file)?;
        }
        Ok(ckpt)
    }

    fn add_shard(&mut self, path: &Path) -> Result<()> {
        let file = File::open(path).map_err(|e| io_err(path, e))?;
        // SAFETY: the mapping is read-only; like every inference engine we
        // assume the checkpoint is not modified while it is loaded (or, on
        // the CPU, while its weights are used in place).
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| io_err(path, e))?;
        // Pages read through this mapping come in as 2 MB folios, mapped
        // with one TLB entry each where they can be (Linux with transparent
        // huge pages; advice that cannot be taken is ignored). A CPU reading
        // its weights in place streams gigabytes a token: with 4 KB pages
        // Llama-3.2-1B decoded 8.6-9.1 tok/s, with 2 MB ones 9.8-10.2
        // (BENCHMARKS.md, fortieth session).
        #[cfg(target_os = "linux")]
        let _ = mmap.advise(memmap2::Advice::HugePage);
        let bad = |what: String| FormatError::Safetensors {
            file: path.to_path_buf(),
            what,
        };
        let st = SafeTensors::deserialize(&mmap).map_err(|e| bad(e.to_string()))?;
        let shard = self.shards.len();
        for (name, view) in st.tensors() {
            let dtype = match view.dtype() {
                StDtype::F32 => DType::F32,
                StDtype::F16 => DType::F16,
                StDtype::BF16 => DType::BF16,
                StDtype::U8 => DType::U8,
                other => {
                    return Err(FormatError::Dtype {
                        name,
                        dtype: format!("{other:?}"),
                    });
                }
            };
            // Offset of this view's bytes inside the mapping.
            let start = view.data().as_ptr() as usize - mmap.as_ptr() as usize;
            let end = start + view.data().len();
            self.tensors.insert(
                name,
                Entry {
                    shard,
                    dtype,
                    shape: view.shape().to_vec(),
                    start,
                    end,
                },
            );
        }
        self.shards.push(Arc::new(mmap));
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(|s| s.as_str())
    }

    /// Total bytes of tensor data.
    pub fn total_bytes(&self) -> u64 {
        self.tensors
            .values()
            .map(|e| (e.end - e.start) as u64)
            .sum()
    }

    /// The tensor `name`, its pages read in: one `madvise(MADV_POPULATE_READ)`
    /// over its bytes (Linux 5.14+; elsewhere they come in as first read),
    /// so that a backend copying or quantizing it, or the CPU reading it in
    /// place for the first token, does not fault it in a page at a time.
    pub fn get(&self, name: &str) -> Result<HostTensor<'_>> {
        let (key, e) =
            self.tensors
                .get_key_value(name)
                .ok_or_else(|| FormatError::MissingTensor {
                    name: name.to_string(),
                    dir: self.dir.clone(),
                })?;
        #[cfg(target_os = "linux")]
        let _ = self.shards[e.shard].advise_range(
            memmap2::Advice::PopulateRead,
            e.start,
            e.end - e.start,
        );
        Ok(HostTensor {
            name: key,
            dtype: e.dtype,
            shape: &e.shape,
            bytes: &self.shards[e.shard][e.start..e.end],
            map: Some(&self.shards[e.shard]),
        })
    }

    /// Like [`get`](Self::get), then checks the shape.
    pub fn get_shaped(&self, name: &str, shape: &[usize]) -> Result<HostTensor<'_>> {
        let t = self.get(name)?;
        t.expect_shape(shape)?;
        Ok(t)
    }

    /// Count of stored values per dtype, for `inspect`.
    pub fn dtype_counts(&self) -> Vec<(DType, u64)> {
        let mut out: Vec<(DType, u64)> = Vec::new();
        for e in self.tensors.values() {
            let n = e.shape.iter().product::<usize>() as u64;
            match out.iter_mut().find(|(d, _)| *d == e.dtype) {
                Some((_, c)) => *c += n,
                None => out.push((e.dtype, n)),
            }
        }
        out.sort_by_key(|(d, _)| d.name());
        out
    }
}

/// The shard files named by an index, in first-seen order, deduplicated.
fn shard_files(dir: &Path, index: &Path) -> Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string(index).map_err(|e| io_err(index, e))?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| FormatError::Json {
        path: index.to_path_buf(),
        what: e.to_string(),
    })?;
    let map = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| FormatError::Json {
            path: index.to_path_buf(),
            what: "no `weight_map` object".into(),
        })?;
    let mut files: Vec<PathBuf> = Vec::new();
    for file in map.values() {
        let name = file.as_str().ok_or_else(|| FormatError::Json {
            path: index.to_path_buf(),
            what: format!("weight_map value {file} is not a file name"),
        })?;
        let path = dir.join(name);
        if !files.contains(&path) {
            files.push(path);
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A range widened in place holds the same values as the whole tensor
    /// widened, for every stored dtype, from an offset inside it.
    #[test]
    fn a_range_widens_to_the_values_at_its_offset() {
        let values = [1.5f32, -2.25, 0.0, 3.0e-3, -7.0, 65504.0];
        let cases: [(DType, Vec<u8>); 4] = [
            (
                DType::F32,
                values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
            (
                DType::BF16,
                values
                    .iter()
                    .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                    .collect(),
            ),
            (
                DType::F16,
                values
                    .iter()
                    .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                    .collect(),
            ),
            (DType::U8, vec![0, 1, 2, 200, 254, 255]),
        ];
        for (dtype, bytes) in cases {
            let t = HostTensor {
                name: "w",
                dtype,
                shape: &[2, 3],
                bytes: &bytes,
                map: None,
            };
            let all = t.to_f32();
            assert_eq!(all.len(), 6, "{dtype:?}");
            if dtype == DType::F32 {
                assert_eq!(all, values);
            }
            let mut part = [f32::NAN; 3];
            t.to_f32_into(2, &mut part);
            assert_eq!(part, all[2..5], "{dtype:?}");
        }
        let t = HostTensor {
            name: "w",
            dtype: DType::BF16,
            shape: &[2],
            bytes: &[0x40, 0x3f, 0xc0, 0xbf],
            map: None,
        };
        assert_eq!(t.to_f32(), [0.75, -1.5]);
    }
}
