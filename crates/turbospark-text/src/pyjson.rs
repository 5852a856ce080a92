//! The `tojson` filter of transformers' chat templates: Python's
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
//! sort_keys=False)`, byte for byte. It owns only that serialisation.
//!
//! minijinja's own `tojson` escapes `<`, `>`, `&` and `'` for HTML and writes
//! floats and separators its own way; a prompt must match what the model saw
//! in training, which is what Python printed.

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

struct Options {
    ensure_ascii: bool,
    /// The text of one indent level; `None` writes everything on one line.
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

/// `value | tojson(ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
pub(crate) fn tojson(value: &Value, kwargs: Kwargs) -> Result<String, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        // Python: an int is that many spaces, a string is used as is.
        Some(v) => Some(match v.as_str() {
            Some(s) => s.to_string(),
            None => {
                let n = i64::try_from(v.clone()).map_err(|_| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        format!("tojson: indent must be an int or a string, got {v}"),
                    )
                })?;
                " ".repeat(usize::try_from(n).unwrap_or(0))
            }
        }),
    };
    let (item_sep, key_sep) = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(pair) => match <[String; 2]>::try_from(pair) {
            Ok([item, key]) => (item, key),
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be a pair (item_separator, key_separator)",
                ));
            }
        },
        // Python drops the space after ',' when indenting, as lines end there.
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let opts = Options {
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        indent,
        item_sep,
        key_sep,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_value(&mut out, value, &opts, 0)?;
    Ok(out)
}

fn write_value(out: &mut String, value: &Value, opts: &Options, depth: usize) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number if value.is_integer() => out.push_str(&value.to_string()),
        ValueKind::Number => out.push_str(&python_float(f64::try_from(value.clone())?)),
        ValueKind::String => {
            write_string(out, value.as_str().unwrap_or_default(), opts.ensure_ascii)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, ('[', ']'), items.len(), opts, depth, |out, i| {
                write_value(out, &items[i], opts, depth + 1)
            })?;
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if opts.sort_keys {
                keys.sort();
            }
            write_container(out, ('{', '}'), keys.len(), opts, depth, |out, i| {
                let key = &keys[i];
                // Python converts int, float, bool and None keys to strings.
                match key.as_str() {
                    Some(s) => write_string(out, s, opts.ensure_ascii),
                    None => {
                        let mut text = String::new();
                        write_value(&mut text, key, opts, depth + 1)?;
                        write_string(out, &text, opts.ensure_ascii);
                    }
                }
                out.push_str(&opts.key_sep);
                write_value(out, &value.get_item(key)?, opts, depth + 1)
            })?;
        }
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a value of type {other} is not JSON serializable"),
            ));
        }
    }
    Ok(())
}

/// Writes `len` items between `open` and `close` the way `json.dumps` lays
/// them out: empty containers stay `[]`/`{}`, indented ones get one item a line.
fn write_container(
    out: &mut String,
    (open, close): (char, char),
    len: usize,
    opts: &Options,
    depth: usize,
    mut item: impl FnMut(&mut String, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if len == 0 {
        out.push(close);
        return Ok(());
    }
    for i in 0..len {
        if i > 0 {
            out.push_str(&opts.item_sep);
        }
        if let Some(indent) = &opts.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth + 1));
        }
        item(out, i)?;
    }
    if let Some(indent) = &opts.indent {
        out.push('\n');
        out.push_str(&indent.repeat(depth));
    }
    out.push(close);
    Ok(())
}

fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                // Outside the BMP, Python writes the UTF-16 surrogate pair.
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: shortest round-trip digits, scientific notation
/// below 1e-4 and from 1e16 on (Rust's `{:?}` uses the same cut-offs but
/// writes `1e-5` where Python writes `1e-05`).
fn python_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let debug = format!("{x:?}");
    let Some((mantissa, exp)) = debug.split_once('e') else {
        return debug;
    };
    let (sign, digits) = match exp.strip_prefix('-') {
        Some(d) => ('-', d),
        None => ('+', exp),
    };
    format!("{mantissa}e{sign}{digits:0>2}")
}
