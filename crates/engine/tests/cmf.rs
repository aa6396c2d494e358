//! .cmf round trips on the committed fixtures: converting with `--quant keep` from the HF folder
//! and from its model.gguf twin must give logits bit-for-bit identical to the source (whole
//! sequence and cached decode steps), f16 within a stated tolerance, the same tokenizer ids,
//! EOS set and chat template; malformed files, overwrites and failures behave.

mod common;

use std::path::{Path, PathBuf};

use common::{assert_bits_equal, fixture, ids};
use cortiq_engine::compat::Numerics;
use cortiq_engine::convert::{ConvertOptions, QuantSpec, convert};
use cortiq_engine::load::{Origin, load};
use cortiq_engine::{Logits, Model};
use cortiq_formats::safetensors::HfWeights;
use cortiq_kernels::quant::{QuantType, dequantize_row, quantize_row};
use cortiq_testkit::max_abs_diff as max_diff;

const ARCHES: [&str; 4] = ["llama", "qwen2", "qwen3", "gemma3"];

/// A fresh scratch folder under the system temp dir.
fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cortiq-cmf-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn opts(quant: QuantSpec) -> ConvertOptions {
    ConvertOptions { quant, embeddings: None, f32_as: None, force: false, plain_experts: false }
}

fn conv(src: &Path, out: &Path, o: &ConvertOptions) {
    let r = convert(src, out, o, &|_, _, _| {}).unwrap_or_else(|e| panic!("convert {} failed: {e}", src.display()));
    println!("  {} -> {} ({} tensors, {} bytes, {:?})", src.display(), out.display(), r.tensors, r.bytes, r.by_dtype);
}

/// Logits of the whole token sequence, then of 8 cached greedy decode steps, concatenated.
fn run(m: &Model, tokens: &[u32]) -> Vec<f32> {
    common::logits_then_greedy(m, tokens)
}

#[test]
fn keep_from_hf_and_gguf_is_bit_identical() {
    // Every numerics mode: the llama.cpp one also depends on which tensors are tied.
    keep_bit_identical("keep", &ARCHES, &[Numerics::Exact, Numerics::Fast, Numerics::LlamaCpp]);
}

/// The architectures whose HF checkpoints need more than renames (Granite's fused experts,
/// gpt-oss's fused and transposed ones, derived at load: `Arch::hf_fix`) and the newer ones:
/// `--quant keep` from the HF folder and from the GGUF gives the source's logits bit for bit
/// (fast and exact numerics: gpt-oss's sinks refuse llama.cpp's).
#[test]
fn keep_is_bit_identical_for_derived_checkpoint_layouts() {
    let arches = ["granitemoehybrid", "gpt_oss", "lfm2_moe", "smollm3", "nemotron_h", "mistral", "ministral3", "falcon_h1"];
    keep_bit_identical("keep-derived", &arches, &[Numerics::Exact, Numerics::Fast]);
}

/// Each fixture of `arches`, from its HF folder and its GGUF, converted with `--quant keep`:
/// the .cmf's logits equal the source's under every numerics mode of `modes`, bit for bit.
fn keep_bit_identical(tag: &str, arches: &[&str], modes: &[Numerics]) {
    let dir = scratch(tag);
    for &arch in arches {
        let fx = fixture(arch);
        let tokens = ids(&fx.join("tokens.json"));
        for (what, src) in [("hf", fx.clone()), ("gguf", fx.join("model.gguf"))] {
            let out = dir.join(format!("{arch}-{what}.cmf"));
            conv(&src, &out, &opts(QuantSpec::Keep));
            let mut want = load(&src).unwrap().model;
            let mut loaded = load(&out).unwrap();
            assert!(matches!(loaded.origin, Origin::Cmf(_)), "{arch}/{what}: .cmf not detected");
            for &num in modes {
                want.set_numerics(num);
                loaded.model.set_numerics(num);
                assert_bits_equal(
                    &format!("{arch} {what} -> cmf keep, {num:?}"),
                    &run(&loaded.model, &tokens),
                    &run(&want, &tokens),
                );
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A mixture's experts stored interleaved (the default) and row-major (`plain_experts`) convert
/// into each other: a .cmf re-converted with the other layout holds, tensor by tensor, the
/// bytes of the direct conversion to that layout (the row-major bytes come back from the
/// interleaved ones exactly), and only the experts are interleaved.
#[test]
fn expert_layouts_convert_into_each_other() {
    use cortiq_formats::cmf::Cmf;
    let dir = scratch("layouts");
    let q8 = |plain: bool| ConvertOptions { plain_experts: plain, ..opts(QuantSpec::To(QuantType::Q8_0)) };
    let keep = |plain: bool| ConvertOptions { plain_experts: plain, ..opts(QuantSpec::Keep) };
    let (il, plain) = (dir.join("il.cmf"), dir.join("plain.cmf"));
    conv(&fixture("qwen3_moe"), &il, &q8(false));
    conv(&fixture("qwen3_moe"), &plain, &q8(true));
    let (il_back, plain_back) = (dir.join("il-from-plain.cmf"), dir.join("plain-from-il.cmf"));
    conv(&plain, &il_back, &keep(false));
    conv(&il, &plain_back, &keep(true));
    let same = |a: &Path, b: &Path| {
        let (a, b) = (Cmf::open(a).unwrap(), Cmf::open(b).unwrap());
        assert_eq!(a.tensors.len(), b.tensors.len());
        for (x, y) in a.tensors.iter().zip(&b.tensors) {
            assert_eq!((&x.name, x.interleaved), (&y.name, y.interleaved));
            assert!(a.tensor_data(x) == b.tensor_data(y), "{}: bytes differ", x.name);
        }
        a.tensors.iter().filter(|t| t.interleaved).map(|t| t.name.clone()).collect::<Vec<_>>()
    };
    let interleaved = same(&il, &il_back);
    assert!(!interleaved.is_empty() && interleaved.iter().all(|n| n.contains("_exps.")), "interleaved: {interleaved:?}");
    assert!(same(&plain, &plain_back).is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Detection is by content: a .cmf named model.gguf still opens as one.
#[test]
fn detected_by_magic_not_extension() {
    let dir = scratch("magic");
    let out = dir.join("looks-like.gguf");
    conv(&fixture("qwen3").join("model.gguf"), &out, &opts(QuantSpec::Keep));
    assert!(matches!(load(&out).unwrap().origin, Origin::Cmf(_)));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// f16 storage: the fixtures' f32 weights rounded to f16 (relative error ≤ 2^-11 per weight).
/// Tolerance 2e-2 on logits of magnitude ≤ ~8: two orders above what the rounding moves them
/// by in practice (printed), far below a broken conversion (O(1)). Widening the f16 file back to
/// f32 must then be exact: the same logits bit for bit.
#[test]
fn f16_within_tolerance_and_widening_back_is_exact() {
    const TOL_F16: f32 = 2e-2;
    let dir = scratch("f16");
    for arch in ARCHES {
        let fx = fixture(arch);
        let tokens = ids(&fx.join("tokens.json"));
        let half = dir.join(format!("{arch}-f16.cmf"));
        conv(&fx, &half, &opts(QuantSpec::To(QuantType::F16)));
        let loaded = load(&half).unwrap();
        let c = match &loaded.origin {
            Origin::Cmf(c) => c,
            _ => panic!("not a cmf"),
        };
        for t in &c.tensors {
            let want = if t.dims.len() == 1 { QuantType::F32 } else { QuantType::F16 };
            assert_eq!(t.dtype, want, "{arch}: tensor {} stored as {}", t.name, t.dtype);
        }
        let got = run(&loaded.model, &tokens);
        let want = run(&load(&fx).unwrap().model, &tokens);
        let (md, at) = max_diff(&got, &want);
        println!("{arch}: f16 .cmf vs f32 source: max logit diff {md:.3e} at {at} (tolerance {TOL_F16})");
        assert!(md <= TOL_F16, "{arch}: f16 logits max diff {md:.3e} at {at} exceeds {TOL_F16}");

        let wide = dir.join(format!("{arch}-f16-to-f32.cmf"));
        conv(&half, &wide, &opts(QuantSpec::To(QuantType::F32)));
        assert_bits_equal(&format!("{arch} f16 cmf -> f32 cmf"), &run(&load(&wide).unwrap().model, &tokens), &got);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// --f32-as: the f32 matrices take the given type, the others keep their bytes.
#[test]
fn f32_matrices_take_their_own_type() {
    let dir = scratch("f32as");
    let mixed = dir.join("mixed.cmf");
    let o = ConvertOptions {
        quant: QuantSpec::To(QuantType::F16),
        embeddings: Some(QuantSpec::To(QuantType::F32)),
        f32_as: None,
        force: false,
        plain_experts: false,
    };
    conv(&fixture("llama"), &mixed, &o);
    let out = dir.join("q8.cmf");
    let o = ConvertOptions {
        quant: QuantSpec::Keep,
        embeddings: None,
        f32_as: Some(QuantType::Q8_0),
        force: false,
        plain_experts: false,
    };
    conv(&mixed, &out, &o);
    let (a, b) = (load(&mixed).unwrap(), load(&out).unwrap());
    let (Origin::Cmf(a), Origin::Cmf(b)) = (&a.origin, &b.origin) else { panic!("not a cmf") };
    let mut seen_q8 = 0;
    for (ta, tb) in a.tensors.iter().zip(&b.tensors) {
        assert_eq!(ta.name, tb.name);
        let want = match (ta.dims.len(), ta.dtype) {
            (1, _) => QuantType::F32,
            (_, QuantType::F32) => QuantType::Q8_0,
            (_, t) => t,
        };
        assert_eq!(tb.dtype, want, "{}", tb.name);
        if want == QuantType::Q8_0 {
            seen_q8 += 1;
        } else {
            assert_eq!(a.tensor_data(ta), b.tensor_data(tb), "{}: bytes kept", ta.name);
        }
    }
    assert!(seen_q8 >= 1, "the f32 vocabulary matrix was re-typed");
}

/// --keep-embeddings-as: the vocabulary matrix takes its own type, everything else --quant.
#[test]
fn embeddings_type_applies_to_the_vocabulary_matrices() {
    let dir = scratch("embd");
    for arch in ["llama", "gemma3"] {
        let out = dir.join(format!("{arch}.cmf"));
        let o = ConvertOptions {
            quant: QuantSpec::To(QuantType::F16),
            embeddings: Some(QuantSpec::To(QuantType::F32)),
            f32_as: None,
            force: false,
            plain_experts: false,
        };
        conv(&fixture(arch), &out, &o);
        let l = load(&out).unwrap();
        let Origin::Cmf(c) = &l.origin else { panic!("not a cmf") };
        for t in &c.tensors {
            let want = if t.dims.len() == 1 || t.name == "token_embd.weight" || t.name == "output.weight" {
                QuantType::F32
            } else {
                QuantType::F16
            };
            assert_eq!(t.dtype, want, "{arch}: {} stored as {}", t.name, t.dtype);
        }
        assert!(c.tensor("token_embd.weight").is_some());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// cortiq's own types (q8r, q4t, q1): every stored row is exactly the kernels' quantization of
/// the source row (widened to f32), rows that are not whole blocks fall back to f16 (listed in
/// the report), 1-D tensors stay f32; the model loads and its logits are printed against the
/// source's (the accuracy budget of each type is the kernels' tests' business).
#[test]
fn own_types_store_the_kernels_quantization_of_each_row() {
    let dir = scratch("own");
    for ty in QuantType::OWN {
        let mut total = 0;
        for arch in ARCHES {
            let fx = fixture(arch);
            let out = dir.join(format!("{arch}-{ty}.cmf"));
            let report = convert(&fx, &out, &opts(QuantSpec::To(ty)), &|_, _, _| {}).unwrap();
            let loaded = load(&out).unwrap();
            let Origin::Cmf(c) = &loaded.origin else { panic!("not a cmf") };
            let w = HfWeights::open_dir(&fx).unwrap();
            let (mut quantized, mut fell_back) = (0, 0);
            for name in w.names() {
                let Some(gname) = cortiq_engine::arch::by_any_name(arch).unwrap().names.hf_to_gguf(name) else { continue };
                let src = w.tensor(name).unwrap();
                let t = c.tensor(&gname).unwrap_or_else(|| panic!("{arch}/{ty}: {gname} missing"));
                if src.shape.len() == 1 {
                    assert_eq!(t.dtype, QuantType::F32, "{arch}/{ty}: 1-D {gname}");
                    continue;
                }
                let cols = src.shape[1];
                if ty.row_bytes(cols).is_none() {
                    assert_eq!(t.dtype, QuantType::F16, "{arch}/{ty}: {gname} ({cols} cols) should fall back");
                    assert!(
                        report.fallbacks.iter().any(|f| f.starts_with(&gname)),
                        "{arch}/{ty}: fallback of {gname} not reported"
                    );
                    fell_back += 1;
                    continue;
                }
                assert_eq!(t.dtype, ty, "{arch}/{ty}: {gname}");
                let (srb, rb) = (src.dtype.row_bytes(cols).unwrap(), ty.row_bytes(cols).unwrap());
                let stored = c.tensor_data(t);
                let mut wide = vec![0f32; cols];
                let mut want = vec![0u8; rb];
                for r in 0..src.shape[0] {
                    dequantize_row(src.dtype, &src.data[r * srb..(r + 1) * srb], &mut wide);
                    quantize_row(ty, &wide, &mut want).unwrap();
                    assert!(stored[r * rb..(r + 1) * rb] == want[..], "{arch}/{ty}: {gname} row {r} differs from quantize_row");
                }
                quantized += 1;
            }
            println!("{arch}/{ty}: {quantized} tensors quantized row-exact, {fell_back} fell back to f16");
            total += quantized;
        }
        // The fixtures are tiny (64-wide llama); q4t/q1's 128-element blocks fit only some rows.
        assert!(total > 0, "{ty}: nothing was quantized in any fixture");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

const SAMPLES: &[&str] = &[
    "Hello world! The quick brown fox jumps over the lazy dog, 1234567 times.",
    "  leading spaces\tand tabs\nnew lines <|im_start|>user\nhi<|im_end|> <end_of_turn> <s>",
    "Unicode: naïve café, 東京, emoji 🦀, Ελληνικά",
];

/// The same tokenizer behaviour from the .cmf as from its source: ids and decoding of the
/// samples, vocabulary, BOS, end-of-generation set and chat template; or, where the source's
/// tokenizer cannot be built (some fixture GGUFs carry a partial vocabulary), the same error.
fn same_tokenizer(what: &str, src: &Path, out: &Path, texts: &[&str]) {
    let a = load(src).unwrap().tokenizer();
    let b = load(out).unwrap().tokenizer();
    let (a, b) = match (a, b) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(ea), Err(eb)) => {
            let (ea, eb) = (ea.to_string(), eb.to_string());
            println!("{what}: both tokenizers refuse: {ea}");
            assert_eq!(ea.replace(&src.display().to_string(), "FILE"), eb.replace(&out.display().to_string(), "FILE"));
            return;
        }
        (a, b) => panic!("{what}: source tokenizer {:?} but .cmf tokenizer {:?}", a.err(), b.err()),
    };
    for s in texts {
        let (ia, ib) = (a.encode(s, true).unwrap(), b.encode(s, true).unwrap());
        assert_eq!(ia, ib, "{what}: ids of {s:?}");
        assert_eq!(
            a.encode_with(s, false, false).unwrap(),
            b.encode_with(s, false, false).unwrap(),
            "{what}: literal ids of {s:?}"
        );
        assert_eq!(a.decode(&ia), b.decode(&ib), "{what}: decode of {s:?}");
    }
    assert_eq!(a.vocab_size(), b.vocab_size(), "{what}: vocab");
    assert_eq!(a.eos_ids(), b.eos_ids(), "{what}: end-of-generation ids");
    assert_eq!((a.bos_id(), a.add_bos()), (b.bos_id(), b.add_bos()), "{what}: bos");
    assert_eq!(a.chat_template(), b.chat_template(), "{what}: chat template");
    println!(
        "{what}: {} texts encode identically; vocab {}; chat template {} chars",
        texts.len(),
        a.vocab_size(),
        a.chat_template().map_or(0, str::len)
    );
}

#[test]
fn tokenizer_and_chat_template_survive_gguf_conversion() {
    let dir = scratch("tok-gguf");
    for arch in ARCHES {
        let src = fixture(arch).join("model.gguf");
        let out = dir.join(format!("{arch}.cmf"));
        conv(&src, &out, &opts(QuantSpec::Keep));
        same_tokenizer(arch, &src, &out, SAMPLES);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The real models' GGUFs (from the model cache; a missing model fails the test, naming the
/// path: `scripts/test` pulls them first): keep-conversion gives the same tokenizer on the
/// tokenizer tests' texts, chat template included, and the same first-token logits bit for bit.
#[test]
fn real_models_keep_tokenizer_template_and_logits() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../formats/tests/data/tokenizer");
    let dir = scratch("real");
    for name in ["gemma3", "smollm2", "qwen2.5-coder"] {
        let fx: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(data.join(format!("{name}.json"))).unwrap()).unwrap();
        let src = cortiq_testkit::real_model(fx["model_file"].as_str().unwrap());
        let out = dir.join(format!("{name}.cmf"));
        conv(&src, &out, &opts(QuantSpec::Keep));
        let texts: Vec<&str> = fx["cases"].as_array().unwrap().iter().map(|c| c["text"].as_str().unwrap()).collect();
        same_tokenizer(name, &src, &out, &texts);
        let prompt = load(&src).unwrap().tokenizer().unwrap().encode("The capital of France is", true).unwrap();
        let first = |p: &Path, num: Numerics| {
            let mut m = load(p).unwrap().model;
            m.set_numerics(num);
            let mut st = m.new_state(prompt.len());
            m.forward(&prompt, &mut st, Logits::Last).unwrap()
        };
        for num in [Numerics::Exact, Numerics::Fast] {
            assert_bits_equal(&format!("{name} first-token logits, {num:?}"), &first(&out, num), &first(&src, num));
        }
        std::fs::remove_file(&out).unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An HF folder's tokenizer.json + tokenizer_config.json (with its chat template) travel
/// verbatim: the fixture's qwen2 folder with the tokenizer test data's byte-level tokenizer.
#[test]
fn tokenizer_and_chat_template_survive_hf_conversion() {
    let dir = scratch("tok-hf");
    let folder = dir.join("qwen2-with-tokenizer");
    std::fs::create_dir_all(&folder).unwrap();
    for e in std::fs::read_dir(fixture("qwen2")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, folder.join(p.file_name().unwrap())).unwrap();
    }
    let tok_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../formats/tests/data/tokenizer/hf");
    std::fs::copy(tok_dir.join("bytelevel.tokenizer.json"), folder.join("tokenizer.json")).unwrap();
    std::fs::copy(tok_dir.join("bytelevel.tokenizer_config.json"), folder.join("tokenizer_config.json")).unwrap();
    let out = dir.join("qwen2.cmf");
    conv(&folder, &out, &opts(QuantSpec::Keep));
    same_tokenizer("qwen2 + byte-level tokenizer.json", &folder, &out, SAMPLES);
    let t = load(&out).unwrap().tokenizer().unwrap();
    assert!(t.chat_template().is_some_and(|t| t.contains("<|im_start|>")), "chat template lost");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn refuses_to_overwrite_without_force_and_leaves_no_temp_file() {
    let dir = scratch("force");
    let src = fixture("llama").join("model.gguf");
    let out = dir.join("m.cmf");
    conv(&src, &out, &opts(QuantSpec::Keep));
    let before = std::fs::read(&out).unwrap();
    let e = convert(&src, &out, &opts(QuantSpec::To(QuantType::F16)), &|_, _, _| {}).unwrap_err().to_string();
    println!("second convert: {e}");
    assert!(e.contains("--force") && e.contains("m.cmf"), "error should name the file and --force: {e}");
    assert_eq!(std::fs::read(&out).unwrap(), before, "refused conversion changed the file");
    let mut o = opts(QuantSpec::To(QuantType::F16));
    o.force = true;
    conv(&src, &out, &o);
    assert_ne!(std::fs::read(&out).unwrap(), before, "forced conversion did not replace the file");
    // A conversion failing before any tensor (an unsupported source) leaves nothing either.
    let bogus = dir.join("not-a-model.bin");
    std::fs::write(&bogus, b"definitely not a model").unwrap();
    assert!(convert(&bogus, &dir.join("x.cmf"), &opts(QuantSpec::Keep), &|_, _, _| {}).is_err());
    let names: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(sorted, ["m.cmf", "not-a-model.bin"], "unexpected files left: {names:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn progress_reports_every_tensor() {
    let dir = scratch("progress");
    let seen = std::cell::RefCell::new(Vec::new());
    let r = convert(&fixture("qwen3"), &dir.join("q.cmf"), &opts(QuantSpec::Keep), &|d, n, name| {
        seen.borrow_mut().push((d, n, name.to_string()))
    })
    .unwrap();
    let seen = seen.into_inner();
    assert_eq!(seen.len(), r.tensors + 1);
    assert!(seen.iter().enumerate().all(|(i, (d, n, _))| *d == i && *n == r.tensors));
    assert!(seen[..r.tensors].iter().all(|(_, _, name)| !name.is_empty()));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Damaged files are one-line errors naming the file (and the tensor when one is at fault)
/// through the engine's loader too: never a panic.
#[test]
fn damaged_files_are_one_line_errors() {
    let dir = scratch("damaged");
    let good = dir.join("good.cmf");
    conv(&fixture("gemma3").join("model.gguf"), &good, &opts(QuantSpec::Keep));
    let bytes = std::fs::read(&good).unwrap();
    let last = match &load(&good).unwrap().origin {
        Origin::Cmf(c) => c.tensors.iter().max_by_key(|t| t.offset).unwrap().name.clone(),
        _ => panic!(),
    };
    let cases: Vec<(&str, Vec<u8>, Vec<&str>)> = vec![
        ("truncated", bytes[..bytes.len() - 100].to_vec(), vec!["truncated", last.as_str()]),
        ("empty", Vec::new(), vec!["truncated"]),
        ("bad-magic", [b"CORTIQMX".as_slice(), &bytes[8..]].concat(), vec![]),
    ];
    for (tag, data, want) in cases {
        let p = dir.join(format!("{tag}.cmf"));
        std::fs::write(&p, &data).unwrap();
        let e = match load(&p) {
            Ok(_) => panic!("{tag}: loaded"),
            Err(e) => e.to_string(),
        };
        println!("{tag}: {e}");
        assert!(!e.contains('\n'), "{tag}: multi-line error: {e}");
        assert!(e.contains(&p.display().to_string()), "{tag}: error does not name the file: {e}");
        for w in want {
            assert!(e.contains(w), "{tag}: error lacks '{w}': {e}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
