//! Streaming detokenization and stop strings, on real byte-level
//! vocabularies where one emoji or CJK character spans several tokens.

use std::path::Path;

use turbospark_text::{StopStrings, StreamDecoder, Tokenizer};

const TEXT: &str = "Hello 🌍! 你好世界 👨‍👩‍👧 café — naïve 😀😀 end";

fn load(name: &str) -> Tokenizer {
    Tokenizer::from_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/vocab")
            .join(name),
    )
    .unwrap()
}

/// Streams `ids` one at a time; returns the chunks, `finish()` last.
fn stream(tok: &Tokenizer, ids: &[u32], skip_special: bool) -> Vec<String> {
    let mut dec = StreamDecoder::new(skip_special);
    let mut chunks: Vec<String> = ids.iter().map(|&id| dec.push(tok, id).unwrap()).collect();
    chunks.push(dec.finish(tok).unwrap());
    chunks
}

#[test]
fn streamed_text_equals_full_decode_without_broken_characters() {
    for name in ["gpt-2", "llama-bpe", "qwen2"] {
        let tok = load(name);
        let ids = tok.encode(TEXT, false).unwrap();
        // The test only means something if single tokens are partial UTF-8.
        let partial = ids
            .iter()
            .filter(|&&id| tok.decode(&[id], false).unwrap().contains('\u{FFFD}'))
            .count();
        assert!(partial >= 4, "{name}: only {partial} partial tokens");

        let chunks = stream(&tok, &ids, false);
        for chunk in &chunks {
            assert!(!chunk.contains('\u{FFFD}'), "{name}: chunk {chunk:?}");
        }
        assert_eq!(chunks.concat(), TEXT, "{name}");
        assert_eq!(chunks.concat(), tok.decode(&ids, false).unwrap());
        // Text is released as soon as it is complete, not all at the end.
        assert_eq!(chunks[0], "Hello", "{name}");
        assert!(
            chunks.last().unwrap().is_empty(),
            "{name}: finish had {:?}",
            chunks.last()
        );
    }
}

#[test]
fn special_tokens_are_skipped_or_kept() {
    let tok = load("qwen2");
    let ids = tok
        .encode("<|im_start|>assistant\n你好<|im_end|>", false)
        .unwrap();
    assert_eq!(stream(&tok, &ids, true).concat(), "assistant\n你好");
    assert_eq!(
        stream(&tok, &ids, false).concat(),
        "<|im_start|>assistant\n你好<|im_end|>"
    );
}

#[test]
fn finish_flushes_an_incomplete_character() {
    let tok = load("llama-bpe");
    let ids = tok.encode("ok 🌍", false).unwrap();
    let cut = &ids[..ids.len() - 1]; // the globe's last byte is missing
    let mut dec = StreamDecoder::new(false);
    let printed: String = cut.iter().map(|&id| dec.push(&tok, id).unwrap()).collect();
    assert_eq!(printed, "ok");
    let rest = dec.finish(&tok).unwrap();
    assert_eq!(format!("{printed}{rest}"), tok.decode(cut, false).unwrap());
    assert!(
        rest.starts_with(' ') && rest.ends_with('\u{FFFD}'),
        "{rest:?}"
    );
    // finish() resets: the decoder can be used for the next answer.
    assert_eq!(dec.push(&tok, ids[0]).unwrap(), "ok");
}

#[test]
fn stop_string_split_across_chunks() {
    let mut stop = StopStrings::new(vec!["<|user|>".into(), "\n\n###".into()]);
    assert_eq!(stop.push("Hello <|"), ("Hello ".to_string(), false));
    assert_eq!(stop.push("us"), (String::new(), false));
    assert_eq!(stop.push("er|> more"), (String::new(), true));
    assert_eq!(stop.push("anything"), (String::new(), true));
}

#[test]
fn held_text_is_released_when_it_is_not_a_stop_string() {
    let mut stop = StopStrings::new(vec!["STOP".into()]);
    assert_eq!(stop.push("a ST"), ("a ".to_string(), false));
    assert_eq!(stop.push("OR"), ("STOR".to_string(), false));
    assert_eq!(stop.push("y S"), ("y ".to_string(), false));
    assert_eq!(stop.flush(), "S");
    assert_eq!(stop.flush(), "");
}

#[test]
fn earliest_stop_string_wins_and_multibyte_text_is_safe() {
    let mut stop = StopStrings::new(vec!["世界".into(), "你".into(), String::new()]);
    assert_eq!(stop.push("héllo 世"), ("héllo ".to_string(), false));
    assert_eq!(stop.push("x 你好世界"), ("世x ".to_string(), true));

    let mut stop = StopStrings::new(vec!["bc".into(), "abcd".into()]);
    // "abcd" starts first, though "bc" is the shorter match.
    assert_eq!(stop.push("xabcd"), ("x".to_string(), true));
}

#[test]
fn no_stop_strings_passes_everything_through() {
    let mut stop = StopStrings::new(Vec::new());
    assert_eq!(stop.push("abc"), ("abc".to_string(), false));
    assert_eq!(stop.flush(), "");
}
