#!/usr/bin/env python3
"""Render the chat-template test cases with transformers and write expected.json.

Run from this folder with /opt/refenv/bin/python (jinja2 3.1.6, transformers 5.24):

    /opt/refenv/bin/python render_expected.py

Every case is rendered by transformers' own `render_jinja_template`, the function
behind `tokenizer.apply_chat_template(..., tokenize=False)`, with the special
tokens that the model's tokenizer passes. The clock behind `strftime_now` is
fixed so the output does not depend on the day. The Rust test
(tests/chat_template.rs) reads each case's inputs from expected.json, renders it
with `ChatTemplate` and compares the whole string.
"""

import calendar
import json
from datetime import datetime, timezone
from pathlib import Path

import jinja2
import transformers
import transformers.utils.chat_template_utils as ctu

HERE = Path(__file__).parent

# (bos_token, eos_token) as each model's tokenizer_config.json declares them.
MODELS = {
    "meta-llama-Llama-3.1-8B-Instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "Qwen-Qwen2.5-7B-Instruct.jinja": (None, "<|im_end|>"),
    "Qwen-Qwen3-0.6B.jinja": (None, "<|im_end|>"),
    "google-gemma-2-2b-it.jinja": ("<bos>", "<eos>"),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("<s>", "</s>"),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": ("<|begin_of_text|>", "<|im_end|>"),
    "openai-gpt-oss-120b.jinja": ("<|startoftext|>", "<|return|>"),
}

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
CHAT = [
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi! How can I help?"},
    {"role": "user", "content": "What is 2+2?"},
]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city, e.g. Paris"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Unit"},
                    "days": {"type": "integer", "description": "Forecast days", "default": 1},
                },
                "required": ["city"],
            },
        },
    }
]

TOOL_CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
TOOL_CHAT = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
    {"role": "tool", "content": '{"temperature": 21.5, "sky": "sunny"}'},
]
# Mistral requires 9-character tool call ids.
MISTRAL_TOOL_CHAT = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{**TOOL_CALL, "id": "abc123XYZ"}]},
    {"role": "tool", "content": '{"temperature": 21.5}', "tool_call_id": "abc123XYZ"},
]

L31, L32, Q25, Q3, GEMMA, NEMO, HERMES, OSS = MODELS

# name, template, messages, add_generation_prompt, tools, extra kwargs
CASES = [
    ("llama31_chat", L31, [SYSTEM, *CHAT], True, None, {}),
    ("llama31_tools", L31, [SYSTEM, *TOOL_CHAT], True, TOOLS, {}),
    ("llama31_no_prompt", L31, CHAT[:2], False, None, {}),
    ("llama32_chat", L32, [SYSTEM, *CHAT], True, None, {}),
    ("llama32_tools", L32, [SYSTEM, CHAT[0]], True, TOOLS, {}),
    ("qwen25_chat", Q25, [SYSTEM, *CHAT], True, None, {}),
    ("qwen25_default_system", Q25, CHAT, True, None, {}),
    ("qwen25_tools", Q25, [SYSTEM, *TOOL_CHAT], True, TOOLS, {}),
    ("qwen3_chat", Q3, [SYSTEM, *CHAT], True, None, {}),
    ("qwen3_no_thinking", Q3, [SYSTEM, *CHAT], True, None, {"enable_thinking": False}),
    (
        "qwen3_reasoning",
        Q3,
        [CHAT[0], {"role": "assistant", "content": "Hi!", "reasoning_content": "Greet back."}],
        False,
        None,
        {},
    ),
    (
        "qwen3_think_in_content",
        Q3,
        [CHAT[0], {"role": "assistant", "content": "<think>\nGreet back.\n</think>\n\nHi!"}],
        False,
        None,
        {},
    ),
    ("qwen3_tools", Q3, [SYSTEM, *TOOL_CHAT], True, TOOLS, {}),
    ("gemma2_chat", GEMMA, CHAT, True, None, {}),
    ("gemma2_system_rejected", GEMMA, [SYSTEM, *CHAT], True, None, {}),
    ("nemo_chat", NEMO, [SYSTEM, *CHAT], True, None, {}),
    ("nemo_tools", NEMO, MISTRAL_TOOL_CHAT, True, TOOLS, {}),
    ("hermes3_tools", HERMES, [SYSTEM, *CHAT], True, TOOLS, {}),
    ("gpt_oss_chat", OSS, [SYSTEM, *CHAT], True, None, {}),
    ("gpt_oss_tools", OSS, [SYSTEM, *TOOL_CHAT], True, TOOLS, {"reasoning_effort": "high"}),
    (
        "gpt_oss_final_thinking",
        OSS,
        [CHAT[0], {"role": "assistant", "content": "Hi!", "thinking": "Greet back."}],
        False,
        None,
        {},
    ),
]

# Inline templates for the filters and functions transformers adds.
TOJSON = (
    "{{ x | tojson }}\n{{ x | tojson(indent=4) }}\n{{ x | tojson(indent=2, sort_keys=true) }}\n"
    "{{ x | tojson(ensure_ascii=true) }}\n{{ x | tojson(separators=(',', ':')) }}\n{{ 'a<b>&\\'c' | tojson }}"
)
TOJSON_VALUE = {
    "text": "héllo 😀 <b>&'\"\\\n\t\u0001",
    "ints": [0, -3, 12345678901234],
    "floats": [0.5, 1.0, 100.0, 1e-05, 0.0001, 1.5e16, 1e16, -2.25, 123456.789],
    "empty": {"list": [], "dict": {}},
    "flags": [True, False, None],
}
# Whitespace control: transformers sets trim_blocks and lstrip_blocks, and the
# real templates above mostly strip with "-" themselves, so check them here.
BLOCKS = "<\n  {% for m in items %}\n    [{{ m }}]\n  {% endfor %}\n  {# note #}\n{% if true %}  yes\n{% endif %}\n>\n"
STRFTIME = "{% for f in formats %}{{ f }}={{ strftime_now(f) }}\n{% endfor %}"
STRFTIME_FORMATS = [
    "%Y-%m-%d", "%d %b %Y", "%d %B %Y", "%A %a %w %u", "%H:%M:%S", "%I %p",
    "%j", "%y", "%e", "%F %T", "%D", "%R", "%c", "%x %X", "%-d %-m %-H", "%%", "%z%Z",
]
NOW = datetime(2025, 3, 7, 14, 5, 9)
STRFTIME_TIMES = [NOW, datetime(2024, 2, 29, 0, 30, 0), datetime(1999, 12, 31, 23, 59, 59), datetime(2024, 12, 31, 12, 0, 1)]


def render(source, messages, add_generation_prompt, tools, extra, bos, eos, now):
    class Clock(datetime):
        @classmethod
        def now(cls, tz=None):
            return now

    ctu.datetime = Clock
    special = {k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v is not None}
    try:
        rendered, _ = ctu.render_jinja_template(
            conversations=[messages],
            tools=tools,
            chat_template=source,
            add_generation_prompt=add_generation_prompt,
            **special,
            **extra,
        )
        return {"expected": rendered[0]}
    except jinja2.exceptions.TemplateError as e:
        return {"expected_error": str(e)}


def unix(dt):
    return calendar.timegm(dt.timetuple())


def main():
    cases = []
    for name, template, messages, agp, tools, extra in CASES:
        bos, eos = MODELS[template]
        source = (HERE / template).read_text(encoding="utf-8")
        case = {
            "name": name,
            "template": template,
            "bos_token": bos,
            "eos_token": eos,
            "messages": messages,
            "add_generation_prompt": agp,
            "tools": tools,
            "extra": extra,
            "now": unix(NOW),
        }
        case.update(render(source, messages, agp, tools, extra, bos, eos, NOW))
        cases.append(case)
    inline = [
        {"name": "tojson", "source": TOJSON, "extra": {"x": TOJSON_VALUE}, "now": unix(NOW)},
        {"name": "blocks", "source": BLOCKS, "extra": {"items": [1, 2]}, "now": unix(NOW)},
    ]
    for t in STRFTIME_TIMES:
        inline.append({"name": f"strftime {t}", "source": STRFTIME, "extra": {"formats": STRFTIME_FORMATS}, "now": unix(t)})
    for case in inline:
        case.update(render(case["source"], [], False, None, case["extra"], None, None, datetime.fromtimestamp(case["now"], timezone.utc).replace(tzinfo=None)))
    out = {
        "generated_by": f"render_expected.py with transformers {transformers.__version__}, jinja2 {jinja2.__version__}",
        "cases": cases,
        "inline": inline,
    }
    with open(HERE / "expected.json", "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
