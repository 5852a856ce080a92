//! `turbospark tokenize`: the ids (and pieces) of a text.

use anyhow::Result;
use turbospark_text::Tokenizer;

use crate::args::TokenizeArgs;

pub fn main(a: TokenizeArgs) -> Result<()> {
    let tok = Tokenizer::from_dir(&a.model)?;
    let ids = tok.encode(&a.text, !a.no_special)?;
    let list: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    println!("{}", list.join(","));
    for id in ids {
        eprintln!("{id:>8} {:?}", tok.id_to_token(id).unwrap_or_default());
    }
    Ok(())
}
