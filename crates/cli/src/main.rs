//! The `cortiq` binary: a thin shell over cortiq-engine. Parses flags (clap), initialises
//! logging and hands the subcommand to its module in the cortiq-cli library (`cortiq_cli::run`,
//! `::ppl`, ...), each of which owns its arguments and resolves MODEL (a .gguf file, an HF
//! folder, or a hub model `hf:ORG/REPO[:QUANT]` or known name that is pulled on first use). Errors print as one line `error: ...`
//! with a non-zero exit. A new subcommand is a module in the library, one `Cmd` variant and one
//! arm in `dispatch`.

use anyhow::Result;
use clap::{Parser, Subcommand};
#[cfg(feature = "o1")]
use cortiq_cli::polish;
use cortiq_cli::{bench, convert, logits, ppl, pull, run, serve, tokenize};

#[derive(Parser)]
#[command(name = "cortiq", version, about = "Run language models on the CPU: GGUF files and Hugging Face folders")]
struct Cli {
    /// Log more (debug level); RUST_LOG overrides.
    #[arg(short, long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Fetch a known model (or text), or a hub model (hf:ORG/REPO[:QUANT]), into the cache,
    /// verify its sha256 and print its path.
    Pull(pull::PullArgs),
    /// Generate text: streams only the completion to stdout; timings to stderr.
    Run(run::RunArgs),
    /// Perplexity of a text, with llama-perplexity's method.
    Ppl(ppl::PplArgs),
    /// Write the logits at every position of an exact token sequence to a .npy file [T, vocab].
    Logits(logits::LogitsArgs),
    /// Print the token ids of TEXT, comma-separated.
    Tokenize(tokenize::TokenizeArgs),
    /// Prompt-processing and generation speed, like llama-bench (pp then tg lines, mean ± sd).
    Bench(bench::BenchArgs),
    /// The OpenAI-compatible HTTP server: chat and text completions, streamed or whole, many
    /// sequences decoded together (continuous batching).
    Serve(serve::ServeArgs),
    /// Write cortiq's own model file (.cmf) from a GGUF, an HF folder or a .cmf, optionally
    /// re-quantized (keep, f32, f16, bf16, q8r, q4t, q1).
    Convert(convert::ConvertArgs),
    /// Distill the O(1) student (global attention on the Nyström operator) from the exact
    /// model: train the converted layers' norm gains and FFNs on texts, write a .cmf that
    /// `run` / `ppl` serve in O(1) mode by default.
    #[cfg(feature = "o1")]
    Polish(polish::PolishArgs),
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                std::process::exit(if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand { 2 } else { 0 });
            }
            // One line: clap's first line names the flag and the problem.
            let msg = e.render().to_string();
            eprintln!("{} (see cortiq --help)", msg.lines().next().unwrap_or("error: bad arguments").trim_end());
            std::process::exit(2);
        }
    };
    init_logging(cli.verbose, matches!(cli.cmd, Cmd::Serve(_)));
    if let Err(e) = dispatch(cli.cmd, cli.verbose) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// Warnings only by default; `serve` also logs its one line per request (target cortiq::server).
fn init_logging(verbose: bool, serving: bool) {
    let default = match (verbose, serving) {
        (true, _) => "debug",
        (false, true) => "warn,cortiq::server=info",
        (false, false) => "warn",
    };
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false).init();
}

fn dispatch(cmd: Cmd, verbose: bool) -> Result<()> {
    match cmd {
        Cmd::Pull(a) => pull::cmd_pull(a),
        Cmd::Run(a) => run::cmd_run(a, verbose),
        Cmd::Ppl(a) => ppl::cmd_ppl(a),
        Cmd::Logits(a) => logits::cmd_logits(a),
        Cmd::Tokenize(a) => tokenize::cmd_tokenize(a),
        Cmd::Bench(a) => bench::cmd_bench(a),
        Cmd::Serve(a) => serve::cmd_serve(a),
        Cmd::Convert(a) => convert::cmd_convert(a),
        #[cfg(feature = "o1")]
        Cmd::Polish(a) => polish::cmd_polish(a),
    }
}
