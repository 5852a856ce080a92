//! Opening a model directory: config.json → spec → the family's loader.
//! The only place that maps an [`Arch`] to a family implementation.

use std::path::Path;

use turbospark_backend::Backend;
use turbospark_format::checkpoint::TensorSource;
use turbospark_format::{Arch, Checkpoint, ModelSpec, load_config};

use crate::error::Result;
use crate::families::{CausalLm, gemma, gpt_oss, llama, mixtral, qwen3_moe};
use crate::loader::{LoadOptions, Loader, Progress};

/// Reads and validates `DIR/config.json` without touching weights.
pub fn read_spec(dir: &Path) -> Result<ModelSpec> {
    let path = dir.to_path_buf();
    if dir.is_file() {
        return Err(turbospark_format::FormatError::NotADirectory { path }.into());
    }
    if !dir.is_dir() {
        return Err(turbospark_format::FormatError::Missing { path }.into());
    }
    Ok(load_config(dir)?)
}

/// Loads the model in `dir` onto `be`.
pub fn load_model<B: Backend + 'static>(
    be: &B,
    dir: &Path,
    opts: LoadOptions,
    progress: Progress<'_>,
) -> Result<Box<dyn CausalLm<B>>> {
    load_model_with(be, dir, read_spec(dir)?, opts, progress)
}

/// Loads the weights in `dir` for an explicitly given spec (tests use this
/// to switch a single term off and prove the fixtures notice).
pub fn load_model_with_spec<B: Backend + 'static>(
    be: &B,
    dir: &Path,
    spec: ModelSpec,
    progress: Progress<'_>,
) -> Result<Box<dyn CausalLm<B>>> {
    load_model_with(be, dir, spec, LoadOptions::default(), progress)
}

/// Loads the weights in `dir` for `spec` with explicit load options.
pub fn load_model_with<B: Backend + 'static>(
    be: &B,
    dir: &Path,
    spec: ModelSpec,
    opts: LoadOptions,
    progress: Progress<'_>,
) -> Result<Box<dyn CausalLm<B>>> {
    let ckpt = Checkpoint::open(dir)?;
    load_model_from(be, &ckpt, spec, opts, progress)
}

/// Loads `spec`'s weights from any tensor source: a checkpoint, or tensors
/// made in memory (`turbospark bench --synthetic`).
pub fn load_model_from<B: Backend + 'static>(
    be: &B,
    source: &dyn TensorSource,
    spec: ModelSpec,
    opts: LoadOptions,
    progress: Progress<'_>,
) -> Result<Box<dyn CausalLm<B>>> {
    let loader = Loader::new(be, source, opts, progress);
    Ok(match spec.arch {
        Arch::Llama | Arch::Mistral | Arch::Qwen2 | Arch::Qwen3 => {
            Box::new(llama::load(&loader, spec)?)
        }
        Arch::GptOss => Box::new(gpt_oss::load(&loader, spec)?),
        Arch::Gemma2 | Arch::Gemma3 => Box::new(gemma::load(&loader, spec)?),
        Arch::Qwen3Moe => Box::new(qwen3_moe::load(&loader, spec)?),
        Arch::Mixtral => Box::new(mixtral::load(&loader, spec)?),
    })
}
