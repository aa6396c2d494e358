//! Structured output: `response_format` `json_object` / `json_schema` as a token constraint
//! (`cortiq_engine::sched::Constraint`) built with llguidance — a well-kept grammar engine
//! (Earley parser + lexer over the token trie, the one vLLM, SGLang and mistral.rs use); the
//! mask it computes is applied to the logits before sampling, so every output parses.

use std::sync::Arc;

use cortiq_engine::sched::Constraint;
use cortiq_formats::calls::ThinkTags;
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

impl Compiled {
    /// The grammar held back until the model writes `opener` outside a thinking block (a tool
    /// call under `tool_choice` auto): see `LazyCall`.
    pub fn lazy(&self, tok: Arc<Tokenizer>, opener: &str, think: Option<ThinkTags>, start_in_think: bool) -> Box<dyn Constraint> {
        Box::new(LazyCall {
            grammar: self.0.deep_clone(),
            tok,
            opener: opener.to_string(),
            think,
            in_think: start_in_think,
            recent: String::new(),
            active: None,
        })
    }
}

/// A call's grammar that engages when the model opens a call: until the opener is written
/// nothing is masked (the model may answer in text, so an answer samples exactly as without
/// tools' grammar); from the opener on, the call's body must follow the grammar (a declared
/// tool's name, arguments valid for its schema, the closing tag); when the call is closed the
/// model is free again (another call, text, or the end). An opener inside the thinking block
/// is thinking, as the output parser reads it.
struct LazyCall {
    grammar: TokenParser,
    tok: Arc<Tokenizer>,
    opener: String,
    think: Option<ThinkTags>,
    in_think: bool,
    /// The text since the last decision (only its tail is kept).
    recent: String,
    active: Option<Matcher>,
}

impl LazyCall {
    /// Start the call's grammar; `rest`: text of the opener's token after the opener.
    fn engage(&mut self, rest: &str) {
        let mut m = Matcher::new(Ok(self.grammar.deep_clone()));
        if !rest.is_empty() {
            let ids = self.tok.encode_with(rest, false, false).unwrap_or_default();
            // A token that runs past the opener into text the grammar does not allow: the
            // model has left the call's form, and the parser reads what it wrote.
            if m.try_consume_tokens(&ids).ok() != Some(ids.len()) {
                return;
            }
        }
        if m.get_error().is_none() {
            self.active = Some(m);
        }
    }
}

impl Constraint for LazyCall {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let Some(m) = self.active.as_mut() else { return Ok(()) };
        let allowed = m.compute_mask().map_err(|e| e.to_string())?;
        for (id, l) in logits.iter_mut().enumerate() {
            if !allowed.is_allowed(id as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    fn commit(&mut self, id: u32) -> Result<bool, String> {
        if let Some(m) = self.active.as_mut() {
            m.consume_token(id).map_err(|e| e.to_string())?;
            if m.is_stopped() {
                self.active = None;
            }
            return Ok(false);
        }
        self.recent.push_str(&String::from_utf8_lossy(&self.tok.token_bytes(id)));
        loop {
            if self.in_think {
                let close = self.think.as_ref().map_or("", |t| t.close.as_str());
                let Some(i) = self.recent.find(close) else { break };
                self.recent.drain(..i + close.len());
                self.in_think = false;
                continue;
            }
            let open = self.think.as_ref().and_then(|t| self.recent.find(t.open.as_str()).map(|i| (i, t.open.len())));
            let call = self.recent.find(self.opener.as_str());
            match (open, call) {
                (Some((i, n)), c) if c.is_none_or(|c| i < c) => {
                    self.recent.drain(..i + n);
                    self.in_think = true;
                }
                (_, Some(c)) => {
                    let rest = self.recent[c + self.opener.len()..].to_string();
                    self.recent.clear();
                    self.engage(&rest);
                    break;
                }
                _ => break,
            }
        }
        // Keep a tail long enough to hold any tag cut between tokens.
        let keep = 2 * self.opener.len() + self.think.as_ref().map_or(0, |t| t.open.len() + t.close.len());
        crate::reasoning::trim_tail(&mut self.recent, keep);
        Ok(false)
    }
}

/// Several constraints on one output: each masks, each advances; the output ends when one
/// says so (the reasoning budget with a call's grammar under `auto`).
pub struct Chain(pub Vec<Box<dyn Constraint>>);

impl Constraint for Chain {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        self.0.iter_mut().try_for_each(|c| c.mask(logits))
    }

    fn commit(&mut self, id: u32) -> Result<bool, String> {
        let mut end = false;
        for c in &mut self.0 {
            end |= c.commit(id)?;
        }
        Ok(end)
    }
}

#[cfg(test)]
mod tests;
