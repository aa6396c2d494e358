//! The vmf_phase core (issue 16) against its float64 reference (tools/fixtures/gen_vmf.py: the
//! `llama` fixture with layers 1 and 3 converted, every option of the operator on): the whole
//! sequence, a prefill in uneven chunks and the cached decode steps, as the other fixtures; the
//! decode batch and the k-position verify bit for bit against single steps.

mod common;

use common::{check_parity_tol, fixture};

/// Max |logit − float64 reference|. Measured (this test, --release, AVX-512): see the
/// println of `matches_reference`; the issue asks for 1e-5.
const TOL: f32 = 1e-5;

#[test]
fn matches_reference() {
    check_parity_tol("llama_vmf", &fixture("llama_vmf"), "", TOL);
}

/// The fixture's layers 1 and 3 are vmf_phase layers and nothing else changed.
#[test]
fn config_names_the_converted_layers() {
    let m = cortiq_engine::load::load(&fixture("llama_vmf")).expect("load").model;
    let kinds: Vec<bool> =
        m.cfg.layers.iter().map(|l| matches!(l.mixer, cortiq_engine::config::MixerKind::VmfPhase(_))).collect();
    assert_eq!(kinds, [false, true, false, true]);
    // The recurrent state: 2 states of 16 × 16 and a 3-row conv ring of 64, per vmf layer.
    let st = m.new_state(8);
    assert_eq!(st.bytes_by_kind().recurrent, 2 * (2 * 16 * 16 + 3 * 64) * 4);
}

/// The same model as GGUF (`cortiq.vmf_phase.*` keys, `blk.N.vmf_*` tensors).
#[test]
fn gguf_matches_reference() {
    check_parity_tol("llama_vmf", &fixture("llama_vmf").join("model.gguf"), "", TOL);
}

/// A malformed `vmf_phase` object or GGUF key set is refused with a message naming it.
#[test]
fn bad_configs_are_named() {
    let dir = tempdir();
    let src = fixture("llama_vmf");
    for f in ["model.safetensors", "generation_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let base: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    for (edit, want) in [
        (serde_json::json!({"layers": [1, 9], "nphase": 8}), "names layer 9; the model has 4"),
        (serde_json::json!({"layers": [1], "nphase": 0}), "not a valid geometry"),
        (serde_json::json!({"layers": [1], "nphase": 8, "n_k_heads": 3}), "not a valid geometry"),
        (serde_json::json!({"layers": [1, 1], "nphase": 8}), "names a layer twice"),
        (serde_json::json!({"layers": [1], "nphase": 8, "conv_kernel": 1}), "conv_kernel 1"),
        (serde_json::json!({"layers": [1], "nphase": 8, "phases": 8}), "unknown key 'phases'"),
        (
            serde_json::json!({"layers": [1, 2], "nphase": 8, "window": 8, "windows": [4]}),
            "vmf_phase.windows: 1 entries for 2 layers",
        ),
        (serde_json::json!({"layers": [1], "nphase": 8, "windows": [4]}), "vmf_phase.windows: 1 entries for 1 layers"),
        (serde_json::json!({"layers": [1], "nphase": 8, "window": 8, "windows": [0]}), "one window > 0 per layer"),
        (serde_json::json!({"layers": [1], "nphase": 8, "window": 8, "windows": 4}), "vmf_phase.windows: expected an array"),
        (
            serde_json::json!({"layers": [1, 2], "nphase": 8, "window": 8, "layer_sinks": [4]}),
            "vmf_phase.layer_sinks: 1 entries for 2 layers",
        ),
        (serde_json::json!({"layers": [1], "nphase": 8, "layer_sinks": [4]}), "with the window option on"),
        (
            serde_json::json!({"layers": [1], "nphase": 4, "n_k_heads": 2, "conv_kernel": 4, "k_gate": true, "phase_bias": true}),
            "blk.1.vmf_a_log' has shape [32], expected [16]",
        ),
    ] {
        let mut c = base.clone();
        c["vmf_phase"] = edit.clone();
        assert_refused(&dir, &c, &edit, want);
    }
}

/// `config` written into `dir` (which holds the weights) fails to load, naming `want`.
fn assert_refused(dir: &std::path::Path, config: &serde_json::Value, edit: &serde_json::Value, want: &str) {
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let e = match cortiq_engine::load::load(dir) {
        Ok(_) => panic!("{edit}: loaded"),
        Err(e) => e.to_string(),
    };
    println!("{edit} -> {e}");
    assert!(e.contains(want), "{edit}: {e}");
}

fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("cortiq-vmf-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The core over 96 positions in one call (the chunk-parallel form, 3 chunks) equals 96 single
/// steps (the recurrence) to f32 rounding, on the fixture's layer 1 (random phases up to ±10
/// rad, two states, the gate, the mass); and the states they leave.
#[test]
fn chunked_core_equals_recurrence() {
    use cortiq_engine::mixers::vmf::{VmfPhase, VmfState, core, project};
    let m = cortiq_engine::load::load(&fixture("llama_vmf")).unwrap().model;
    let l: &VmfPhase = m.layers[1].mixer.downcast_ref().expect("layer 1 is vmf_phase");
    let (c, n) = (l.cfg, 96);
    let mut g = 0x9E37_79B9_7F4A_7C15u64;
    let x: Vec<f32> = (0..n * c.d_model)
        .map(|_| {
            g ^= g << 13;
            g ^= g >> 7;
            g ^= g << 17;
            (g >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect();
    let p = project(&c, &l.w, &x, n, false);
    let (mut s_ch, mut s_rec) = (VmfState::new(&c), VmfState::new(&c));
    let o_ch = core(&c, &l.w.core, &p, 0, n, &mut s_ch);
    let o_rec: Vec<f32> = (0..n).flat_map(|t| core(&c, &l.w.core, &p, t, 1, &mut s_rec)).collect();
    let scale = cortiq_testkit::max_abs(&o_rec);
    let (md, at) = common::max_diff(&o_ch, &o_rec);
    let (ms, _) = common::max_diff(&s_ch.s, &s_rec.s);
    let s_scale = cortiq_testkit::max_abs(&s_rec.s);
    println!(
        "llama_vmf layer 1: chunked vs recurrent o {:.2e} relative (at {at}, max |o| {scale:.2}); state {:.2e} relative",
        md / scale,
        ms / s_scale
    );
    assert!(md <= 1e-5 * scale && ms <= 1e-5 * s_scale, "chunked vs recurrent: o {md:e}, state {ms:e}");
}

/// The window option (tools/fixtures/gen_vmf.py --window 12 --sinks 2: layers 1 and 3 keep
/// their attention over 2 sinks and the last 12 positions, the core as one more slot): the
/// whole sequence, uneven prefill chunks and decode steps against the float64 definition.
#[test]
fn window_matches_reference() {
    check_parity_tol("llama_vmfw", &fixture("llama_vmfw"), "", TOL);
}

#[test]
fn window_gguf_matches_reference() {
    check_parity_tol("llama_vmfw", &fixture("llama_vmfw").join("model.gguf"), "", TOL);
}

/// The windowed layers' state is constant: the ring of 2 + 12 positions (keys and values of
/// 2 KV heads × 16, φk of 2 × 16, κ of 2), the core's 2 states of 16 × 16 and its 3-row conv
/// ring of 64 — whatever the sequence's length.
#[test]
fn window_state_is_constant() {
    let m = cortiq_engine::load::load(&fixture("llama_vmfw")).expect("load").model;
    let per_layer = (14 * (2 * 2 * 16 + 2 * 16 + 2) + 2 * 16 * 16 + 3 * 64) * 4;
    for n in [8, 4096] {
        assert_eq!(m.new_state(n).bytes_by_kind().recurrent, 2 * per_layer, "max_len {n}");
    }
}

/// A window plan the layer cannot serve is refused, naming the field.
#[test]
fn bad_window_configs_are_named() {
    let dir = tempdir().join("w");
    std::fs::create_dir_all(&dir).unwrap();
    let src = fixture("llama_vmfw");
    for f in ["model.safetensors", "generation_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let base: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    for (edit, want) in [
        (serde_json::json!({"sinks": 2, "window": 0}), "needs a window"),
        (serde_json::json!({"n_k_heads": 4}), "keeps the attention's heads"),
        (serde_json::json!({"window": null, "sinks": null}), "vmf_v.weight"),
    ] {
        let mut c = base.clone();
        for (k, v) in edit.as_object().unwrap() {
            c["vmf_phase"][k] = v.clone();
        }
        assert_refused(&dir, &c, &edit, want);
    }
}

/// Each layer's window and sinks (`windows`, `layer_sinks`, written by the fold's split) follow
/// their layer when `layers` is given out of order, reach the layer's configuration, and survive
/// the plan's own JSON.
#[test]
fn per_layer_windows_and_sinks_follow_their_layers() {
    use cortiq_engine::mixers::vmf::VmfPlan;
    let cfg = cortiq_engine::load::load(&fixture("llama")).expect("load").model.cfg;
    let v = serde_json::json!({"layers": [3, 1], "nphase": 8, "window": 8, "sinks": 2, "windows": [4, 6], "layer_sinks": [0, 5]});
    let plan = VmfPlan::from_json(&v, &cfg).expect("a valid plan");
    assert_eq!((plan.layers.clone(), plan.windows.clone(), plan.layer_sinks.clone()), (vec![1, 3], vec![6, 4], vec![5, 0]));
    let (a, b) = (plan.layer_config(0), plan.layer_config(1));
    assert_eq!(((a.window, a.sinks), (b.window, b.sinks)), ((6, 5), (4, 0)));
    assert_eq!(VmfPlan::from_json(&plan.to_json(), &cfg).expect("its own JSON"), plan);
}
