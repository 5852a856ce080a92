//! [`O200kHarmony`]: gpt-oss's tokenizer, o200k_harmony, for model
//! directories that ship no tokenizer.json. It owns the special-token table
//! and the split of text at special tokens; the byte-pair merges are
//! o200k_base's, bundled in the `tiktoken-rs` crate (no download). It must
//! not know about chat formats.
//!
//! The special tokens follow the reference definition in openai/gpt-oss
//! (`gpt_oss/tokenizer.py`): o200k_base's own specials (`<|endoftext|>`
//! 199999, `<|endofprompt|>` 200018), then `<|startoftext|>` 199998,
//! `<|return|>` 200002, `<|constrain|>` 200003, `<|channel|>` 200005,
//! `<|start|>` 200006, `<|end|>` 200007, `<|message|>` 200008, `<|call|>`
//! 200012, and `<|reserved_N|>` for every other id up to 201087 that is not
//! taken. (tiktoken-rs' own `o200k_harmony()` names 200018
//! `<|reserved_200018|>` instead, which is why the table is built here.)

use std::collections::HashMap;
use std::sync::OnceLock;

use tiktoken_rs::CoreBPE;

use crate::error::{Result, TextError};

/// The first special id; every id below it is a byte-pair rank.
const FIRST_SPECIAL: u32 = 199_998;
/// Ids run from 0 to `VOCAB_SIZE - 1` (gpt-oss' embedding has this many rows).
const VOCAB_SIZE: u32 = 201_088;

/// Named special tokens; every other id from `FIRST_SPECIAL` on is reserved.
const NAMED: [(&str, u32); 10] = [
    ("<|startoftext|>", 199_998),
    ("<|endoftext|>", 199_999),
    ("<|return|>", 200_002),
    ("<|constrain|>", 200_003),
    ("<|channel|>", 200_005),
    ("<|start|>", 200_006),
    ("<|end|>", 200_007),
    ("<|message|>", 200_008),
    ("<|call|>", 200_012),
    ("<|endofprompt|>", 200_018),
];

pub(crate) struct O200kHarmony {
    /// o200k_base: the merges and the pre-tokenizer pattern. Its own special
    /// tokens are never matched, because text reaches it already split.
    bpe: CoreBPE,
    /// Text of each special id, indexed by `id - FIRST_SPECIAL`.
    special_text: Vec<String>,
    special_id: HashMap<String, u32>,
    /// Length in bytes of the longest special token, which bounds the search
    /// for a closing `|>`.
    longest_special: usize,
    /// Bytes to rank, built on the first lookup of an ordinary token by name
    /// (only `token_id` needs it; `CoreBPE` keeps its own map private).
    ranks: OnceLock<HashMap<Vec<u8>, u32>>,
}

impl O200kHarmony {
    pub(crate) fn new() -> Result<Self> {
        let bpe = tiktoken_rs::o200k_base()
            .map_err(|e| TextError::Tokenize(format!("cannot build o200k_base: {e}")))?;
        let named: HashMap<u32, &str> = NAMED.iter().map(|&(t, id)| (id, t)).collect();
        let special_text: Vec<String> = (FIRST_SPECIAL..VOCAB_SIZE)
            .map(|id| match named.get(&id) {
                Some(text) => (*text).to_string(),
                None => format!("<|reserved_{id}|>"),
            })
            .collect();
        let special_id = special_text
            .iter()
            .zip(FIRST_SPECIAL..)
            .map(|(text, id)| (text.clone(), id))
            .collect();
        let longest_special = special_text.iter().map(String::len).max().unwrap_or(0);
        Ok(O200kHarmony {
            bpe,
            special_text,
            special_id,
            longest_special,
            ranks: OnceLock::new(),
        })
    }

    /// Special tokens anywhere in `text` become their ids, as in Hugging
    /// Face tokenizers (and unlike tiktoken's default, which refuses them):
    /// a rendered chat prompt is full of them.
    pub(crate) fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        let mut plain_from = 0;
        let mut at = 0;
        while let Some(found) = text[at..].find("<|") {
            let open = at + found;
            match self.special_at(&text[open..]) {
                Some((id, len)) => {
                    self.encode_plain(&text[plain_from..open], &mut ids)?;
                    ids.push(id);
                    at = open + len;
                    plain_from = at;
                }
                // `<` is one byte, so `open + 1` is a char boundary.
                None => at = open + 1,
            }
        }
        self.encode_plain(&text[plain_from..], &mut ids)?;
        Ok(ids)
    }

    /// The special token at the start of `text`, if any: its id and length.
    fn special_at(&self, text: &str) -> Option<(u32, usize)> {
        // Every special token is `<|...|>` with no `|>` inside, so the first
        // `|>` closes the only candidate.
        let window = &text.as_bytes()[..text.len().min(self.longest_special)];
        let close = window.windows(2).skip(2).position(|w| w == b"|>")? + 2;
        let candidate = &text[..close + 2];
        self.special_id.get(candidate).map(|&id| (id, close + 2))
    }

    fn encode_plain(&self, text: &str, ids: &mut Vec<u32>) -> Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        // With no special token allowed, `encode` is o200k's plain BPE; it
        // reports a regex failure as an error where `encode_ordinary` panics.
        let (plain, _) = self
            .bpe
            .encode(text, &Default::default())
            .map_err(|e| TextError::Tokenize(format!("encoding failed: {e}")))?;
        ids.extend(plain);
        Ok(())
    }

    /// Invalid UTF-8 (a character cut between tokens) decodes to U+FFFD, as
    /// Hugging Face's byte-level decoder does; the stream decoder relies on it.
    pub(crate) fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        let mut bytes = Vec::new();
        for &id in ids {
            if id >= VOCAB_SIZE {
                return Err(TextError::Tokenize(format!(
                    "token id {id} is outside the vocabulary ({VOCAB_SIZE} tokens)"
                )));
            }
            if id >= FIRST_SPECIAL {
                if !skip_special {
                    bytes.extend_from_slice(self.special(id).as_bytes());
                }
                continue;
            }
            let piece = self
                .bpe
                .decode_bytes(&[id])
                .map_err(|e| TextError::Tokenize(format!("decoding failed: {e}")))?;
            bytes.extend_from_slice(&piece);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    pub(crate) fn vocab_size(&self) -> usize {
        VOCAB_SIZE as usize
    }

    /// Ordinary tokens are named in GPT-2's byte-to-character spelling
    /// (`Ġworld`), as in gpt-oss' tokenizer.json.
    pub(crate) fn token_id(&self, token: &str) -> Option<u32> {
        if let Some(&id) = self.special_id.get(token) {
            return Some(id);
        }
        let bytes = byte_level::to_bytes(token)?;
        self.ranks().get(&bytes).copied()
    }

    pub(crate) fn id_to_token(&self, id: u32) -> Option<String> {
        if id >= VOCAB_SIZE {
            return None;
        }
        if id >= FIRST_SPECIAL {
            return Some(self.special(id).to_string());
        }
        let bytes = self.bpe.decode_bytes(&[id]).ok()?;
        Some(byte_level::to_text(&bytes))
    }

    /// Text of a special id; callers check `FIRST_SPECIAL <= id < VOCAB_SIZE`.
    fn special(&self, id: u32) -> &str {
        &self.special_text[(id - FIRST_SPECIAL) as usize]
    }

    fn ranks(&self) -> &HashMap<Vec<u8>, u32> {
        self.ranks.get_or_init(|| {
            (0..FIRST_SPECIAL)
                .filter_map(|id| Some((self.bpe.decode_bytes(&[id]).ok()?, id)))
                .collect()
        })
    }
}

/// GPT-2's reversible mapping of bytes to printable characters, which names
/// byte-level tokens in tokenizer.json files: printable Latin-1 bytes stand
/// for themselves, the others (space, control bytes, ...) for U+0100 on.
mod byte_level {
    /// The character standing for each byte.
    fn table() -> [char; 256] {
        let mut table = ['\0'; 256];
        let mut next_stand_in = 0x100;
        for b in 0..=255u8 {
            table[usize::from(b)] = if matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF) {
                char::from(b)
            } else {
                // Below U+0200, so always a valid char.
                let c = char::from_u32(next_stand_in).unwrap_or(char::REPLACEMENT_CHARACTER);
                next_stand_in += 1;
                c
            };
        }
        table
    }

    pub(super) fn to_text(bytes: &[u8]) -> String {
        let table = table();
        bytes.iter().map(|&b| table[usize::from(b)]).collect()
    }

    /// `None` when a character is not one of the 256 byte stand-ins.
    pub(super) fn to_bytes(text: &str) -> Option<Vec<u8>> {
        let table = table();
        text.chars()
            .map(|c| table.iter().position(|&t| t == c).map(|b| b as u8))
            .collect()
    }
}
