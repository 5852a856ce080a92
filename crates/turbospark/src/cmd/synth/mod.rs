//! `turbospark synth`: a checkpoint with random weights and the exact
//! shapes, tensor names and config.json of a real model, for benchmarks and
//! load tests where the real weights cannot be downloaded. The presets are
//! in [`presets`], the tensors are made by [`source::SyntheticModel`], which
//! `bench --synthetic` hands straight to the loader instead (no files).

pub mod presets;
pub mod source;

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result};
use safetensors::tensor::{Dtype, TensorView};
use turbospark_format::DType;
use turbospark_format::checkpoint::{SourceTensor, TensorSource};

pub use presets::Preset;
pub use source::SyntheticModel;

use crate::args::SynthArgs;

pub fn main(a: SynthArgs) -> Result<()> {
    let model = SyntheticModel::new(a.preset, a.layers, a.seed)?;
    let tensors: Vec<SourceTensor> = model
        .names()
        .map(|name| model.fetch(name))
        .collect::<turbospark_format::Result<_>>()?;
    let views: HashMap<String, TensorView> = tensors
        .iter()
        .map(|t| {
            let dtype = match t.dtype {
                DType::F32 => Dtype::F32,
                DType::F16 => Dtype::F16,
                DType::BF16 => Dtype::BF16,
                DType::U8 => Dtype::U8,
            };
            let view = TensorView::new(dtype, t.shape.to_vec(), &t.bytes)?;
            Ok((t.name.to_string(), view))
        })
        .collect::<Result<_>>()?;
    write(&a.out, &model.config, views)?;
    eprintln!(
        "wrote {} ({:.3} B parameters) to {}",
        model.config["architectures"][0],
        model.spec.parameter_count() as f64 / 1e9,
        a.out.display()
    );
    Ok(())
}

fn write(dir: &Path, cfg: &serde_json::Value, views: HashMap<String, TensorView>) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(cfg)?)?;
    let path = dir.join("model.safetensors");
    safetensors::serialize_to_file(views, None, &path)
        .with_context(|| format!("{}: cannot write", path.display()))?;
    Ok(())
}
