//! `cortiq tokenize`: the token ids of a text, comma-separated, with the model's own BOS and
//! special-token rules (each can be turned off).

use anyhow::Result;
use clap::Args;

use crate::common::{Common, open_model, open_tokenizer};

/// The flags of `cortiq tokenize`.
#[derive(Args)]
pub struct TokenizeArgs {
    #[command(flatten)]
    pub common: Common,
    /// The text to tokenize.
    pub text: String,
    /// Do not add BOS even when the model adds it.
    #[arg(long)]
    pub no_bos: bool,
    /// Treat special-token text (e.g. <|im_start|>) as plain text.
    #[arg(long)]
    pub no_parse_special: bool,
}

/// `cortiq tokenize`: the ids on one stdout line.
pub fn cmd_tokenize(a: TokenizeArgs) -> Result<()> {
    let loaded = open_model(&a.common)?;
    let tok = open_tokenizer(&loaded)?;
    let ids = tok.encode_with(&a.text, tok.add_bos() && !a.no_bos, !a.no_parse_special)?;
    println!("{}", ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(","));
    Ok(())
}
