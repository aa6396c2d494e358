//! The per-mixer state operations (STYLE principle 9) through the sequence API, for every mixer
//! the fixtures hold (attention exact and sliding, f32, f16 and 8-bit caches, GatedDeltaNet, KDA, MLA,
//! short convolution): `clear` returns to a fresh state (the same prompt gives the same logits
//! bit for bit), `checkpoint`/`rollback` over several positions restores it exactly, `reserve`
//! and `clone` change nothing, `bytes_by_kind` puts each mixer's bytes under its kind, and
//! `truncate` works exactly where `can_truncate` says so.

mod common;

use common::{fixture, ids};
use cortiq_engine::config::MixerKind;
use cortiq_engine::load::load;
use cortiq_engine::state::KvType;
use cortiq_engine::{Logits, Model};

/// Position of the first bitwise difference, if any.
fn first_diff(a: &[f32], b: &[f32]) -> Option<(usize, f32, f32)> {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).enumerate().find(|(_, (x, y))| x.to_bits() != y.to_bits()).map(|(i, (x, y))| (i, *x, *y))
}

fn check(name: &str, kv: KvType) {
    let mut model: Model = load(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}")).model;
    if let Err(e) = model.set_kv_type(kv) {
        // 8-bit rows are blocks of 32: a smaller head is refused, by name.
        assert!(kv == KvType::Q8 && model.cfg.head_dim % 32 != 0, "{name}: {kv:?} refused: {e}");
        assert!(e.to_string().contains("head size"), "{name}: {e}");
        return;
    }
    let toks = ids(&fixture(name).join("tokens.json"));
    let p = toks.len().min(24) - 4;
    let (prompt, more) = (&toks[..p], &toks[p..p + 4]);
    let tag = format!("{name} ({} KV)", kv.name());

    // Reference: a fresh state over prompt + more, logits of every `more` position.
    let mut fresh = model.new_state(64);
    model.forward(prompt, &mut fresh, Logits::None).unwrap();
    let want = model.forward(more, &mut fresh, Logits::From(0)).unwrap();

    // clear(): the same sequence again on a used state.
    let mut st = model.new_state(64);
    model.forward(&toks[..p + 4], &mut st, Logits::None).unwrap();
    st.clear();
    assert_eq!(st.len, 0);
    model.forward(prompt, &mut st, Logits::None).unwrap();
    assert_eq!(first_diff(&model.forward(more, &mut st, Logits::From(0)).unwrap(), &want), None, "{tag}: after clear()");

    // checkpoint / rollback over four positions, with reserve and a clone in between.
    let mut st = model.new_state(64);
    model.forward(prompt, &mut st, Logits::None).unwrap();
    let cp = st.checkpoint();
    let before = st.bytes_by_kind();
    st.reserve(8);
    let copy = st.clone();
    model.forward(more, &mut st, Logits::None).unwrap();
    st.rollback(cp);
    assert_eq!((st.len, st.bytes_by_kind()), (p, before), "{tag}: length and bytes after rollback");
    assert_eq!(first_diff(&model.forward(more, &mut st, Logits::From(0)).unwrap(), &want), None, "{tag}: after rollback");
    let mut copy = copy;
    assert_eq!(first_diff(&model.forward(more, &mut copy, Logits::From(0)).unwrap(), &want), None, "{tag}: a clone");

    // Bytes by kind follow the layer kinds; truncate where allowed.
    let b = st.bytes_by_kind();
    let kinds = &model.cfg.layers;
    let has_kv = kinds.iter().any(|l| matches!(l.mixer, MixerKind::Attention | MixerKind::Mla(_) | MixerKind::AttnMamba2(_)));
    let recurrent = kinds.iter().any(|l| !matches!(l.mixer, MixerKind::Attention | MixerKind::Mla(_) | MixerKind::Identity));
    assert_eq!((b.kv > 0, b.recurrent > 0, b.o1), (has_kv, recurrent, 0), "{tag}: bytes by kind {b:?}");
    assert_eq!(st.can_truncate(), !recurrent, "{tag}: can_truncate");
    if st.can_truncate() {
        st.truncate(p);
        assert_eq!(st.bytes_by_kind(), before, "{tag}: bytes after truncate");
        assert_eq!(first_diff(&model.forward(more, &mut st, Logits::From(0)).unwrap(), &want), None, "{tag}: after truncate");
    }
    st.clear();
    assert_eq!(st.bytes_by_kind().kv, 0, "{tag}: KV bytes after clear()");
    println!("{tag}: clear, rollback, reserve, clone, truncate leave the logits bit for bit; bytes {b:?}");
}

#[test]
fn state_ops_every_fixture() {
    for name in [
        "llama",
        "qwen2",
        "qwen3",
        "gemma3",
        "qwen3_5",
        "qwen3_5_moe",
        "qwen3_next",
        "lfm2",
        "kimi_linear",
        "granitemoehybrid",
        "lfm2_moe",
        "gpt_oss",
        "nemotron_h",
        "falcon_h1",
        "smollm3",
        "ministral3",
        "llama_vmf",
        "llama_vmfw",
    ] {
        for kv in [KvType::F32, KvType::F16, KvType::Q8] {
            check(name, kv);
        }
    }
}
