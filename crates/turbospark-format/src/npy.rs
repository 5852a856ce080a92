//! NumPy `.npy` files of little-endian float32 (version 1.0), the exchange
//! format of `turbospark logits` and of the reference fixtures.

use std::io::Write;
use std::path::Path;

use crate::error::{FormatError, Result};

/// Writes `data` (row-major) with `shape` as `<f4`.
pub fn write_f32(path: &Path, shape: &[usize], data: &[f32]) -> Result<()> {
    assert_eq!(shape.iter().product::<usize>(), data.len());
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let tuple = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {tuple}, }}");
    // Magic (6) + version (2) + length (2) + header + '\n' is a multiple of 64.
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat(total.next_multiple_of(64) - total));
    header.push('\n');
    let mut bytes = Vec::with_capacity(10 + header.len() + data.len() * 4);
    bytes.extend_from_slice(b"\x93NUMPY\x01\x00");
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    for v in data {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    let io = |e: std::io::Error| FormatError::Io {
        path: path.to_path_buf(),
        what: e.to_string(),
    };
    std::fs::File::create(path)
        .and_then(|mut f| f.write_all(&bytes))
        .map_err(io)
}

/// Reads a C-order `<f4` array: (shape, data).
pub fn read_f32(path: &Path) -> Result<(Vec<usize>, Vec<f32>)> {
    let bad = |what: &str| FormatError::Io {
        path: path.to_path_buf(),
        what: format!("not a little-endian float32 .npy file ({what})"),
    };
    let bytes = std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => FormatError::Missing {
            path: path.to_path_buf(),
        },
        _ => FormatError::Io {
            path: path.to_path_buf(),
            what: e.to_string(),
        },
    })?;
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(bad("no magic"));
    }
    let (hlen, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        _ => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
    };
    let header = std::str::from_utf8(&bytes[start..start + hlen]).map_err(|_| bad("header"))?;
    if !header.contains("'<f4'") || header.contains("'fortran_order': True") {
        return Err(bad("dtype or order"));
    }
    let open = header.find("'shape': (").ok_or_else(|| bad("shape"))? + 10;
    let close = open + header[open..].find(')').ok_or_else(|| bad("shape"))?;
    let shape: Vec<usize> = header[open..close]
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| bad("shape")))
        .collect::<Result<_>>()?;
    let data: Vec<f32> = bytes[start + hlen..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    if data.len() != shape.iter().product::<usize>() {
        return Err(bad("length"));
    }
    Ok((shape, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_keeps_shape_values_and_alignment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.npy");
        let data: Vec<f32> = (0..6).map(|i| i as f32 * 0.5 - 1.0).collect();
        write_f32(&path, &[2, 3], &data).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!((bytes.len() - 24) % 64, 0, "data starts 64-aligned");
        assert_eq!(read_f32(&path).unwrap(), (vec![2, 3], data));
    }
}
