//! gpt-oss' Harmony output format: turns generated text (or token ids) into
//! reasoning, the answer and tool calls. It owns reading Harmony's message
//! structure; it must not render prompts (the chat template does that),
//! decide when generation stops (the caller's EOS check, fed by
//! [`harmony_stop_ids`]) or present anything to a user.
//!
//! A message is `<|start|>{header}<|message|>{content}` ended by `<|end|>`,
//! `<|return|>` (the answer is complete) or `<|call|>` (a tool call). The
//! header holds the role, then `<|channel|>` and the channel, and in any
//! place a recipient `to=functions.NAME` and a content type (`json` or
//! `<|constrain|>json`):
//!
//! ```text
//! <|start|>assistant<|channel|>analysis<|message|>Let me think.<|end|>
//! <|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>
//! <|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}<|call|>
//! <|start|>assistant<|channel|>final<|message|>The answer.<|return|>
//! ```
//!
//! Generation starts after the prompt's trailing `<|start|>assistant`, so
//! the first message's header has no role; it is the assistant's. The
//! analysis channel (and commentary without a recipient, a preamble) is
//! reasoning; the final channel, or no channel at all, is the answer; a
//! message from the assistant to a recipient is a tool call.

use serde::Serialize;

use crate::error::Result;
use crate::stream::StreamDecoder;
use crate::tokenizer::Tokenizer;

/// One parsed message. `role` is "assistant" when the header names none.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HarmonyMessage {
    pub role: String,
    pub channel: Option<String>,
    /// Whom the message is for, e.g. `functions.get_weather`.
    pub recipient: Option<String>,
    /// e.g. `json`, from `<|constrain|>json` or a bare word after the channel.
    pub content_type: Option<String>,
    pub content: String,
}

/// What a stream of generated text means, as it arrives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HarmonyEvent {
    ReasoningDelta(String),
    ContentDelta(String),
    /// A complete call. `name` drops the `functions.` namespace; other
    /// recipients (`browser.search`) keep theirs. `arguments` is the text the
    /// model wrote, normally JSON.
    ToolCall {
        name: String,
        arguments: String,
    },
    /// The model ended its turn (`<|return|>`, `<|call|>`, `<|endoftext|>`)
    /// or the input ended. Always the last event.
    Done,
}

/// Ids that end a Harmony turn: `<|return|>`, `<|call|>` and `<|endoftext|>`,
/// those of them that `tok` has.
pub fn harmony_stop_ids(tok: &Tokenizer) -> Vec<u32> {
    [Marker::Return, Marker::Call, Marker::EndOfText]
        .iter()
        .filter_map(|m| tok.token_id(m.text()))
        .collect()
}

/// Every message in `text`, which may be a whole rendered conversation or
/// one generated turn. Stop tokens end a message but not the parse; an
/// unterminated last message is kept.
pub fn parse(text: &str) -> Vec<HarmonyMessage> {
    let mut parser = Parser::default();
    let mut steps = parser.push_text(text);
    steps.extend(parser.finish());
    steps
        .into_iter()
        .filter_map(|step| match step {
            Step::End(message, _) => Some(message),
            _ => None,
        })
        .collect()
}

/// Harmony's special tokens, as they appear in decoded text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Marker {
    Start,
    Channel,
    Message,
    Constrain,
    End,
    Return,
    Call,
    EndOfText,
}

impl Marker {
    const ALL: [Marker; 8] = [
        Marker::Start,
        Marker::Channel,
        Marker::Message,
        Marker::Constrain,
        Marker::End,
        Marker::Return,
        Marker::Call,
        Marker::EndOfText,
    ];

    fn text(self) -> &'static str {
        match self {
            Marker::Start => "<|start|>",
            Marker::Channel => "<|channel|>",
            Marker::Message => "<|message|>",
            Marker::Constrain => "<|constrain|>",
            Marker::End => "<|end|>",
            Marker::Return => "<|return|>",
            Marker::Call => "<|call|>",
            Marker::EndOfText => "<|endoftext|>",
        }
    }

    /// Ends the model's turn, not just a message.
    fn stops(self) -> bool {
        matches!(self, Marker::Return | Marker::Call | Marker::EndOfText)
    }
}

/// What the parser saw, in order.
#[derive(Debug)]
enum Step {
    /// A header was read; the message (content still empty) begins.
    Begin(HarmonyMessage),
    /// Content of the current message.
    Text(String),
    /// The message ended: by this marker, or (`None`) cut off by a new
    /// `<|start|>` or the end of input.
    End(HarmonyMessage, Option<Marker>),
    /// A stop marker outside any message.
    Stop,
}

/// Headers are a few words; this much text without `<|message|>` means the
/// model is not writing Harmony, and the text is shown as the answer rather
/// than held back forever.
const MAX_HEADER: usize = 512;

/// The message structure, fed literal text and markers.
#[derive(Default)]
struct Parser {
    /// Header text read so far (markers in it kept as text).
    header: String,
    /// The message whose content is being read; `None` while in a header.
    current: Option<HarmonyMessage>,
    /// Whether any `<|message|>` was seen (then text outside a message is
    /// stray, not an answer from a model that ignores the format).
    seen_message: bool,
    /// The end of text given to [`Parser::push_text`] that may be the start
    /// of a marker split across pieces (`<|chan`).
    pending: String,
}

impl Parser {
    /// Text in which markers appear as text, in pieces of any size.
    fn push_text(&mut self, piece: &str) -> Vec<Step> {
        let mut steps = Vec::new();
        let text = std::mem::take(&mut self.pending) + piece;
        let mut rest = text.as_str();
        while let Some(open) = rest.find("<|") {
            let after = &rest[open..];
            if let Some(marker) = Marker::ALL
                .into_iter()
                .find(|m| after.starts_with(m.text()))
            {
                self.literal(&rest[..open], &mut steps);
                self.marker(marker, &mut steps);
                rest = &after[marker.text().len()..];
            } else if Marker::ALL.iter().any(|m| m.text().starts_with(after)) {
                self.literal(&rest[..open], &mut steps);
                self.pending = after.to_string();
                return steps;
            } else {
                // `<|` is ASCII, so `open + 2` is a char boundary.
                self.literal(&rest[..open + 2], &mut steps);
                rest = &rest[open + 2..];
            }
        }
        // A lone `<` at the end may be the start of a marker.
        let keep = usize::from(rest.ends_with('<'));
        self.literal(&rest[..rest.len() - keep], &mut steps);
        self.pending = rest[rest.len() - keep..].to_string();
        steps
    }

    fn literal(&mut self, text: &str, steps: &mut Vec<Step>) {
        if text.is_empty() {
            return;
        }
        match &mut self.current {
            Some(message) => {
                message.content.push_str(text);
                steps.push(Step::Text(text.to_string()));
            }
            None => {
                self.header.push_str(text);
                if self.header.len() > MAX_HEADER {
                    self.header_as_answer(steps);
                }
            }
        }
    }

    fn marker(&mut self, marker: Marker, steps: &mut Vec<Step>) {
        if self.current.is_some() {
            match marker {
                Marker::End | Marker::Return | Marker::Call | Marker::EndOfText => {
                    self.close(Some(marker), steps);
                }
                Marker::Start => {
                    self.close(None, steps);
                }
                // Header syntax inside content is just text.
                Marker::Channel | Marker::Message | Marker::Constrain => {
                    self.literal(marker.text(), steps);
                }
            }
            return;
        }
        match marker {
            Marker::Start => self.header.clear(),
            Marker::Channel | Marker::Constrain => self.header.push_str(marker.text()),
            Marker::Message => {
                let message = parse_header(&std::mem::take(&mut self.header));
                self.seen_message = true;
                steps.push(Step::Begin(message.clone()));
                self.current = Some(message);
            }
            Marker::End => self.header.clear(),
            Marker::Return | Marker::Call | Marker::EndOfText => {
                self.header.clear();
                steps.push(Step::Stop);
            }
        }
    }

    fn close(&mut self, by: Option<Marker>, steps: &mut Vec<Step>) {
        if let Some(message) = self.current.take() {
            steps.push(Step::End(message, by));
        }
    }

    /// Makes the header text the content of an answer with no channel.
    fn header_as_answer(&mut self, steps: &mut Vec<Step>) {
        let text = std::mem::take(&mut self.header);
        let message = HarmonyMessage {
            role: "assistant".into(),
            ..HarmonyMessage::default()
        };
        steps.push(Step::Begin(message.clone()));
        self.current = Some(message);
        self.seen_message = true;
        self.literal(&text, steps);
    }

    /// End of input: a held-back partial marker is text after all; an open
    /// message is closed. Header text is dropped, unless the model never
    /// wrote Harmony at all (no message and no channel), when it is the
    /// answer.
    fn finish(&mut self) -> Vec<Step> {
        let mut steps = Vec::new();
        let pending = std::mem::take(&mut self.pending);
        self.literal(&pending, &mut steps);
        if self.current.is_none()
            && !self.seen_message
            && !self.header.contains(Marker::Channel.text())
            && !self.header.trim().is_empty()
        {
            self.header_as_answer(&mut steps);
        }
        self.header.clear();
        self.close(None, &mut steps);
        steps
    }
}

/// Reads `assistant to=functions.f<|channel|>commentary <|constrain|>json`
/// and its variants: the first plain word before `<|channel|>` is the role,
/// the first after it the channel; `to=` words are the recipient,
/// `<|constrain|>` words and any other plain word the content type.
fn parse_header(header: &str) -> HarmonyMessage {
    let constrain = Marker::Constrain.text();
    let spaced = header.replace(constrain, &format!(" {constrain}"));
    let (role_part, channel_part) = match spaced.split_once(Marker::Channel.text()) {
        Some((role, channel)) => (role, Some(channel)),
        None => (spaced.as_str(), None),
    };
    let mut message = HarmonyMessage::default();
    let mut read = |part: &str, first: &mut String| {
        for word in part.split_whitespace() {
            if let Some(recipient) = word.strip_prefix("to=") {
                message.recipient = Some(recipient.to_string());
            } else if let Some(kind) = word.strip_prefix(constrain) {
                message.content_type = Some(kind.to_string());
            } else if first.is_empty() {
                *first = word.to_string();
            } else {
                message.content_type = Some(word.to_string());
            }
        }
    };
    let mut role = String::new();
    let mut channel = String::new();
    read(role_part, &mut role);
    if let Some(part) = channel_part {
        read(part, &mut channel);
    }
    message.role = if role.is_empty() {
        "assistant".into()
    } else {
        role
    };
    message.channel = (!channel.is_empty()).then_some(channel);
    message
}

/// How a message's content is reported.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    Reasoning,
    Content,
    Tool,
}

fn kind_of(message: &HarmonyMessage) -> Kind {
    if message.role == "assistant" && message.recipient.is_some() {
        return Kind::Tool;
    }
    match message.channel.as_deref() {
        Some("analysis" | "commentary") => Kind::Reasoning,
        _ => Kind::Content,
    }
}

/// Streaming parser over decoded text in which special tokens appear as
/// text (as a decoder that keeps special tokens produces it). Pieces may
/// split a marker anywhere.
#[derive(Default)]
pub struct HarmonyStream {
    parser: Parser,
    kind: Option<Kind>,
    done: bool,
}

impl HarmonyStream {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds generated text; returns what it completes. Nothing after `Done`.
    pub fn push(&mut self, piece: &str) -> Vec<HarmonyEvent> {
        if self.done {
            return Vec::new();
        }
        let steps = self.parser.push_text(piece);
        self.events(steps)
    }

    /// The end of generation: closes an open message (a tool call cut off by
    /// the stop token is complete) and reports `Done` if not yet reported.
    pub fn finish(&mut self) -> Vec<HarmonyEvent> {
        if self.done {
            return Vec::new();
        }
        let steps = self.parser.finish();
        let mut events = self.events(steps);
        if !self.done {
            self.done = true;
            events.push(HarmonyEvent::Done);
        }
        events
    }

    fn push_literal(&mut self, text: &str) -> Vec<HarmonyEvent> {
        if self.done {
            return Vec::new();
        }
        let mut steps = Vec::new();
        self.parser.literal(text, &mut steps);
        self.events(steps)
    }

    fn push_marker(&mut self, marker: Marker) -> Vec<HarmonyEvent> {
        if self.done {
            return Vec::new();
        }
        let mut steps = Vec::new();
        self.parser.marker(marker, &mut steps);
        self.events(steps)
    }

    fn events(&mut self, steps: Vec<Step>) -> Vec<HarmonyEvent> {
        let mut events = Vec::new();
        for step in steps {
            if self.done {
                break;
            }
            match step {
                Step::Begin(message) => self.kind = Some(kind_of(&message)),
                Step::Text(text) => match self.kind {
                    Some(Kind::Reasoning) => events.push(HarmonyEvent::ReasoningDelta(text)),
                    Some(Kind::Content) => events.push(HarmonyEvent::ContentDelta(text)),
                    // Arguments are reported whole, at the end of the call.
                    Some(Kind::Tool) | None => {}
                },
                Step::End(message, by) => {
                    if self.kind.take() == Some(Kind::Tool) {
                        let recipient = message.recipient.unwrap_or_default();
                        let name = recipient.strip_prefix("functions.").unwrap_or(&recipient);
                        events.push(HarmonyEvent::ToolCall {
                            name: name.to_string(),
                            arguments: message.content,
                        });
                    }
                    if by.is_some_and(Marker::stops) {
                        self.done = true;
                        events.push(HarmonyEvent::Done);
                    }
                }
                Step::Stop => {
                    self.done = true;
                    events.push(HarmonyEvent::Done);
                }
            }
        }
        events
    }
}

/// Streaming parser over generated token ids. Only Harmony's special ids
/// act as markers: text the model spells out of ordinary tokens (`<|end|>`
/// in a code sample) stays text.
pub struct HarmonyTokenStream<'t> {
    tok: &'t Tokenizer,
    markers: Vec<(u32, Marker)>,
    decoder: StreamDecoder,
    stream: HarmonyStream,
}

impl<'t> HarmonyTokenStream<'t> {
    pub fn new(tok: &'t Tokenizer) -> Self {
        let markers = Marker::ALL
            .into_iter()
            .filter_map(|m| Some((tok.token_id(m.text())?, m)))
            .collect();
        HarmonyTokenStream {
            tok,
            markers,
            // Other special tokens (reserved ones) stay visible as text.
            decoder: StreamDecoder::new(false),
            stream: HarmonyStream::new(),
        }
    }

    pub fn push(&mut self, id: u32) -> Result<Vec<HarmonyEvent>> {
        let Some(&(_, marker)) = self.markers.iter().find(|(m, _)| *m == id) else {
            let text = self.decoder.push(self.tok, id)?;
            return Ok(self.stream.push_literal(&text));
        };
        // Text before the marker is complete now, whatever it ends with.
        let text = self.decoder.finish(self.tok)?;
        let mut events = self.stream.push_literal(&text);
        events.extend(self.stream.push_marker(marker));
        Ok(events)
    }

    pub fn finish(&mut self) -> Result<Vec<HarmonyEvent>> {
        let text = self.decoder.finish(self.tok)?;
        let mut events = self.stream.push_literal(&text);
        events.extend(self.stream.finish());
        Ok(events)
    }
}
