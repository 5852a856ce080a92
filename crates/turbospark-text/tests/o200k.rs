//! The o200k_harmony fallback tokenizer: picked for gpt-oss directories
//! without tokenizer.json, and equal to gpt-oss' released tokenizer.

use std::path::Path;
use std::sync::OnceLock;

use turbospark_text::{TextError, Tokenizer};

/// Building the tables takes a moment; every test shares one.
fn harmony() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| Tokenizer::o200k_harmony().unwrap())
}

fn dir_with_config(model_type: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let config = format!("{{\"model_type\": \"{model_type}\", \"vocab_size\": 201088}}");
    std::fs::write(dir.path().join("config.json"), config).unwrap();
    dir
}

/// Ids that Hugging Face `tokenizers` gives with gpt-oss-20b's released
/// tokenizer.json, as published in a public validation suite; the first
/// two also match tiktoken's documented o200k_base examples ("Hello world"
/// is [13225, 2375]).
const RELEASED: [(&str, &[u32]); 6] = [
    ("Hello world", &[13225, 2375]),
    ("The capital of France is", &[976, 9029, 328, 10128, 382]),
    (
        "  leading spaces\n\nand newlines\t tabs",
        &[220, 8117, 18608, 279, 427, 620, 10105, 197, 38191],
    ),
    (
        "naïve café — résumé 日本語テキスト 🚀",
        &[
            1503, 9954, 737, 30469, 2733, 140184, 17428, 40909, 16056, 18368, 38236, 169883, 222,
        ],
    ),
    (
        "<|start|>user<|message|>Hi<|end|>",
        &[200006, 1428, 200008, 12194, 200007],
    ),
    (
        "def f(x):\n    return x**2  # square\n",
        &[
            1314, 285, 4061, 1883, 271, 622, 1215, 410, 17, 220, 1069, 13749, 198,
        ],
    ),
];

#[test]
fn encodes_as_the_released_gpt_oss_tokenizer() {
    let tok = harmony();
    for (text, want) in RELEASED {
        assert_eq!(tok.encode(text, true).unwrap(), want, "{text:?}");
        assert_eq!(tok.decode(want, false).unwrap(), text, "{text:?}");
    }
    assert_eq!(tok.vocab_size(), 201_088);
}

#[test]
fn harmony_special_tokens_have_their_ids_in_text_and_by_name() {
    let tok = harmony();
    let table = [
        ("<|startoftext|>", 199_998),
        ("<|endoftext|>", 199_999),
        ("<|reserved_200000|>", 200_000),
        ("<|return|>", 200_002),
        ("<|constrain|>", 200_003),
        ("<|channel|>", 200_005),
        ("<|start|>", 200_006),
        ("<|end|>", 200_007),
        ("<|message|>", 200_008),
        ("<|reserved_200011|>", 200_011),
        ("<|call|>", 200_012),
        ("<|reserved_200013|>", 200_013),
        // o200k_base's own, kept by the reference definition.
        ("<|endofprompt|>", 200_018),
        ("<|reserved_201087|>", 201_087),
    ];
    for (text, id) in table {
        assert_eq!(tok.token_id(text), Some(id), "{text}");
        assert_eq!(tok.id_to_token(id).as_deref(), Some(text), "{id}");
        assert_eq!(tok.encode(text, false).unwrap(), [id], "{text}");
    }
    // Names that are not tokens stay text.
    assert_eq!(tok.token_id("<|reserved_200018|>"), None);
    assert_eq!(tok.token_id("<|reserved_201088|>"), None);
    assert!(tok.encode("<|reserved_201088|>", false).unwrap().len() > 1);
}

#[test]
fn special_tokens_split_text_wherever_they_stand() {
    let tok = harmony();
    let text = "a<|<|start|>b<|end|><|nope|>|>";
    let ids = tok.encode(text, false).unwrap();
    let start = ids.iter().position(|&id| id == 200_006).unwrap();
    let end = ids.iter().position(|&id| id == 200_007).unwrap();
    assert_eq!(tok.decode(&ids[..start], false).unwrap(), "a<|");
    assert_eq!(tok.decode(&ids[start + 1..end], false).unwrap(), "b");
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    assert!(
        ids.iter().filter(|&&id| id >= 199_998).count() == 2,
        "{ids:?}"
    );
}

#[test]
fn decode_skips_specials_on_request_and_rejects_unknown_ids() {
    let tok = harmony();
    let ids = tok
        .encode("<|start|>user<|message|>Hi<|end|>", false)
        .unwrap();
    assert_eq!(tok.decode(&ids, true).unwrap(), "userHi");
    // Half of a multi-byte character decodes to U+FFFD, as in tokenizers.
    let rocket = tok.encode("🚀", false).unwrap();
    assert!(rocket.len() > 1, "{rocket:?}");
    assert!(
        tok.decode(&rocket[..1], false)
            .unwrap()
            .ends_with('\u{FFFD}')
    );
    let err = tok
        .decode(&[13225, 201_088], false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("201088") && err.contains("outside the vocabulary"),
        "{err}"
    );
    assert_eq!(tok.id_to_token(201_088), None);
}

#[test]
fn ordinary_tokens_are_named_in_byte_level_spelling() {
    let tok = harmony();
    assert_eq!(tok.id_to_token(13225).as_deref(), Some("Hello"));
    assert_eq!(tok.id_to_token(2375).as_deref(), Some("Ġworld"));
    assert_eq!(tok.id_to_token(198).as_deref(), Some("Ċ"));
    assert_eq!(tok.token_id("Ġworld"), Some(2375));
    assert_eq!(tok.token_id("Ċ"), Some(198));
    assert_eq!(tok.token_id("no such token at all"), None);
}

#[test]
fn from_dir_falls_back_to_o200k_harmony_only_for_gpt_oss() {
    let oss = dir_with_config("gpt_oss");
    let tok = Tokenizer::from_dir(oss.path()).unwrap();
    assert_eq!(tok.encode("Hello world", false).unwrap(), [13225, 2375]);
    assert!(Tokenizer::find(oss.path()).unwrap().is_some());

    let llama = dir_with_config("llama");
    assert!(Tokenizer::find(llama.path()).unwrap().is_none());
    match Tokenizer::from_dir(llama.path()) {
        Err(TextError::Missing { path }) => assert!(path.ends_with("tokenizer.json")),
        Err(other) => panic!("wrong error: {other}"),
        Ok(_) => panic!("a llama directory without tokenizer.json got a tokenizer"),
    }
    let empty = tempfile::tempdir().unwrap();
    assert!(Tokenizer::find(empty.path()).unwrap().is_none());
}

#[test]
fn tokenizer_json_wins_over_the_fallback() {
    let dir = dir_with_config("gpt_oss");
    let gpt2 = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/vocab/gpt-2/tokenizer.json");
    std::fs::copy(gpt2, dir.path().join("tokenizer.json")).unwrap();
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tok.vocab_size(), 50_257);
}
