//! The reasoning budget (`--reasoning-budget N`, a request's `reasoning_budget`): a constraint
//! that counts the tokens generated inside the thinking block and, at the budget, forces the
//! block's closing tag, token by token, so the model goes on to its answer. Nothing else is
//! masked, so a request within its budget samples exactly as without it.

use std::collections::VecDeque;
use std::sync::Arc;

use cortiq_engine::sched::Constraint;
use cortiq_formats::calls::ThinkTags;
use cortiq_formats::tokenizer::Tokenizer;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Before the block: the model may open it (Qwen3 writes `<think>` itself) or answer.
    Before,
    Inside,
    /// Closed (or never opened): nothing is constrained any more.
    Done,
}

pub struct ThinkBudget {
    tok: Arc<Tokenizer>,
    tags: ThinkTags,
    budget: usize,
    used: usize,
    phase: Phase,
    /// The text since the phase began (only its tail is searched).
    recent: String,
    /// The closing tag's tokens still to force.
    force: VecDeque<u32>,
    close_ids: Vec<u32>,
}

impl ThinkBudget {
    /// `start_inside`: the prompt ended inside an open block (the template wrote the opener).
    pub fn new(tok: Arc<Tokenizer>, tags: ThinkTags, budget: usize, start_inside: bool) -> Result<ThinkBudget, String> {
        let close_ids = tok.encode_with(&tags.close, false, true).map_err(|e| e.to_string())?;
        if close_ids.is_empty() {
            return Err(format!("the reasoning close tag {:?} does not tokenize", tags.close));
        }
        let mut b = ThinkBudget {
            tok,
            tags,
            budget,
            used: 0,
            phase: if start_inside { Phase::Inside } else { Phase::Before },
            recent: String::new(),
            force: VecDeque::new(),
            close_ids,
        };
        if b.phase == Phase::Inside && budget == 0 {
            b.force = b.close_ids.iter().copied().collect();
        }
        Ok(b)
    }

    fn push_text(&mut self, id: u32) {
        self.recent.push_str(&String::from_utf8_lossy(&self.tok.token_bytes(id)));
        // Keep a tail long enough to hold either tag.
        trim_tail(&mut self.recent, 4 * (self.tags.open.len() + self.tags.close.len()));
    }
}

impl Constraint for ThinkBudget {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        if let Some(&f) = self.force.front() {
            for (id, l) in logits.iter_mut().enumerate() {
                if id as u32 != f {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        Ok(())
    }

    fn commit(&mut self, id: u32) -> Result<bool, String> {
        if self.force.front() == Some(&id) {
            self.force.pop_front();
            if self.force.is_empty() {
                self.phase = Phase::Done;
            }
            return Ok(false);
        }
        match self.phase {
            Phase::Done => {}
            Phase::Before => {
                self.push_text(id);
                let t = self.recent.trim_start();
                if t.contains(&self.tags.open) {
                    self.phase = Phase::Inside;
                    self.recent.clear();
                    if self.budget == 0 {
                        self.force = self.close_ids.iter().copied().collect();
                    }
                } else if !t.is_empty() && !self.tags.open.starts_with(t) {
                    // The model answers without thinking.
                    self.phase = Phase::Done;
                }
            }
            Phase::Inside => {
                self.used += 1;
                self.push_text(id);
                if self.recent.contains(&self.tags.close) {
                    self.phase = Phase::Done;
                } else if self.used >= self.budget {
                    self.force = self.close_ids.iter().copied().collect();
                }
            }
        }
        Ok(false)
    }
}

/// Drop the front of `text` once it holds twice `keep` bytes, keeping about `keep` (the tail a
/// tag cut between tokens can still be found in); cut on a character boundary.
pub(crate) fn trim_tail(text: &mut String, keep: usize) {
    if text.len() > 2 * keep {
        let mut cut = text.len() - keep;
        while !text.is_char_boundary(cut) {
            cut += 1;
        }
        text.drain(..cut);
    }
}
