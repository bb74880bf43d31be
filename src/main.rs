//! The `cambium` command-line tool; see `cambium --help` and the README.

mod cli;

fn main() {
    std::process::exit(cli::run());
}
