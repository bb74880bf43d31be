//! The `cambium` command-line tool; see `cambium --help` and the README.

mod cli;

/// See the `mimalloc` feature in Cargo.toml: the engine's node buffers are 4-8 KiB
/// allocations made and freed at a high rate, which glibc's malloc serves slowly from
/// a heap a large load has fragmented.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(cli::run());
}
