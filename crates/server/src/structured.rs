//! Structured output: `response_format` `json_object` / `json_schema` as a token constraint
//! (`cortiq_engine::sched::Constraint`) built with llguidance — a well-kept grammar engine
//! (Earley parser + lexer over the token trie, the one vLLM, SGLang and mistral.rs use); the
//! mask it computes is applied to the logits before sampling, so every output parses.

use std::sync::Arc;

use cortiq_engine::sched::Constraint;
use cortiq_formats::tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory, TokenParser};
use serde_json::Value;

/// The vocabulary as llguidance sees it: every token's bytes (control tokens behind its 0xFF
/// marker, so no text can produce them) and our tokenizer for its forced-text steps.
struct Env {
    trie: TokTrie,
    tok: Arc<Tokenizer>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        self.tok.encode_with(&String::from_utf8_lossy(s), false, false).unwrap_or_default()
    }
}

/// Built once per server (the token trie over the whole vocabulary), on first use.
pub struct Structured {
    factory: ParserFactory,
}

impl Structured {
    pub fn new(tok: Arc<Tokenizer>, vocab: usize, eos: u32) -> Result<Structured, String> {
        let n_tok = tok.vocab_size() as u32;
        let words: Vec<Vec<u8>> = (0..vocab as u32)
            .map(|id| match id {
                id if id >= n_tok => Vec::new(),
                id if tok.is_control(id) => {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(tok.token_text(id).unwrap_or_default().as_bytes());
                    w
                }
                id => tok.token_bytes(id),
            })
            .collect();
        let trie = TokTrie::from(&TokRxInfo::new(vocab as u32, eos), &words);
        let env: TokEnv = Arc::new(Env { trie, tok });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        Ok(Structured { factory })
    }

    /// A JSON schema compiled once per request; a schema llguidance cannot compile is the
    /// client's error.
    pub fn compile_json(&self, schema: &Value) -> Result<Compiled, String> {
        self.compile(TopLevelGrammar::from_json_schema(schema.clone()))
    }

    /// A Lark grammar (llguidance's dialect: `%json {schema}` embeds a schema).
    pub fn compile_lark(&self, grammar: &str) -> Result<Compiled, String> {
        self.compile(TopLevelGrammar::from_lark(grammar.to_string()))
    }

    fn compile(&self, g: TopLevelGrammar) -> Result<Compiled, String> {
        let parser = self.factory.create_parser(g).map_err(|e| format!("{e}"))?;
        let c = Compiled(parser);
        c.constraint()?;
        Ok(c)
    }
}

/// A compiled grammar: each choice of the request runs its own copy.
pub struct Compiled(TokenParser);

impl Compiled {
    pub fn constraint(&self) -> Result<Box<dyn Constraint>, String> {
        let m = Matcher::new(Ok(self.0.deep_clone()));
        if let Some(e) = m.get_error() {
            return Err(e);
        }
        Ok(Box::new(JsonConstraint(m)))
    }
}

struct JsonConstraint(Matcher);

impl Constraint for JsonConstraint {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let allowed = self.0.compute_mask().map_err(|e| e.to_string())?;
        for (id, l) in logits.iter_mut().enumerate() {
            if !allowed.is_allowed(id as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    fn commit(&mut self, id: u32) -> Result<bool, String> {
        self.0.consume_token(id).map_err(|e| e.to_string())?;
        Ok(self.0.is_stopped())
    }
}
