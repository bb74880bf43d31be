//! The `cambium` command-line tool: argument parsing, dispatch, output and exit codes.
//!
//! Exit codes (also in `--help` and the README): 0 success, 1 key or version not
//! found, 2 usage error (including a malformed version name), 3 other errors (bad
//! input data, a version name already taken, a write to a snapshot, missing store,
//! not a store, unsupported format version, I/O), 4 `verify` found problems, 5
//! corruption.

mod args;
mod codec;
mod commands;
mod error;
mod tour;
mod versions;

use args::{Cli, Command};
use clap::Parser;
use codec::Encoding;
use error::{output_error, CliError, EXIT_OK};
use std::io::Write;

/// Settings shared by every command.
pub struct Ctx {
    /// How keys and values are read and printed.
    pub enc: Encoding,
    /// Print JSON.
    pub json: bool,
}

/// Runs the tool on the process's arguments and returns the exit code.
pub fn run() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Usage errors exit 2; --help and --version print to stdout and exit 0.
            let _ = e.print();
            return e.exit_code();
        }
    };
    match dispatch(cli) {
        Ok(()) => EXIT_OK,
        Err(e) => {
            if !e.msg.is_empty() {
                eprintln!("cambium: error: {}", e.msg);
            }
            e.code
        }
    }
}

fn dispatch(cli: Cli) -> Result<(), CliError> {
    let ctx = Ctx {
        enc: if cli.hex {
            Encoding::Hex
        } else {
            Encoding::Text
        },
        json: cli.json,
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let result = match &cli.command {
        Command::Init { dir } => commands::init(dir),
        Command::Put {
            dir,
            key,
            value,
            branch,
        } => commands::put(&ctx, dir, key, value, branch),
        Command::Get { dir, key, at } => commands::get(&ctx, &mut out, dir, key, at.as_deref()),
        Command::Del { dir, key, branch } => commands::del(&ctx, dir, key, branch),
        Command::Scan(a) => commands::scan(&ctx, &mut out, a),
        Command::Batch {
            dir,
            branch,
            commit_every,
        } => {
            let stdin = std::io::stdin();
            let input = std::io::BufReader::with_capacity(1 << 16, stdin.lock());
            commands::batch(&ctx, &mut out, input, dir, branch, *commit_every)
        }
        Command::Checkpoint { dir } => commands::checkpoint(dir),
        Command::Stats { dir } => commands::stats(&ctx, &mut out, dir),
        Command::Verify { dir } => commands::verify(&ctx, &mut out, dir),
        Command::Snapshot { dir, source, name } => {
            versions::snapshot(&ctx, &mut out, dir, source, name)
        }
        Command::Branch { dir, source, name } => {
            versions::branch(&ctx, &mut out, dir, source, name)
        }
        Command::Versions { dir } => versions::versions(&ctx, &mut out, dir),
        Command::Drop { dir, name } => versions::drop(&ctx, &mut out, dir, name),
        Command::Diff {
            dir,
            a,
            b,
            keys_only,
        } => versions::diff(&ctx, &mut out, dir, a, b, *keys_only),
        Command::Tour { keys, keep } => tour::tour(&ctx, &mut out, *keys, *keep),
    };
    // Whatever was printed before a failure still goes out.
    let flushed = out.flush().map_err(output_error);
    result?;
    flushed
}
