//! gpt-oss' Harmony format: the real template renders a tool conversation,
//! and generated turns parse into reasoning, tool calls and the answer, fed
//! as token ids (the o200k_harmony tokenizer) or as text in any pieces.

use std::path::Path;
use std::sync::OnceLock;

mod common;

use common::weather_tools;

use serde_json::{Map, json};
use turbospark_text::harmony::parse;
use turbospark_text::{
    ChatTemplate, HarmonyEvent, HarmonyMessage, HarmonyStream, HarmonyTokenStream, Message,
    Tokenizer, harmony_stop_ids,
};

use HarmonyEvent::{ContentDelta, Done, ReasoningDelta, ToolCall};

fn harmony() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| Tokenizer::o200k_harmony().unwrap())
}

fn gpt_oss_template() -> ChatTemplate {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/templates/openai-gpt-oss-120b.jinja");
    ChatTemplate::new(std::fs::read_to_string(path).unwrap(), None, None)
        .unwrap()
        .with_fixed_time(1_741_305_600) // 2025-03-07
        .unwrap()
}

/// system (the template's developer instructions), user, an assistant turn
/// that thinks and calls the tool, and the tool's result.
fn tool_conversation() -> Vec<Message> {
    let mut call = Message::new("assistant", "");
    call.extra
        .insert("thinking".into(), json!("Need the weather."));
    call.extra.insert(
        "tool_calls".into(),
        json!([{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]),
    );
    vec![
        Message::new("system", "Answer briefly."),
        Message::new("user", "Weather in Oslo?"),
        call,
        Message::new("tool", "{\"temp_c\": 21}"),
    ]
}

fn render_tool_conversation() -> String {
    let mut extra = Map::new();
    extra.insert("reasoning_effort".into(), json!("high"));
    gpt_oss_template()
        .render(&tool_conversation(), true, Some(&weather_tools()), &extra)
        .unwrap()
}

fn msg(
    role: &str,
    channel: Option<&str>,
    recipient: Option<&str>,
    ty: Option<&str>,
    content: &str,
) -> HarmonyMessage {
    HarmonyMessage {
        role: role.into(),
        channel: channel.map(Into::into),
        recipient: recipient.map(Into::into),
        content_type: ty.map(Into::into),
        content: content.into(),
    }
}

#[test]
fn the_real_template_renders_tools_calls_and_results() {
    let prompt = render_tool_conversation();
    let parts = [
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n",
        "Reasoning: high\n\n",
        "Calls to these tools must go to the commentary channel: 'functions'.<|end|>",
        "<|start|>developer<|message|># Instructions\n\nAnswer briefly.\n\n# Tools\n\n## functions\n\nnamespace functions {\n\n// Weather for a city\ntype get_weather = (_: {\n// City name\ncity: string,\n}) => any;\n\n} // namespace functions<|end|>",
        "<|start|>user<|message|>Weather in Oslo?<|end|>",
        // The analysis before a call is kept while no final answer follows.
        "<|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|>",
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Oslo\"}<|call|>",
        // The template passes the tool's output through tojson.
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"{\\\"temp_c\\\": 21}\"<|end|>",
    ];
    let mut from = 0;
    for part in parts {
        let at = prompt[from..]
            .find(part)
            .unwrap_or_else(|| panic!("{part:?} missing (or out of order) in:\n{prompt}"));
        from += at + part.len();
    }
    assert_eq!(&prompt[from..], "<|start|>assistant");

    // The prompt survives the tokenizer, its markers as single special ids.
    let tok = harmony();
    let ids = tok.encode(&prompt, false).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), prompt);
    assert_eq!(&ids[..2], &[200_006, tok.token_id("system").unwrap()]);
    assert_eq!(ids.iter().filter(|&&id| id == 200_012).count(), 1);
    assert_eq!(ids.iter().filter(|&&id| id == 200_006).count(), 7);
    assert_eq!(ids.last(), tok.token_id("assistant").as_ref());
}

#[test]
fn parse_reads_every_header_of_a_rendered_conversation() {
    let messages = parse(&render_tool_conversation());
    let roles: Vec<&str> = messages.iter().map(|m| m.role.as_str()).collect();
    // The trailing `<|start|>assistant` is a header without a message.
    assert_eq!(
        roles,
        [
            "system",
            "developer",
            "user",
            "assistant",
            "assistant",
            "functions.get_weather"
        ]
    );
    assert_eq!(
        messages[2],
        msg("user", None, None, None, "Weather in Oslo?")
    );
    assert_eq!(
        messages[3],
        msg(
            "assistant",
            Some("analysis"),
            None,
            None,
            "Need the weather."
        )
    );
    assert_eq!(
        messages[4],
        msg(
            "assistant",
            Some("commentary"),
            Some("functions.get_weather"),
            Some("json"),
            "{\"city\": \"Oslo\"}"
        )
    );
    assert_eq!(
        messages[5],
        msg(
            "functions.get_weather",
            Some("commentary"),
            Some("assistant"),
            None,
            "\"{\\\"temp_c\\\": 21}\""
        )
    );
}

/// What the model writes after the prompt's `<|start|>assistant`: it
/// thinks, calls the tool (recipient after the channel, `<|constrain|>`),
/// and stops at `<|call|>`. Then, given the result, thinks and answers.
const CALL_TURN: &str = "<|channel|>analysis<|message|>User wants Oslo's weather. Use get_weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Oslo\"}<|call|>";
const ANSWER_TURN: &str = "<|channel|>analysis<|message|>21 °C, say it.<|end|><|start|>assistant<|channel|>final<|message|>It is 21 °C in Oslo 🌤.<|return|>";

/// Joins adjacent deltas of one kind, so that the expected events do not
/// depend on how the text was cut.
fn merged(events: Vec<HarmonyEvent>) -> Vec<HarmonyEvent> {
    let mut out: Vec<HarmonyEvent> = Vec::new();
    for event in events {
        match (out.last_mut(), event) {
            (Some(ReasoningDelta(a)), ReasoningDelta(b)) => a.push_str(&b),
            (Some(ContentDelta(a)), ContentDelta(b)) => a.push_str(&b),
            (_, event) => out.push(event),
        }
    }
    out
}

/// Feeds `ids` one at a time through the token-level parser.
fn stream_ids(ids: &[u32]) -> Vec<HarmonyEvent> {
    let mut stream = HarmonyTokenStream::new(harmony());
    let mut events = Vec::new();
    for &id in ids {
        events.extend(stream.push(id).unwrap());
    }
    events.extend(stream.finish().unwrap());
    events
}

#[test]
fn token_stream_yields_reasoning_tool_call_and_answer() {
    let tok = harmony();
    let mut call_ids = tok.encode(CALL_TURN, false).unwrap();
    // Tokens after the stop are ignored (an engine would not generate them).
    call_ids.extend(
        tok.encode("<|start|>assistant<|channel|>final<|message|>x", false)
            .unwrap(),
    );
    let events = stream_ids(&call_ids);
    // Deltas arrive token by token: more than one reasoning piece.
    assert!(
        events
            .iter()
            .filter(|e| matches!(e, ReasoningDelta(_)))
            .count()
            > 3
    );
    assert_eq!(
        merged(events),
        [
            ReasoningDelta("User wants Oslo's weather. Use get_weather.".into()),
            ToolCall {
                name: "get_weather".into(),
                arguments: "{\"city\":\"Oslo\"}".into()
            },
            Done,
        ]
    );

    let answer_ids = tok.encode(ANSWER_TURN, false).unwrap();
    assert_eq!(
        merged(stream_ids(&answer_ids)),
        [
            ReasoningDelta("21 °C, say it.".into()),
            ContentDelta("It is 21 °C in Oslo 🌤.".into()),
            Done,
        ]
    );
}

#[test]
fn a_stop_token_the_engine_withheld_still_ends_the_call() {
    // The engine stops at `<|call|>` without passing it on; finish() closes
    // the call. The recipient may also stand before the channel.
    let tok = harmony();
    let text = "<|channel|>analysis<|message|>Call it.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Bergen\"}";
    let ids = tok.encode(text, false).unwrap();
    assert_eq!(
        merged(stream_ids(&ids)),
        [
            ReasoningDelta("Call it.".into()),
            ToolCall {
                name: "get_weather".into(),
                arguments: "{\"city\": \"Bergen\"}".into()
            },
            Done,
        ]
    );
    assert_eq!(harmony_stop_ids(tok), [200_002, 200_012, 199_999]);
}

#[test]
fn markers_spelled_with_ordinary_tokens_stay_text_in_token_mode() {
    let tok = harmony();
    let mut ids = tok
        .encode("<|channel|>final<|message|>Write ", false)
        .unwrap();
    // `<|end|>` spelled out of ordinary tokens, as in a code sample.
    ids.extend(tok.encode("<|", false).unwrap());
    ids.extend(tok.encode("end|> here", false).unwrap());
    assert!(
        ids.iter()
            .all(|&id| id < 199_998 || id == 200_005 || id == 200_008)
    );
    assert_eq!(
        merged(stream_ids(&ids)),
        [ContentDelta("Write <|end|> here".into()), Done]
    );
}

#[test]
fn text_stream_handles_markers_split_anywhere() {
    for source in [CALL_TURN, ANSWER_TURN] {
        let whole = {
            let mut s = HarmonyStream::new();
            let mut events = s.push(source);
            events.extend(s.finish());
            merged(events)
        };
        // One char at a time cuts every marker in every place.
        let mut s = HarmonyStream::new();
        let mut events = Vec::new();
        for c in source.chars() {
            events.extend(s.push(&c.to_string()));
        }
        events.extend(s.finish());
        assert_eq!(merged(events), whole);
        assert_eq!(whole.last(), Some(&Done));
        assert!(whole.len() >= 3, "{whole:?}");
    }
}

#[test]
fn the_whole_exchange_parses_into_its_messages() {
    let exchange = format!(
        "{CALL_TURN}<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{{\"temp_c\": 21}}<|end|><|start|>assistant{ANSWER_TURN}"
    );
    let messages = parse(&exchange);
    let summary: Vec<(&str, Option<&str>, Option<&str>)> = messages
        .iter()
        .map(|m| {
            (
                m.role.as_str(),
                m.channel.as_deref(),
                m.recipient.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("assistant", Some("analysis"), None),
            (
                "assistant",
                Some("commentary"),
                Some("functions.get_weather")
            ),
            (
                "functions.get_weather",
                Some("commentary"),
                Some("assistant")
            ),
            ("assistant", Some("analysis"), None),
            ("assistant", Some("final"), None),
        ]
    );
    assert_eq!(messages[1].content_type.as_deref(), Some("json"));
    assert_eq!(messages[4].content, "It is 21 °C in Oslo 🌤.");
}

#[test]
fn output_that_ignores_the_format_is_the_answer() {
    let mut s = HarmonyStream::new();
    let mut events = s.push("Just text, a < sign and <|weird|> bits.");
    events.extend(s.finish());
    assert_eq!(
        merged(events),
        [
            ContentDelta("Just text, a < sign and <|weird|> bits.".into()),
            Done
        ]
    );
    // An incomplete header at the end is not shown as an answer.
    let mut s = HarmonyStream::new();
    let mut events = s.push("<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|chan");
    events.extend(s.finish());
    assert_eq!(merged(events), [ReasoningDelta("Hm.".into()), Done]);
}

#[test]
fn the_built_in_template_is_the_real_one_and_harmony() {
    let built_in = ChatTemplate::gpt_oss().unwrap();
    assert!(built_in.is_harmony());
    assert_eq!(built_in.eos_token(), Some("<|return|>"));
    let messages = tool_conversation();
    let tools = weather_tools();
    let render = |t: ChatTemplate| {
        t.with_fixed_time(0)
            .unwrap()
            .render(&messages, true, Some(&tools), &Map::new())
            .unwrap()
    };
    assert_eq!(render(built_in), render(gpt_oss_template()));
    let qwen =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/templates/Qwen-Qwen3-0.6B.jinja");
    let qwen = ChatTemplate::new(std::fs::read_to_string(qwen).unwrap(), None, None).unwrap();
    assert!(!qwen.is_harmony());
}
