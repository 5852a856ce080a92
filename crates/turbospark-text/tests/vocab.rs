//! Real vocabularies: tokenizer.json files converted from llama.cpp's
//! vocabulary-only GGUF files (tools/vocab/gguf_to_tokenizer_json.py) must
//! reproduce llama.cpp's token ids for its own test inputs
//! (testdata/vocab/NAME/ggml-vocab-NAME.gguf.{inp,out}, MIT, see
//! testdata/LICENSE-llama.cpp). Nobody on this project wrote those ids.

use std::path::{Path, PathBuf};

use turbospark_text::{TextError, Tokenizer};

fn vocab_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/vocab")
        .join(name)
}

fn load(name: &str) -> Tokenizer {
    Tokenizer::from_dir(&vocab_dir(name)).unwrap()
}

/// Inputs and expected ids, parsed as llama.cpp's tests/test-tokenizer-0.cpp
/// does: inputs are separated by "\n__ggml_vocab_test__\n", and line i of
/// the .out file holds the ids of input i.
fn vectors(name: &str) -> Vec<(String, Vec<u32>)> {
    let base = vocab_dir(name).join(format!("ggml-vocab-{name}.gguf"));
    let inp = std::fs::read_to_string(base.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(base.with_extension("gguf.out")).unwrap();
    let mut inputs: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    if inputs.last() == Some(&"") {
        inputs.pop();
    }
    let ids: Vec<Vec<u32>> = out
        .split('\n')
        .map(|line| {
            line.split_whitespace()
                .map(|t| t.parse().unwrap())
                .collect()
        })
        .collect();
    assert!(
        ids.len() >= inputs.len(),
        "{name}: fewer .out lines than inputs"
    );
    inputs.into_iter().map(String::from).zip(ids).collect()
}

fn check_vectors(name: &str) {
    let tok = load(name);
    let cases = vectors(name);
    assert_eq!(cases.len(), 46, "{name}: test inputs");
    let mut bad = Vec::new();
    for (text, want) in &cases {
        let got = tok.encode(text, false).unwrap();
        if &got != want {
            bad.push(format!("{text:?}: got {got:?}, llama.cpp {want:?}"));
        }
        // Byte-level BPE is lossless: the ids decode to the input again.
        assert_eq!(
            &tok.decode(&got, false).unwrap(),
            text,
            "{name}: round trip"
        );
    }
    assert!(
        bad.is_empty(),
        "{name}: {} of {} differ:\n{}",
        bad.len(),
        cases.len(),
        bad.join("\n")
    );
}

#[test]
fn gpt2_matches_llama_cpp() {
    check_vectors("gpt-2");
}

#[test]
fn llama3_matches_llama_cpp() {
    check_vectors("llama-bpe");
}

#[test]
fn qwen2_matches_llama_cpp() {
    check_vectors("qwen2");
}

#[test]
fn vocab_sizes_and_lookups() {
    let gpt2 = load("gpt-2");
    assert_eq!(gpt2.vocab_size(), 50_257);
    assert_eq!(gpt2.token_id("<|endoftext|>"), Some(50_256));
    assert_eq!(gpt2.encode("Hello world", true).unwrap(), [15_496, 995]);

    let llama = load("llama-bpe");
    assert_eq!(llama.vocab_size(), 128_256);
    assert_eq!(llama.id_to_token(128_009).as_deref(), Some("<|eot_id|>"));
    assert_eq!(llama.id_to_token(1917).as_deref(), Some("Ġworld"));
    // Llama 3's post-processor adds <|begin_of_text|> only when asked to.
    assert_eq!(
        llama.encode("Hello world", true).unwrap(),
        [128_000, 9906, 1917]
    );
    assert_eq!(llama.encode("Hello world", false).unwrap(), [9906, 1917]);
    assert_eq!(llama.id_to_token(200_000), None);

    let qwen = load("qwen2");
    assert_eq!(qwen.vocab_size(), 151_936);
    // Added tokens keep their ids although [PAD] fillers follow them.
    let ids = qwen
        .encode("<|im_start|>user\nHi<|im_end|>", false)
        .unwrap();
    assert_eq!(ids, [151_644, 872, 198, 13_048, 151_645]);
    assert_eq!(
        qwen.decode(&ids, false).unwrap(),
        "<|im_start|>user\nHi<|im_end|>"
    );
    assert_eq!(qwen.decode(&ids, true).unwrap(), "user\nHi");
    // A filler decodes but is never produced from text.
    assert_eq!(qwen.decode(&[151_700], false).unwrap(), "[PAD151700]");
    assert_ne!(qwen.encode("[PAD151700]", false).unwrap(), [151_700]);
}

#[test]
fn decode_rejects_ids_outside_the_vocabulary() {
    let err = load("gpt-2").decode(&[15_496, 50_257], false).unwrap_err();
    assert!(matches!(err, TextError::Tokenize(_)));
    assert!(err.to_string().contains("token id 50257"), "{err}");
}

#[test]
fn missing_or_broken_tokenizer_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let Err(err) = Tokenizer::from_dir(dir.path()) else {
        panic!("loaded a tokenizer from an empty directory");
    };
    assert!(matches!(err, TextError::Missing { .. }));
    assert!(
        err.to_string()
            .contains(&dir.path().join("tokenizer.json").display().to_string()),
        "{err}"
    );

    std::fs::write(dir.path().join("tokenizer.json"), "{\"model\": 3}").unwrap();
    let Err(err) = Tokenizer::from_dir(dir.path()) else {
        panic!("loaded a broken tokenizer.json");
    };
    assert!(matches!(err, TextError::TokenizerFile { .. }));
    assert!(
        err.to_string()
            .contains("tokenizer.json: cannot load tokenizer"),
        "{err}"
    );

    // A file in place of the directory is read as the tokenizer.json.
    let file = vocab_dir("gpt-2").join("tokenizer.json");
    let direct = Tokenizer::from_dir(&file).unwrap();
    assert_eq!(
        direct.encode("Hello world", false).unwrap(),
        load("gpt-2").encode("Hello world", false).unwrap()
    );
    let not_json = dir.path().join("notes.txt");
    std::fs::write(&not_json, "not a tokenizer").unwrap();
    let Err(err) = Tokenizer::from_dir(&not_json) else {
        panic!("loaded a tokenizer from a text file");
    };
    assert!(
        err.to_string().contains("notes.txt: cannot load tokenizer"),
        "{err}"
    );
}
