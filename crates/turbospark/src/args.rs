//! Command-line arguments (clap derive). Flags follow llama.cpp and vLLM
//! names where a user would look for them.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(name = "turbospark", version, about = "Fast, exact LLM inference")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Generate a continuation of a prompt and stream it to stdout.
    Run(RunArgs),
    /// Write the logits of every position of a token sequence to a .npy file.
    Logits(LogitsArgs),
    /// Chat with a model in the terminal through its chat template.
    Chat(ChatArgs),
    /// Print a model's architecture, size, dtypes and memory needs.
    Inspect(InspectArgs),
    /// Print the token ids of a text.
    Tokenize(TokenizeArgs),
    /// Write a random-weight checkpoint with a real model's shapes.
    Synth(SynthArgs),
    /// Measure prefill and decode speed.
    Bench(BenchArgs),
    /// Teacher-forced perplexity of a text file (windows of --context tokens, default 512).
    Perplexity(PerplexityArgs),
}

/// `--device`: `cpu`, `cuda` (GPU 0), `cuda:N` (GPU N in CUDA's numbering,
/// from 0, after `CUDA_VISIBLE_DEVICES`) or `auto` (GPU 0 when one works,
/// else the CPU).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda(usize),
    Auto,
}

impl std::str::FromStr for Device {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            "auto" => Ok(Device::Auto),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| "use cpu, cuda, cuda:N (GPU N, from 0) or auto".to_string()),
        }
    }
}

/// Where the demo model lives in the repository.
pub const DEMO_MODEL: &str = "models/rust-docs-gpt-oss";

#[derive(Args, Clone)]
pub struct ModelArgs {
    /// Model directory (config.json, *.safetensors, tokenizer.json).
    /// Default: the demo model that ships in the repository.
    #[arg(long, short = 'm')]
    pub model: Option<PathBuf>,
    /// Where to run: cpu, cuda (GPU 0), cuda:N (GPU N, from 0) or auto
    /// (GPU 0 when one works, else the CPU).
    #[arg(long, default_value = "auto")]
    pub device: Device,
    /// CPU threads (default: all cores).
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// Context length in tokens (default: the model's, at most 8192; never past
    /// the positions it was made for: max_position_embeddings or its RoPE
    /// scaling's reach).
    #[arg(long, short = 'c')]
    pub context: Option<usize>,
    /// Quantize the projection weights at load (weight-only, symmetric, an
    /// f16 scale a --quant-group values).
    #[arg(long, value_enum)]
    pub quant: Option<QuantArg>,
    /// Values one scale of --quant covers: 32 (llama.cpp's Q8_0/Q4_0
    /// bytes, the default), 64, 128 (GPTQ's and AWQ's usual group size:
    /// int8 8.125 bits a weight, int4 4.125) or 256. Fewer scales, fewer
    /// bytes a decoded token reads, coarser codes; a matrix whose rows a
    /// group does not divide takes the largest one that does.
    #[arg(long, default_value_t = turbospark_backend::QUANT_GROUP, value_parser = parse_quant_group, requires = "quant")]
    pub quant_group: usize,
    /// Copy the weights out of the checkpoint instead of reading them in
    /// place from its memory mapping (the CPU's default): the checkpoint
    /// may then change while the model runs, at the cost of a slower load
    /// and the model's memory again.
    #[arg(long)]
    pub no_mmap: bool,
    /// Operand precision of the GPU's prefill paths: bf16 tensor cores
    /// (activations rounded to bf16; the default), or f32-level results at
    /// about half the prefill speed (for comparisons with references). The
    /// CPU computes in f32 either way, except that its decode multiplies
    /// packed weights by x rounded per 32 values (int16 for MXFP4, int8 for
    /// --quant int8/int4), as llama.cpp's and the GPU's decode do.
    #[arg(long, value_enum, default_value = "bf16")]
    pub precision: PrecisionArg,
    /// How the KV cache keeps keys and values (vLLM's flag; llama.cpp's
    /// --cache-type-k/v). auto: bf16 on the GPU for a bf16 model at
    /// --precision bf16 (half the memory and the bytes each decoded token
    /// reads), f32 otherwise and on the CPU. Attention computes in f32 either
    /// way.
    #[arg(long, value_enum, default_value = "auto", alias = "kv-dtype")]
    pub kv_cache_dtype: KvDtypeArg,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KvDtypeArg {
    Auto,
    F32,
    Bf16,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PrecisionArg {
    Bf16,
    F32,
}

/// `--quant-group`: one of the scale groups the formats take.
fn parse_quant_group(s: &str) -> Result<usize, String> {
    let groups = turbospark_backend::SCALE_GROUPS;
    s.parse()
        .ok()
        .filter(|g| groups.contains(g))
        .ok_or_else(|| format!("expected one of {groups:?} values a scale"))
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum QuantArg {
    Int8,
    Int4,
}

#[derive(Args, Clone)]
pub struct SamplingArgs {
    /// Maximum tokens to generate.
    #[arg(long, short = 'n', default_value_t = 256)]
    pub max_tokens: usize,
    /// 0 = greedy. Default: generation_config.json's when it samples, else greedy.
    /// (Negative values are greedy too, as in llama.cpp.)
    #[arg(long, allow_negative_numbers = true)]
    pub temperature: Option<f32>,
    #[arg(long)]
    pub top_k: Option<usize>,
    #[arg(long)]
    pub top_p: Option<f32>,
    #[arg(long)]
    pub min_p: Option<f32>,
    #[arg(long, alias = "repeat-penalty")]
    pub repetition_penalty: Option<f32>,
    /// OpenAI's additive penalties, in [-2, 2]: negative values favour
    /// tokens already generated.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    #[arg(long, short = 's', default_value_t = 0)]
    pub seed: u64,
    /// Stop when this text appears (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Keep generating through end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ReasoningEffort {
    Low,
    Medium,
    High,
}

impl ReasoningEffort {
    pub fn name(self) -> &'static str {
        match self {
            ReasoningEffort::Low => "low",
            ReasoningEffort::Medium => "medium",
            ReasoningEffort::High => "high",
        }
    }
}

/// Reasoning models (gpt-oss' Harmony format): how much to think, and
/// whether to show the thinking.
#[derive(Args, Clone)]
pub struct ReasoningArgs {
    /// Passed to the chat template as `reasoning_effort` (gpt-oss: default medium).
    #[arg(long, value_enum)]
    pub reasoning_effort: Option<ReasoningEffort>,
    /// Do not print the model's reasoning (Harmony's analysis channel).
    #[arg(long)]
    pub hide_reasoning: bool,
}

impl ReasoningArgs {
    /// Extra chat-template variables.
    pub fn template_vars(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut vars = serde_json::Map::new();
        if let Some(effort) = self.reasoning_effort {
            vars.insert("reasoning_effort".into(), effort.name().into());
        }
        vars
    }
}

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// The prompt text.
    #[arg(long, short = 'p', conflicts_with = "prompt_tokens")]
    pub prompt: Option<String>,
    /// The prompt as token ids: 1,2,3.
    #[arg(long, value_delimiter = ',')]
    pub prompt_tokens: Option<Vec<u32>>,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// System message (with --chat).
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Print one JSON object at the end instead of streaming text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub reasoning: ReasoningArgs,
}

#[derive(Args)]
pub struct LogitsArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Token ids: 1,2,3.
    #[arg(long, value_delimiter = ',', required = true)]
    pub tokens: Vec<u32>,
    /// Output .npy file (float32, [n_tokens, vocab]).
    #[arg(long, short = 'o')]
    pub out: PathBuf,
}

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// System message for the conversation.
    #[arg(long)]
    pub system: Option<String>,
    #[command(flatten)]
    pub reasoning: ReasoningArgs,
}

#[derive(Args)]
pub struct InspectArgs {
    /// Model directory.
    pub dir: PathBuf,
}

#[derive(Args)]
pub struct TokenizeArgs {
    /// A model directory, or a tokenizer.json file itself.
    #[arg(long, short = 'm')]
    pub model: PathBuf,
    /// Text to tokenize.
    pub text: String,
    /// Do not add special tokens such as BOS.
    #[arg(long)]
    pub no_special: bool,
}

#[derive(Args)]
pub struct SynthArgs {
    /// A real model's shape.
    #[arg(long, value_enum)]
    pub preset: crate::cmd::synth::Preset,
    /// Output directory.
    #[arg(long, short = 'o')]
    pub out: PathBuf,
    /// Keep only this many layers (same layer shapes).
    #[arg(long)]
    pub layers: Option<usize>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Random weights with this real model's shapes, made in memory (no
    /// files, no download); instead of --model.
    #[arg(long, value_enum, value_name = "PRESET", conflicts_with = "model")]
    pub synthetic: Option<crate::cmd::synth::Preset>,
    /// Keep only this many layers of the --synthetic model (same shapes).
    #[arg(long, hide = true, requires = "synthetic")]
    pub layers: Option<usize>,
    /// Prompt tokens, run as one prefill.
    #[arg(long, default_value_t = 128)]
    pub prompt_len: usize,
    /// Tokens decoded one at a time after the prompt.
    #[arg(long, default_value_t = 32)]
    pub gen_len: usize,
    /// Untimed runs of the whole prompt (and two decode steps) before the
    /// timed one, in a throwaway session, as llama-bench's warmup: the first
    /// run pays for lazily loaded GPU code, cuBLAS's heuristics and buffer
    /// growth, which a serving process pays once.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Decode by sampling at this temperature instead of greedily (0 =
    /// greedy, the default), with the filters below, as `run` samples.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text to score.
    #[arg(long)]
    pub text_file: PathBuf,
    /// Score through the one-token decode path, one step a token, as
    /// generation computes: int8, int4 and MXFP4 weights then multiply
    /// activations rounded to integers. Slower than the default (one prompt
    /// pass a window).
    #[arg(long)]
    pub decode: bool,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

impl ModelArgs {
    /// `--model`, else `$TURBOSPARK_MODEL`, else the demo model found from
    /// the current directory or beside the executable (`target/*/turbospark`
    /// in a checkout).
    pub fn dir(&self) -> PathBuf {
        if let Some(m) = &self.model {
            return m.clone();
        }
        if let Some(m) = std::env::var_os("TURBOSPARK_MODEL") {
            return PathBuf::from(m);
        }
        let exe_roots = std::env::current_exe()
            .ok()
            .into_iter()
            .flat_map(|e| e.ancestors().skip(1).map(PathBuf::from).collect::<Vec<_>>());
        std::iter::once(PathBuf::from("."))
            .chain(exe_roots)
            .map(|root| root.join(DEMO_MODEL))
            .find(|p| p.join("config.json").exists())
            .unwrap_or_else(|| PathBuf::from(DEMO_MODEL))
    }
}

#[cfg(test)]
mod tests {
    use super::Device;

    #[test]
    fn devices_parse_with_gpu_numbers() {
        let parse = |s: &str| s.parse::<Device>();
        assert_eq!(parse("cpu"), Ok(Device::Cpu));
        assert_eq!(parse("cuda"), Ok(Device::Cuda(0)));
        assert_eq!(parse("cuda:0"), Ok(Device::Cuda(0)));
        assert_eq!(parse("cuda:3"), Ok(Device::Cuda(3)));
        assert_eq!(parse("auto"), Ok(Device::Auto));
        for bad in ["gpu", "cuda:", "cuda:-1", "cuda:x", "CUDA", "cuda1"] {
            assert_eq!(
                parse(bad),
                Err("use cpu, cuda, cuda:N (GPU N, from 0) or auto".to_string()),
                "{bad}"
            );
        }
    }
}
