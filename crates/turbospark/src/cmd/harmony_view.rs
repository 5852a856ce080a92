//! Showing a Harmony (gpt-oss) reply as it streams: reasoning dimmed (or
//! hidden), the answer plain, tool calls on a line of their own; and keeping
//! the parts for `--json` and the chat history. It owns the terminal side of
//! Harmony only; parsing is `turbospark_text::harmony`'s.

use std::io::Write;

use serde::Serialize;
use turbospark_text::{HarmonyEvent, HarmonyStream};

const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";

#[derive(Clone, Debug, Serialize)]
pub struct ToolCall {
    pub name: String,
    pub arguments: String,
}

/// What was printed last, to separate reasoning from the answer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Last {
    Nothing,
    Reasoning,
    Answer,
}

pub struct HarmonyView {
    stream: HarmonyStream,
    show_reasoning: bool,
    /// ANSI dimming; only when stdout is a terminal.
    dim: bool,
    last: Last,
    pub reasoning: String,
    pub answer: String,
    pub tool_calls: Vec<ToolCall>,
}

impl HarmonyView {
    pub fn new(show_reasoning: bool, dim: bool) -> Self {
        HarmonyView {
            stream: HarmonyStream::new(),
            show_reasoning,
            dim,
            last: Last::Nothing,
            reasoning: String::new(),
            answer: String::new(),
            tool_calls: Vec::new(),
        }
    }

    /// Feeds generated text (special tokens kept) and prints what it means.
    /// Write errors (a closed pipe) are ignored, as for plain output.
    pub fn push(&mut self, piece: &str, out: &mut impl Write) {
        for event in self.stream.push(piece) {
            self.show(event, out);
        }
        let _ = out.flush();
    }

    pub fn finish(&mut self, out: &mut impl Write) {
        for event in self.stream.finish() {
            self.show(event, out);
        }
        let _ = out.flush();
    }

    fn show(&mut self, event: HarmonyEvent, out: &mut impl Write) {
        match event {
            HarmonyEvent::ReasoningDelta(text) => {
                self.reasoning.push_str(&text);
                if self.show_reasoning {
                    if self.last != Last::Reasoning {
                        self.separate(out);
                        if self.dim {
                            let _ = out.write_all(DIM.as_bytes());
                        }
                        self.last = Last::Reasoning;
                    }
                    let _ = out.write_all(text.as_bytes());
                }
            }
            HarmonyEvent::ContentDelta(text) => {
                self.answer.push_str(&text);
                if self.last != Last::Answer {
                    self.end_reasoning(out);
                    self.separate(out);
                    self.last = Last::Answer;
                }
                let _ = out.write_all(text.as_bytes());
            }
            HarmonyEvent::ToolCall { name, arguments } => {
                self.end_reasoning(out);
                self.separate(out);
                let _ = write!(out, "[tool call] {name} {arguments}");
                self.last = Last::Answer;
                self.tool_calls.push(ToolCall { name, arguments });
            }
            HarmonyEvent::Done => self.end_reasoning(out),
        }
    }

    /// Closes the dimmed span, so nothing after it (the prompt) stays dim.
    fn end_reasoning(&mut self, out: &mut impl Write) {
        if self.last == Last::Reasoning && self.dim {
            let _ = out.write_all(RESET.as_bytes());
        }
    }

    /// A blank line between parts.
    fn separate(&self, out: &mut impl Write) {
        if self.last != Last::Nothing {
            let _ = out.write_all(b"\n\n");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::HarmonyView;

    const REPLY: &str = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Answer.";

    /// The text printed for `REPLY`, streamed in pieces of 3 bytes.
    fn shown(show_reasoning: bool, dim: bool) -> (String, HarmonyView) {
        let mut view = HarmonyView::new(show_reasoning, dim);
        let mut out = Vec::new();
        for piece in REPLY.as_bytes().chunks(3) {
            view.push(std::str::from_utf8(piece).unwrap(), &mut out);
        }
        view.finish(&mut out);
        (String::from_utf8(out).unwrap(), view)
    }

    #[test]
    fn reasoning_is_dimmed_plain_or_hidden() {
        assert_eq!(shown(true, true).0, "\x1b[2mThink.\x1b[0m\n\nAnswer.");
        assert_eq!(shown(true, false).0, "Think.\n\nAnswer.");
        let (text, view) = shown(false, true);
        assert_eq!(text, "Answer.");
        assert_eq!(
            (view.reasoning.as_str(), view.answer.as_str()),
            ("Think.", "Answer.")
        );
    }

    #[test]
    fn tool_calls_are_printed_and_kept() {
        let mut view = HarmonyView::new(true, false);
        let mut out = Vec::new();
        view.push(
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Oslo\"}",
            &mut out,
        );
        view.finish(&mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "[tool call] get_weather {\"city\":\"Oslo\"}"
        );
        assert_eq!(view.tool_calls.len(), 1);
        assert_eq!(view.tool_calls[0].name, "get_weather");
        assert_eq!(view.answer, "");
    }
}
