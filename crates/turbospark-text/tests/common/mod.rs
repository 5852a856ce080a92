//! Test data shared by the chat-template and Harmony tests.

use serde_json::{Value, json};

/// A one-function tool list in the OpenAI/transformers `tools` format.
pub fn weather_tools() -> Value {
    json!([{
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City name"}},
                "required": ["city"]
            }
        }
    }])
}
