//! The prompt-state cache (issue 14): a prompt served from a cached prefix gives logits
//! bit-identical to the same prompt served cold, and so do the decode steps after — for every
//! mixer the fixtures have (dense attention, Gemma 3's sliding window, LFM2's short conv,
//! GatedDeltaNet in Qwen3.5 / Qwen3.5-MoE / Qwen3-Next, KDA + MLA in Kimi Linear), in every
//! numerics mode the cache serves, plus the three real models (real-model group). The cases:
//! a prompt that leaves a cached one part-way between two checkpoints, an exact repeat, and an
//! append-only continuation (a chat's next turn), each against a cold prefill cut differently.
//!
//! Underneath sits the property the cache's design rests on (`prefix` module doc): a prompt's
//! values do not depend on where its prefill is cut, when every call starts on the grid and
//! spans two positions or more. `cuts_do_not_change_values` checks it directly.

mod common;

use common::{argmax, assert_bits_equal, fixture};
use cortiq_engine::load::load;
use cortiq_engine::prefix::{CacheConfig, Filling, PrefixCache, SHARED, entry_point, prefill};
use cortiq_engine::session;
use cortiq_engine::state::{KvType, SeqState};
use cortiq_engine::{Logits, Model, Numerics};

const N_CTX: usize = 1024;

/// Deterministic token ids below `vocab` (xorshift), the prompts' material.
fn tokens(vocab: usize, n: usize, seed: u64) -> Vec<u32> {
    cortiq_testkit::XorShift(seed | 1).ids(n, vocab)
}

/// The last position's logits, then those of `steps` greedy decode steps, concatenated.
fn then_decode(m: &Model, st: &mut SeqState, mut last: Vec<f32>, steps: usize) -> Vec<f32> {
    let mut all = last.clone();
    for _ in 0..steps {
        last = m.forward(&[argmax(&last)], st, Logits::Last).unwrap();
        all.extend_from_slice(&last);
    }
    all
}

fn cold(m: &Model, prompt: &[u32], chunk: usize) -> Vec<f32> {
    let mut st = m.new_state(N_CTX);
    let (l, reused) = prefill(m, None, prompt, &mut st, chunk).unwrap();
    assert_eq!(reused, 0);
    then_decode(m, &mut st, l, 4)
}

/// Prompts through one cache, each against its cold run (chunks of `chunk` cached, of
/// `cold_chunk` cold): the expected positions reused, and every logit equal in bits.
fn check(label: &str, m: &Model, len: usize, chunk: usize, cold_chunk: usize, every: usize) {
    let v = m.cfg.vocab;
    let a = tokens(v, len, 0x5EED_0001);
    let other = tokens(v, len, 0x5EED_0002);
    let hybrid = !m.new_state(1).can_truncate();
    let mut cache = PrefixCache::new(CacheConfig { ram: 1 << 32, every });
    let grid = m.cut_grid();
    let entry = |n: usize| entry_point(n, grid);
    // (prompt, what it is, positions the cache restores)
    let part = len * 5 / 9; // leaves `a` part-way between two checkpoints
    assert!(!part.is_multiple_of(every) && !part.is_multiple_of(16), "the parting point lies between checkpoints");
    let b: Vec<u32> = [&a[..part], &other[..len - part]].concat();
    let third = tokens(v, len, 0x5EED_0004);
    let b2: Vec<u32> = [&a[..part], &third[..len - part]].concat();
    let longer: Vec<u32> = [&a[..], &other[..30]].concat();
    let longest: Vec<u32> = [&longer[..], &other[30..41]].concat();
    let cases: Vec<(&[u32], &str, usize)> = vec![
        (&a, "first (nothing cached)", 0),
        (&b, "parts part-way", if hybrid { part / every * every } else { part }),
        // b left a checkpoint where it parted from a: the next prompt parting there restores it.
        (&b2, "parts at the same place again", part / grid * grid),
        (&a, "exact repeat", entry(a.len())),
        (&longer, "next turn", entry(a.len())),
        (&longest, "turn after", entry(longer.len())),
    ];
    for (prompt, what, want_reused) in cases {
        let mut st = m.new_state(N_CTX);
        let (l, reused) = prefill(m, Some(&mut cache), prompt, &mut st, chunk).unwrap();
        assert_eq!(reused, want_reused, "{label}: {what}: positions reused");
        let got = then_decode(m, &mut st, l, 4);
        assert_bits_equal(&format!("{label}: {what} ({reused} of {} cached)", prompt.len()), &got, &cold(m, prompt, cold_chunk));
    }
    println!("{label}: cache {} entries, {} bytes", cache.len(), cache.bytes());
}

fn all_modes(name: &str) {
    for (path, num) in
        [(fixture(name), Numerics::Exact), (fixture(name), Numerics::Fast), (fixture(name).join("model.gguf"), Numerics::Fast)]
    {
        let mut model = load(&path).unwrap_or_else(|e| panic!("{name}: {e}")).model;
        model.set_numerics(num);
        let label = format!("{name} {num:?} {}", path.file_name().unwrap().to_string_lossy());
        check(&label, &model, 90, 64, 48, 32);
    }
}

#[test]
fn cached_equals_cold_llama() {
    all_modes("llama");
}

#[test]
fn cached_equals_cold_qwen2() {
    all_modes("qwen2");
}

#[test]
fn cached_equals_cold_qwen3() {
    all_modes("qwen3");
}

#[test]
fn cached_equals_cold_gemma3_sliding_window() {
    all_modes("gemma3");
}

#[test]
fn cached_equals_cold_lfm2_short_conv() {
    all_modes("lfm2");
}

#[test]
fn cached_equals_cold_qwen3_5_gated_deltanet() {
    all_modes("qwen3_5");
}

#[test]
fn cached_equals_cold_llama_vmf() {
    all_modes("llama_vmf");
}

#[test]
fn cached_equals_cold_llama_vmf_window() {
    all_modes("llama_vmfw");
}

#[test]
fn cached_equals_cold_qwen3_5_moe() {
    all_modes("qwen3_5_moe");
}

#[test]
fn cached_equals_cold_qwen3_next() {
    all_modes("qwen3_next");
}

#[test]
fn cached_equals_cold_kimi_linear_kda_mla() {
    all_modes("kimi_linear");
}

#[test]
fn cached_equals_cold_granite_mamba2() {
    all_modes("granitemoehybrid");
}

#[test]
fn cached_equals_cold_falcon_h1() {
    all_modes("falcon_h1");
}

#[test]
fn cached_equals_cold_ministral3() {
    all_modes("ministral3");
}

#[test]
fn cached_equals_cold_nemotron_h() {
    all_modes("nemotron_h");
}

#[test]
fn cached_equals_cold_gpt_oss() {
    all_modes("gpt_oss");
}

/// The property underneath, directly: one call vs cuts at grid points (calls of 2 to 96
/// positions), logits and the state after.
/// Scopes (`--cache-scope key`): a prefix cached in one scope restores in that scope only, the
/// same tokens cached in two scopes are two entries, and a session of one scope is not
/// another's to save.
#[test]
fn scopes_keep_their_prefixes_apart() {
    let m = load(&fixture("qwen3")).unwrap().model;
    let p = tokens(m.cfg.vocab, 96, 0x5C0E);
    let mut cache = PrefixCache::new(CacheConfig { ram: 1 << 32, every: 32 });
    let mut st = m.new_state(N_CTX);
    m.forward(&p, &mut st, Logits::None).unwrap();
    assert_eq!(cache.insert_in(7, &p, &st, Vec::new()), 0);
    let mut probe = m.new_state(N_CTX);
    assert!(cache.restore_in(SHARED, &p, &mut probe).is_none(), "the shared scope sees scope 7's prefix");
    assert!(cache.restore_in(8, &p, &mut probe).is_none(), "scope 8 sees scope 7's prefix");
    assert!(cache.best_for_in(8, &p).is_none());
    let (_, n) = Filling::start_in(&mut cache, 7, &p, &mut probe);
    assert!(n >= 80, "scope 7 restores its own prefix ({n} positions)");
    // The same tokens in another scope: an entry of its own (nothing covered across scopes).
    cache.insert_in(8, &p, &st, Vec::new());
    assert_eq!(cache.len(), 2);
    assert!(cache.restore_in(8, &p, &mut probe).is_some() && cache.restore_in(7, &p, &mut probe).is_some());
    assert!(cache.restore(&p, &mut probe).is_none(), "nothing in the shared scope");
}

#[test]
fn cuts_do_not_change_values() {
    for name in ["qwen2", "gemma3", "lfm2", "qwen3_5", "qwen3_5_moe", "kimi_linear"] {
        let m = load(&fixture(name)).unwrap().model;
        let p = tokens(m.cfg.vocab, 100, 0x5EED_0003);
        let run = |cuts: &[usize]| {
            let mut st = m.new_state(N_CTX);
            let mut l = Vec::new();
            for w in cuts.windows(2) {
                l = m.forward(&p[w[0]..w[1]], &mut st, Logits::Last).unwrap();
            }
            then_decode(&m, &mut st, l, 2)
        };
        for cuts in
            [&[0, 16, 100][..], &[0, 48, 96, 100], &[0, 32, 64, 80, 100], &[0, 96, 100], &[0, 96, 98], &[0, 16, 32, 96, 98]]
        {
            let one = run(&[0, *cuts.last().unwrap()]);
            assert_bits_equal(&format!("{name}: cuts {cuts:?}"), &run(cuts), &one);
        }
    }
}

/// A cache that cannot hold an entry stores nothing and restores nothing; a small one keeps
/// its bytes under the budget, dropping the least recently used.
#[test]
fn budget_holds() {
    let m = load(&fixture("qwen3_5")).unwrap().model;
    let v = m.cfg.vocab;
    let mut st = m.new_state(N_CTX);
    let mut tiny = PrefixCache::new(CacheConfig { ram: 1000, every: 32 });
    let p = tokens(v, 90, 7);
    prefill(&m, Some(&mut tiny), &p, &mut st, 64).unwrap();
    assert_eq!((tiny.len(), tiny.bytes()), (0, 0));
    // Room for about two entries of 90 positions.
    let mut one = PrefixCache::new(CacheConfig { ram: 1 << 32, every: 32 });
    prefill(&m, Some(&mut one), &p, &mut st, 64).unwrap();
    let per_entry = one.bytes();
    let mut small = PrefixCache::new(CacheConfig { ram: per_entry * 5 / 2, every: 32 });
    for seed in 0..6 {
        prefill(&m, Some(&mut small), &tokens(v, 90, 100 + seed), &mut st, 64).unwrap();
        assert!(small.bytes() <= per_entry * 5 / 2, "{} bytes over the budget", small.bytes());
    }
    assert_eq!(small.len(), 2, "two entries fit");
    // The newest survive: the last prompt hits, the first misses.
    let (_, reused) = prefill(&m, Some(&mut small), &tokens(v, 90, 105), &mut st, 64).unwrap();
    assert!(reused > 0);
    let (_, reused) = prefill(&m, Some(&mut small), &tokens(v, 90, 100), &mut st, 64).unwrap();
    assert_eq!(reused, 0);
    println!("entry of 90 positions: {per_entry} bytes");
}

/// The three real models (real-model group: fails when a model is not in the cache), prompts
/// of 700 positions in the server's chunks of 512, checkpoints every 256.
#[test]
fn real_models_cached_equals_cold() {
    for name in ["qwen2.5-coder-0.5b", "gemma3-270m", "smollm2-135m"] {
        let mut model = load(&cortiq_testkit::real_model(name)).unwrap().model;
        model.set_numerics(Numerics::Fast);
        check(name, &model, 700, 512, 384, 256);
    }
}

/// Sessions on disk: a cached prompt saved, read back into a new cache (a restarted process),
/// and continued gives the logits of the same continuation served cold, with the saved
/// positions restored — for a dense, a sliding-window, a short-conv and two recurrent models;
/// the checkpoints come along (a prompt parting from the saved one part-way restores one).
#[test]
fn session_save_restore_continue() {
    let dir = std::env::temp_dir().join(format!("cortiq-session-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The fast numerics' default f16 cache, and an f32 and an 8-bit one (keys in their scaled
    // form: a restored state must decode as the cold one).
    let default = None;
    for (name, kv) in [
        ("qwen2", default),
        ("gemma3", default),
        ("lfm2", default),
        ("qwen3_5", default),
        ("kimi_linear", default),
        ("qwen2", Some(KvType::F32)),
        ("qwen3", Some(KvType::Q8)),
    ] {
        let mut model = load(&fixture(name)).unwrap().model;
        model.set_numerics(Numerics::Fast);
        if let Some(kv) = kv {
            model.set_kv_type(kv).unwrap();
        }
        let name = &format!("{name} {:?}", model.kv_type);
        let m = &model;
        let v = m.cfg.vocab;
        let a = tokens(v, 90, 0x5EED_0011);
        let more: Vec<u32> = [&a[..], &tokens(v, 20, 0x5EED_0012)].concat();
        let mut cache = PrefixCache::new(CacheConfig { ram: 1 << 32, every: 32 });
        let mut st = m.new_state(N_CTX);
        prefill(m, Some(&mut cache), &a, &mut st, 64).unwrap();
        let path = dir.join(format!("{}.session", name.replace(' ', "-")));
        let (toks, state, cps) = cache.best_for(&a).unwrap();
        session::save(&path, m, toks, state, cps).unwrap();
        // A new process: nothing cached but the session.
        let s = session::load(&path, m, N_CTX, u64::MAX).unwrap();
        let grid = m.cut_grid();
        assert_eq!(s.tokens, a[..entry_point(90, grid)]);
        let mut fresh = PrefixCache::new(CacheConfig { ram: 1 << 32, every: 32 });
        fresh.insert(&s.tokens, &s.state, s.checkpoints);
        let mut st = m.new_state(N_CTX);
        let (l, reused) = prefill(m, Some(&mut fresh), &more, &mut st, 64).unwrap();
        assert_eq!(reused, entry_point(90, grid), "{name}: the saved positions are restored");
        let got = then_decode(m, &mut st, l, 4);
        assert_bits_equal(&format!("{name}: continued from a session"), &got, &cold(m, &more, 48));
        // A prompt parting from the saved one at 50 restores a checkpoint (recurrent) or a
        // grid point (KV) — from the session alone.
        let mut fresh = PrefixCache::new(CacheConfig { ram: 1 << 32, every: 32 });
        let s = session::load(&path, m, N_CTX, u64::MAX).unwrap();
        fresh.insert(&s.tokens, &s.state, s.checkpoints);
        let part: Vec<u32> = [&a[..50], &tokens(v, 30, 0x5EED_0013)].concat();
        let mut st = m.new_state(N_CTX);
        let (l, reused) = prefill(m, Some(&mut fresh), &part, &mut st, 64).unwrap();
        let hybrid = !m.new_state(1).can_truncate();
        assert_eq!(reused, if hybrid { 32 } else { 50 }, "{name}: parting from a restored session");
        assert_bits_equal(&format!("{name}: parting from a session"), &then_decode(m, &mut st, l, 2), &{
            let mut st = m.new_state(N_CTX);
            let (l, _) = prefill(m, None, &part, &mut st, 48).unwrap();
            then_decode(m, &mut st, l, 2)
        });
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Bad session files are refused with an error naming the problem, never a panic: truncated,
/// a flipped byte, another version, another model, other numerics, not a session at all, and
/// a file that does not exist. A failed save leaves no file behind.
/// The Qwen3.5 fixture (recurrent states, KV caches, checkpoints) with a session of 60 prompt
/// tokens saved to `dir/good.session`, and the cache and prompt it came from.
fn saved_session(dir: &std::path::Path) -> (Model, std::path::PathBuf, PrefixCache, Vec<u32>) {
    std::fs::create_dir_all(dir).unwrap();
    let mut m = load(&fixture("qwen3_5")).unwrap().model;
    m.set_numerics(Numerics::Fast);
    let a = tokens(m.cfg.vocab, 60, 0x5EED_0021);
    let mut cache = PrefixCache::new(CacheConfig { ram: 1 << 32, every: 32 });
    let mut st = m.new_state(N_CTX);
    prefill(&m, Some(&mut cache), &a, &mut st, 64).unwrap();
    let good = dir.join("good.session");
    let (toks, state, cps) = cache.best_for(&a).unwrap();
    session::save(&good, &m, toks, state, cps).unwrap();
    (m, good, cache, a)
}

/// The format's checksum: FNV-1a 64, eight little-endian bytes a step, the tail byte by byte.
fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        h = (h ^ u64::from_le_bytes(w.try_into().unwrap())).wrapping_mul(0x100_0000_01b3);
    }
    for &b in words.remainder() {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// Fuzzing session files: the saved session mutated by `cortiq_testkit::fuzz`, half of the
/// mutants with their checksum recomputed so the mutations reach the layer-state parsers behind
/// it. Every mutant loads or is refused with an error; none panics (CORTIQ_FUZZ_SECS bounds it).
#[test]
fn fuzz_session_files() {
    let dir = std::env::temp_dir().join(format!("cortiq-fuzz-session-seed-{}", std::process::id()));
    let (m, seed, _, _) = saved_session(&dir);
    assert!(session::load(&seed, &m, N_CTX, u64::MAX).is_ok(), "the seed loads");
    let len = std::fs::metadata(&seed).unwrap().len() as usize;
    cortiq_testkit::fuzz::fuzz_file("session", &seed, "case.session", len, |p| {
        let mut b = std::fs::read(p).unwrap();
        // Sealed again for half of them (chosen by the last byte, itself mutated at random).
        if b.len() > 20 && b[b.len() - 1] % 2 == 0 {
            let n = b.len() - 8;
            let sum = fnv(&b[..n]);
            b[n..].copy_from_slice(&sum.to_le_bytes());
            std::fs::write(p, &b).unwrap();
        }
        let _ = session::load(p, &m, N_CTX, u64::MAX);
    });
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_sessions_are_refused() {
    let dir = std::env::temp_dir().join(format!("cortiq-bad-session-test-{}", std::process::id()));
    let (m, good, cache, a) = saved_session(&dir);
    let (toks, state, cps) = cache.best_for(&a).unwrap();
    let bytes = std::fs::read(&good).unwrap();
    // Written for the owner only; a symlink is not followed; a file past the cap is refused
    // before it is read.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&good).unwrap().permissions().mode() & 0o777, 0o600, "session file mode");
        let link = dir.join("link.session");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        let e = session::load(&link, &m, N_CTX, u64::MAX).err().expect("a symlink is refused").to_string();
        assert!(e.contains("link.session"), "{e}");
    }
    let e = session::load(&good, &m, N_CTX, bytes.len() as u64 - 1).err().expect("past the cap").to_string();
    assert!(e.contains("more than the prompt cache holds"), "{e}");
    assert!(session::load(&good, &m, N_CTX, bytes.len() as u64).is_ok(), "exactly at the cap");
    let write = |name: &str, b: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, b).unwrap();
        p
    };
    let err = |p: &std::path::Path, model: &Model| session::load(p, model, N_CTX, u64::MAX).err().expect("refused").to_string();
    let truncated = write("truncated", &bytes[..bytes.len() - 100]);
    let mut flipped = bytes.clone();
    flipped[bytes.len() / 2] ^= 0x10;
    let flipped = write("flipped", &flipped);
    let mut version = bytes.clone();
    version[8] = 99;
    let version = write("version", &version);
    let text = write("text", b"hello, this is not a session\n");
    let cases = [
        (truncated, "truncated or corrupted"),
        (flipped, "truncated or corrupted"),
        (version, "version 99"),
        (text, "not a cortiq session file"),
        (dir.join("missing"), "No such file"),
    ];
    for (p, want) in &cases {
        let e = err(p, &m);
        println!("{}: {e}", p.display());
        assert!(e.contains(want), "{}: {e:?} should say {want:?}", p.display());
    }
    let other = load(&fixture("qwen3_next")).unwrap().model;
    assert!(err(&good, &other).contains("another model"));
    let mut exact = load(&fixture("qwen3_5")).unwrap().model;
    exact.set_numerics(Numerics::Exact);
    exact.set_kv_type(m.kv_type).unwrap(); // the same cache type: only the numerics differ
    assert!(err(&good, &exact).contains("another model"), "other numerics");
    // Version 1 differs only in an 8-bit cache's keys (stored without per-channel scales): read
    // for the other caches, refused for an 8-bit one. Its header rewritten, checksum recomputed
    // (FNV-1a over 8-byte words, the tail bytewise).
    let fnv = |b: &[u8]| {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        let mut words = b.chunks_exact(8);
        for w in &mut words {
            h = (h ^ u64::from_le_bytes(w.try_into().unwrap())).wrapping_mul(0x100_0000_01b3);
        }
        words.remainder().iter().for_each(|&x| h = (h ^ x as u64).wrapping_mul(0x100_0000_01b3));
        h
    };
    let as_v1 = |b: &[u8]| {
        let mut b = b[..b.len() - 8].to_vec();
        b[8..12].copy_from_slice(&1u32.to_le_bytes());
        let sum = fnv(&b);
        b.extend_from_slice(&sum.to_le_bytes());
        b
    };
    let v1 = write("v1", &as_v1(&bytes));
    assert_eq!(m.kv_type, KvType::F16);
    assert_eq!(session::load(&v1, &m, N_CTX, u64::MAX).expect("a version-1 f16 session").tokens, toks);
    let mut q8 = load(&fixture("qwen3")).unwrap().model; // heads of 32: whole 8-bit blocks
    q8.set_numerics(Numerics::Fast);
    q8.set_kv_type(KvType::Q8).unwrap();
    let a8 = tokens(q8.cfg.vocab, 60, 0x5EED_0022);
    let mut st8 = q8.new_state(N_CTX);
    prefill(&q8, None, &a8, &mut st8, 64).unwrap();
    let good8 = dir.join("good8.session");
    session::save(&good8, &q8, &a8, &st8, &[]).unwrap();
    let v1q8 = write("v1q8", &as_v1(&std::fs::read(&good8).unwrap()));
    assert!(err(&v1q8, &q8).contains("version 1"), "{}", err(&v1q8, &q8));
    // A save into a folder that does not exist fails cleanly and writes nothing.
    let nowhere = dir.join("no/such/dir/x.session");
    assert!(session::save(&nowhere, &m, toks, state, cps).is_err());
    assert!(!nowhere.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Constant-memory decode (StreamingLLM's sinks + window, `--kv-window`): a request with an
/// O(1) plan restores a prefix a plain request cached, prefills the rest, seals at its prompt's
/// end and decodes in constant memory — the same logits, prompt and decode steps, as the same
/// plan run cold; and its own prompt's entry serves the next one. Dense, sliding-window and
/// hybrid models. A skeleton plan is not served from the cache (restores nothing).
#[test]
fn cached_equals_cold_constant_memory() {
    use cortiq_engine::o1::O1Plan;
    use cortiq_engine::o1::nystrom::{DEFAULT_RIDGE, Far, O1Settings, StatePrecision};
    let plan = |tp: usize, far: Far| O1Plan {
        tp,
        settings: O1Settings { window: 24, sinks: 4, landmarks: 8, ridge: DEFAULT_RIDGE, state: StatePrecision::Pair },
        far,
        check: None,
        split: false,
    };
    for name in ["qwen2", "gemma3", "qwen3_5"] {
        let mut m = load(&fixture(name)).unwrap().model;
        m.set_numerics(Numerics::Fast);
        let v = m.cfg.vocab;
        let a = tokens(v, 90, 0x5EED_0031);
        let b: Vec<u32> = [&a[..], &tokens(v, 30, 0x5EED_0032)].concat();
        let c: Vec<u32> = [&b[..], &tokens(v, 12, 0x5EED_0033)].concat();
        let mut cache = PrefixCache::new(CacheConfig { ram: 1 << 32, every: 32 });
        let mut st = m.new_state(N_CTX);
        prefill(&m, Some(&mut cache), &a, &mut st, 64).unwrap();
        let grid = m.cut_grid();
        for (prompt, want) in [(&b, entry_point(a.len(), grid)), (&c, entry_point(b.len(), grid))] {
            let mut st = m.new_state_o1(N_CTX, plan(prompt.len(), Far::Drop)).unwrap();
            let (l, reused) = prefill(&m, Some(&mut cache), prompt, &mut st, 64).unwrap();
            assert_eq!(reused, want, "{name}: an O(1) prompt of {} restores", prompt.len());
            let got = then_decode(&m, &mut st, l, 8);
            assert!(st.o1().is_some() && !st.cacheable(), "{name}: sealed");
            let mut cold_st = m.new_state_o1(N_CTX, plan(prompt.len(), Far::Drop)).unwrap();
            let (l, _) = prefill(&m, None, prompt, &mut cold_st, 48).unwrap();
            assert_bits_equal(
                &format!("{name}: StreamingLLM, {reused} of {} cached", prompt.len()),
                &got,
                &then_decode(&m, &mut cold_st, l, 8),
            );
        }
        let mut st = m.new_state_o1(N_CTX, plan(c.len(), Far::Skeleton)).unwrap();
        let (_, reused) = prefill(&m, Some(&mut cache), &c, &mut st, 64).unwrap();
        assert_eq!(reused, 0, "{name}: a skeleton plan is not served from the cache");
    }
}
