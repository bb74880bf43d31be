//! Command-line syntax (clap derive).

use super::error::EXIT_CODES_HELP;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// cambium: an embedded, crash-safe, copy-on-write versioned key-value store.
///
/// A store is a directory. Keys and values are UTF-8 text on the command line and on
/// stdin unless --hex is given; output prints them back the same way (text is printed
/// raw, so a value holding a tab or newline is printed as it is: use --hex or --json
/// when that matters).
#[derive(Debug, Parser)]
#[command(name = "cambium", version, after_help = EXIT_CODES_HELP)]
pub struct Cli {
    /// Keys and values are hex digits: read them (arguments and batch stdin) as hex
    /// and print them as hex.
    #[arg(long, global = true)]
    pub hex: bool,

    /// Print output as JSON (one object per line for scan, diff and batch).
    #[arg(long, global = true)]
    pub json: bool,

    /// When another process is writing to the store, wait for it to finish (at most
    /// SECONDS, if given) instead of failing at once. Reading commands never wait:
    /// they read beside a writer.
    #[arg(
        long,
        global = true,
        value_name = "SECONDS",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "forever",
        value_parser = parse_wait
    )]
    pub wait: Option<std::time::Duration>,

    #[command(subcommand)]
    pub command: Command,
}

/// `--wait`'s value: seconds (fractions allowed), or `forever` when given bare.
fn parse_wait(s: &str) -> Result<std::time::Duration, String> {
    if s == "forever" {
        return Ok(std::time::Duration::MAX);
    }
    s.parse::<f64>()
        .ok()
        .and_then(|secs| std::time::Duration::try_from_secs_f64(secs).ok())
        .ok_or_else(|| format!("{s:?} is not a number of seconds"))
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a new, empty store in DIR (created if missing).
    Init {
        /// The store directory.
        dir: PathBuf,
    },
    /// Set KEY to VALUE in one durable transaction.
    Put {
        /// The store directory.
        dir: PathBuf,
        /// The key (1 to 2048 bytes).
        key: String,
        /// The value (up to 1 GiB).
        value: String,
        /// The branch to write to (`--at` is accepted too, as for reads).
        #[arg(long, short, alias = "at", value_name = "B", default_value = cambium::MAIN_BRANCH)]
        branch: String,
    },
    /// Print KEY's value (and a newline); exit 1 if the key is absent.
    ///
    /// With --stdin, read keys from stdin instead, one per line (hex under --hex; blank
    /// lines are skipped and a trailing CR is dropped), look them all up in one read
    /// transaction, and print `key<TAB>value` (or the JSON object under --json) for
    /// every key found, in input order. Keys not found print nothing; the exit code is
    /// 0 if every key was found, 1 if any was missing (with a count on stderr), 3 for a
    /// line that is not a valid key (naming it).
    Get {
        /// The store directory.
        dir: PathBuf,
        /// The key.
        #[arg(required_unless_present = "stdin")]
        key: Option<String>,
        /// Read this version (branch or snapshot) instead of main.
        #[arg(long, value_name = "VERSION")]
        at: Option<String>,
        /// Read the keys from stdin, one per line, instead of KEY.
        #[arg(long, conflicts_with = "key")]
        stdin: bool,
    },
    /// Delete KEY in one durable transaction; exit 1 if it did not exist.
    #[command(alias = "delete")]
    Del {
        /// The store directory.
        dir: PathBuf,
        /// The key.
        key: String,
        /// The branch to write to (`--at` is accepted too, as for reads).
        #[arg(long, short, alias = "at", value_name = "B", default_value = cambium::MAIN_BRANCH)]
        branch: String,
    },
    /// Print key/value pairs in key order, one `key<TAB>value` line each.
    Scan(ScanArgs),
    /// Apply put/del operations read from stdin, one per line.
    ///
    /// Each line is `put<TAB>key<TAB>value` or `del<TAB>key`; blank lines are skipped
    /// and a trailing CR is dropped. All operations form one transaction, unless
    /// --commit-every N is given: then every N operations are committed durably and
    /// `committed <ops-so-far>` is printed after each commit returns. At the end the
    /// rest is committed and `committed <total>` is printed. A malformed line
    /// (unknown operation, wrong number of fields, bad hex, empty or oversized key)
    /// stops the batch with an error naming the line and exit code 3; the operations
    /// of the transaction in progress are not committed (earlier commits stay).
    Batch {
        /// The store directory.
        dir: PathBuf,
        /// The branch to write to (`--at` is accepted too, as for reads).
        #[arg(long, short, alias = "at", value_name = "B", default_value = cambium::MAIN_BRANCH)]
        branch: String,
        /// Commit (durably) after every N operations.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        commit_every: Option<u64>,
    },
    /// Write everything committed so far into the tree files and trim the WAL.
    Checkpoint {
        /// The store directory.
        dir: PathBuf,
    },
    /// Print sizes, node counts, tree depth, segments, live/dead bytes, cache hit
    /// rate and WAL size.
    Stats {
        /// The store directory.
        dir: PathBuf,
    },
    /// Check the whole store (fsck): every node, extent and WAL record.
    ///
    /// Exits 0 when the store is clean, 4 with a report when problems were found
    /// (including a store too damaged to open).
    Verify {
        /// The store directory.
        dir: PathBuf,
    },
    /// Make a read-only version NAME of SOURCE (a branch or a snapshot), in constant
    /// time: it shares all of SOURCE's data.
    Snapshot {
        /// The store directory.
        dir: PathBuf,
        /// The version to copy (a branch or a snapshot).
        source: String,
        /// The new snapshot's name: 1 to 255 of the characters A-Z a-z 0-9 . _ - /,
        /// not starting with '-' or '.'.
        name: String,
    },
    /// Make a writable clone NAME of SOURCE (a branch or a snapshot), in constant
    /// time; the two then change independently.
    Branch {
        /// The store directory.
        dir: PathBuf,
        /// The version to copy (a branch or a snapshot).
        source: String,
        /// The new branch's name: 1 to 255 of the characters A-Z a-z 0-9 . _ - /,
        /// not starting with '-' or '.'.
        name: String,
    },
    /// List every version as a tree (each under the version it was made from), with
    /// its kind, creation time, space and key count.
    ///
    /// REFERENCED is the bytes of data the version can reach; EXCLUSIVE the bytes only
    /// it reaches (what dropping it would free). With --json, prints one JSON array
    /// of objects with `parent`/`parent_id` links.
    Versions {
        /// The store directory.
        dir: PathBuf,
    },
    /// Remove a version and reclaim the space only it used. Versions made from it
    /// keep all their data.
    Drop {
        /// The store directory.
        dir: PathBuf,
        /// The version to remove.
        name: String,
    },
    /// Print the keys added, removed and changed from version A to version B, in key
    /// order: `+ key value`, `- key`, `~ key new-value` lines.
    ///
    /// With --keys-only the lines are `+ key`, `- key`, `~ key`. With --json, one
    /// object per line: {"op":"+","key":..,"value":..}, {"op":"-","key":..},
    /// {"op":"~","key":..,"value":..} (the new value).
    Diff {
        /// The store directory.
        dir: PathBuf,
        /// The older version.
        a: String,
        /// The newer version.
        b: String,
        /// Print only the operation and the key.
        #[arg(long)]
        keys_only: bool,
    },
    /// Run the cleaner now: move the live blocks out of the segments with the most
    /// dead space, then delete them. Prints bytes moved and freed.
    ///
    /// Segments are chosen by cost-benefit (space freed times age, over the cost of
    /// moving the live part) until dead bytes are below PCT percent of the segment
    /// bytes. Every version keeps its data and its sharing.
    Clean {
        /// The store directory.
        dir: PathBuf,
        /// Stop once dead bytes are below this percentage of the segment bytes.
        #[arg(long, value_name = "PCT", default_value_t = 10.0, value_parser = parse_percent)]
        until_dead_below: f64,
    },
    /// Rewrite a version's tree nodes in key order, so its scans read sequentially
    /// (every version when none is named). Nodes shared with other versions stay
    /// shared.
    Defrag {
        /// The store directory.
        dir: PathBuf,
        /// The version to defragment (default: every version).
        version: Option<String>,
    },
    /// Move every live block out of segments holding dead bytes (over 1/64 of the
    /// segment) and delete them, so the store's footprint drops to about its live
    /// data. Prints the old and new footprint. A second shrink moves next to nothing.
    Shrink {
        /// The store directory.
        dir: PathBuf,
    },
    /// Print who references the live blocks of one segment: for each block its
    /// address, kind (leaf, branch or value), size and key, the parent nodes that
    /// point at it, and the versions that reach it.
    Backrefs {
        /// The store directory.
        dir: PathBuf,
        /// The segment's number: decimal, or hex with 0x as in its file name
        /// (seg-0000000a.dat is 10 or 0xa).
        #[arg(long, value_name = "N", value_parser = parse_segment)]
        segment: u32,
        /// Only the blocks this version reaches (branch or snapshot).
        #[arg(long, value_name = "VERSION")]
        at: Option<String>,
    },
    /// Thin block volumes: disk images as trees of blocks, with instant snapshots
    /// and clones.
    #[command(subcommand)]
    Volume(VolumeCommand),
    /// Serve every volume (and volume snapshot, read-only) over NBD, under its name,
    /// until SIGTERM or SIGINT.
    ///
    /// Without --socket or --listen, listens on the Unix socket nbd.sock in DIR.
    /// While it runs, the volume, snapshot, branch and drop commands on DIR are run by
    /// the server (through DIR/control.sock), and what they make is exported at once.
    Serve {
        /// The store directory.
        dir: PathBuf,
        /// Listen on this Unix socket (a stale one left by a killed server is replaced).
        #[arg(long, value_name = "PATH", conflicts_with = "listen")]
        socket: Option<PathBuf>,
        /// Listen on this TCP address, e.g. 127.0.0.1:10809.
        #[arg(long, value_name = "ADDR:PORT")]
        listen: Option<String>,
        /// Poll a connection's socket for up to this many microseconds for its next
        /// request before sleeping (adapting to the client; an idle connection does
        /// not poll). Faster answers at queue depth 1 for some CPU; 0 turns it off.
        #[arg(long, value_name = "MICROSECONDS", default_value_t = 64,
              value_parser = clap::value_parser!(u64).range(0..=10_000))]
        poll_max_us: u64,
        /// Write zeros ahead of the volumes' data, so that a client's flushes of
        /// small writes commit no file-system metadata: faster flushes (+13% IOPS
        /// for 4 KiB writes flushed every 16, ext4), every data byte written twice.
        #[arg(long)]
        zeros_ahead: bool,
        /// Make a flush's small writes durable by copying them into the log (one
        /// file synced per flush instead of two): shorter flushes on some disks,
        /// every such data byte written two or three times (the log's zeros ahead).
        #[arg(long)]
        log_small_writes: bool,
        /// Turn transparent huge pages off for the large write buffers too (the
        /// heap never uses them): direct writes of large buffers then go out in
        /// more, smaller requests (1 MiB sequential writes about half as fast on
        /// a virtio disk). For systems where huge pages misbehave.
        #[arg(long)]
        no_huge_pages: bool,
    },
    /// A guided tour: create a store in a temporary directory, load data, read it
    /// back, show stats, make and compare versions, verify it, and explain each step.
    Tour {
        /// Keys to load.
        #[arg(long, value_name = "N", default_value_t = 100_000,
              value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
        keys: u64,
        /// Keep the store directory afterwards (its path is printed).
        #[arg(long)]
        keep: bool,
    },
}

/// `volume` subcommands.
#[derive(Debug, Subcommand)]
pub enum VolumeCommand {
    /// Make a new, empty volume: every block reads as zeroes and takes no space.
    Create {
        /// The store directory.
        dir: PathBuf,
        /// The volume's name (as a version name).
        name: String,
        /// Its size: bytes, or with a suffix K, M, G, T, P (powers of 1024), e.g. 10G.
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        size: u64,
        /// The block size: a power of two from 512 to 1M.
        #[arg(long, value_name = "SIZE", default_value = "4K", value_parser = parse_size)]
        block_size: u64,
    },
    /// List the volumes and volume snapshots: size, allocated bytes, bytes only each
    /// references (EXCLUSIVE: what dropping it frees) and bytes shared with others.
    List {
        /// The store directory.
        dir: PathBuf,
    },
    /// Make a read-only snapshot NAME of VOLUME, in constant time.
    Snapshot {
        /// The store directory.
        dir: PathBuf,
        /// The volume.
        volume: String,
        /// The snapshot's name.
        name: String,
    },
    /// Make a writable volume NAME from SOURCE (a volume or a snapshot), in constant
    /// time; the two share every block until one of them writes it.
    Clone {
        /// The store directory.
        dir: PathBuf,
        /// The volume or snapshot to copy.
        source: String,
        /// The new volume's name.
        name: String,
    },
    /// Remove a volume or snapshot; the space only it used comes back.
    Drop {
        /// The store directory.
        dir: PathBuf,
        /// The volume or snapshot.
        name: String,
    },
    /// Change a volume's size; shrinking discards the blocks past the new end.
    Resize {
        /// The store directory.
        dir: PathBuf,
        /// The volume.
        name: String,
        /// The new size (e.g. 20G).
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        size: u64,
    },
    /// Make a new volume NAME from a raw image FILE; zero blocks stay holes. The
    /// volume's size is the image's, rounded up to whole blocks.
    Import {
        /// The store directory.
        dir: PathBuf,
        /// The new volume's name.
        name: String,
        /// The raw image: a file, a block device, `-` for stdin, or a pipe (e.g.
        /// `<(xz -dc img.xz)`).
        file: PathBuf,
        /// The block size.
        #[arg(long, value_name = "SIZE", default_value = "4K", value_parser = parse_size)]
        block_size: u64,
        /// The volume's size, at least the image's (past the image it reads as
        /// zeroes); an image longer than it is refused. Without it the volume takes
        /// the image's size (a stream's is known only at its end).
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        size: Option<u64>,
    },
    /// Write volume NAME to a raw image FILE, sparse: holes are not written.
    Export {
        /// The store directory.
        dir: PathBuf,
        /// The volume or snapshot.
        name: String,
        /// The file to write (replaced if it exists); or a device or pipe, or `-` for
        /// stdout, written in order with holes as zeroes.
        file: PathBuf,
    },
}

/// A size for people: bytes, or a number with a binary suffix (K, M, G, T, P, E,
/// optionally followed by "iB" or "B"), e.g. `10G`, `4KiB`, `1.5T`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err(format!("{s:?} is negative: a size is 0 or more bytes"));
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_uppercase();
    let unit = unit
        .strip_suffix("IB")
        .or_else(|| unit.strip_suffix('B'))
        .unwrap_or(&unit);
    let shift = match unit {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        "P" => 50,
        "E" => 60,
        _ => {
            return Err(format!(
                "{s:?}: unknown size suffix (use K, M, G, T, P or E)"
            ))
        }
    };
    let bad = || format!("{s:?} is not a size (e.g. 512, 4K, 10G)");
    let too_large = || format!("{s:?} is too large (at most 16 EiB - 1)");
    let bytes = if let Ok(n) = number.parse::<u64>() {
        n.checked_mul(1u64 << shift).ok_or_else(too_large)?
    } else {
        let x: f64 = number.parse().map_err(|_| bad())?;
        let v = x * (1u64 << shift) as f64;
        if v.is_finite() && v >= u64::MAX as f64 {
            return Err(too_large());
        }
        if !(v.is_finite() && v >= 0.0 && v.fract() == 0.0) {
            return Err(format!("{s:?} is not a whole number of bytes"));
        }
        v as u64
    };
    Ok(bytes)
}

/// `scan` arguments.
#[derive(Debug, Args)]
pub struct ScanArgs {
    /// The store directory.
    pub dir: PathBuf,
    /// Read this version (branch or snapshot) instead of main.
    #[arg(long, value_name = "VERSION")]
    pub at: Option<String>,
    /// Only keys starting with P (cannot be combined with --from).
    #[arg(long, value_name = "P", conflicts_with = "from")]
    pub prefix: Option<String>,
    /// Start at key K (inclusive).
    #[arg(long, value_name = "K")]
    pub from: Option<String>,
    /// Stop before key K (exclusive).
    #[arg(long, value_name = "K")]
    pub to: Option<String>,
    /// Print in descending key order.
    #[arg(long)]
    pub reverse: bool,
    /// Print at most N pairs.
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    /// Print only the keys (out-of-line values are never read).
    #[arg(long)]
    pub keys_only: bool,
}

/// A percentage from 0 to 100.
fn parse_percent(s: &str) -> Result<f64, String> {
    let p: f64 = s
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    if (0.0..=100.0).contains(&p) {
        Ok(p)
    } else {
        Err(format!("{s} is not between 0 and 100"))
    }
}

/// A segment number: decimal, or hex with a 0x prefix.
fn parse_segment(s: &str) -> Result<u32, String> {
    let parsed = match s.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    };
    parsed.map_err(|_| format!("{s:?} is not a segment number"))
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_and_bad_ones_say_what_is_wrong() {
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("10GiB"), Ok(10 << 30));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        let err = |s: &str| parse_size(s).unwrap_err();
        assert!(err("-1").contains("negative"), "{}", err("-1"));
        assert!(err("-4K").contains("negative"));
        assert!(err("99999999999999999999999").contains("too large"));
        assert!(err("20E").contains("too large"));
        assert!(err("1e30").contains("too large") || err("1e30").contains("suffix"));
        assert!(err("0.3").contains("whole number"));
        assert!(err("10X").contains("suffix"));
        assert!(err("").contains("not a size"));
    }
}
