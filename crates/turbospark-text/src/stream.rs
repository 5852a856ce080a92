//! [`StreamDecoder`]: turns generated token ids into printable text one token
//! at a time. It owns only the hold-back of incomplete text; it must not
//! decide when generation stops (that is [`crate::StopStrings`] and the
//! caller's EOS check).
//!
//! Decoding one token alone is wrong twice over: a byte-level token can be
//! half of a UTF-8 sequence (an emoji spans several tokens), and some
//! decoders change a token's text depending on what precedes it (SentencePiece
//! drops the leading space of the first token). So each step decodes a short
//! window that starts a few tokens back (`prefix_offset`), compares it with
//! the window's text before the new tokens (`read_offset`), and prints only
//! the difference, and only once it no longer ends in U+FFFD, the replacement
//! character a decoder emits for an incomplete sequence. This is the
//! technique of Hugging Face's text-generation-inference.

use crate::error::Result;
use crate::tokenizer::Tokenizer;

const REPLACEMENT: char = '\u{FFFD}';

pub struct StreamDecoder {
    skip_special: bool,
    /// Tokens from `prefix_offset` on; older ones are dropped as they stop
    /// mattering, so memory does not grow with the length of the answer.
    ids: Vec<u32>,
    /// Start of the context window within `ids`.
    prefix_offset: usize,
    /// End of the text already printed within `ids`.
    read_offset: usize,
}

impl StreamDecoder {
    /// `skip_special` as in [`Tokenizer::decode`].
    pub fn new(skip_special: bool) -> Self {
        StreamDecoder {
            skip_special,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
        }
    }

    /// Adds one generated token; returns the text that is now safe to print
    /// (possibly empty while a multi-token character is incomplete).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        self.ids.push(id);
        let printed = tok.decode(
            &self.ids[self.prefix_offset..self.read_offset],
            self.skip_special,
        )?;
        let text = tok.decode(&self.ids[self.prefix_offset..], self.skip_special)?;
        if text.len() <= printed.len() || text.ends_with(REPLACEMENT) {
            return Ok(String::new());
        }
        let new = suffix_after(&printed, &text).to_string();
        self.ids.drain(..self.read_offset);
        self.prefix_offset = 0;
        self.read_offset = self.ids.len();
        Ok(new)
    }

    /// Text still held back at the end of generation (an incomplete
    /// sequence decodes to U+FFFD here, as it does in a full decode).
    pub fn finish(&mut self, tok: &Tokenizer) -> Result<String> {
        let printed = tok.decode(
            &self.ids[self.prefix_offset..self.read_offset],
            self.skip_special,
        )?;
        let text = tok.decode(&self.ids[self.prefix_offset..], self.skip_special)?;
        let rest = suffix_after(&printed, &text).to_string();
        *self = StreamDecoder::new(self.skip_special);
        Ok(rest)
    }
}

/// The part of `text` after what was already printed. For every decoder we
/// know `printed` is a prefix of `text`; should one ever rewrite earlier
/// text, printing from the first difference loses the least.
fn suffix_after<'a>(printed: &str, text: &'a str) -> &'a str {
    let common = printed
        .char_indices()
        .zip(text.chars())
        .find(|((_, a), b)| a != b)
        .map_or(printed.len().min(text.len()), |((i, _), _)| i);
    // `common` is a char boundary of `printed`, and both strings agree up to
    // it, so it is one of `text` as well.
    &text[common..]
}
