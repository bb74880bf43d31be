//! The soak through the CLI, default options: `init`, then `rounds` rounds of
//! `snapshot DIR main s`, `batch DIR` rewriting the same `keys` keys (24-character
//! keys, 30-byte values, one transaction), `drop DIR s`; after each round
//! `stats --json`. Every command is its own process (so closes, with their automatic
//! cleaning, happen as they would for a user).

use crate::stat::{fmt_bytes, median};
use crate::workload::Res;
use crate::Ctx;
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

pub struct Params {
    pub cli: PathBuf,
    pub rounds: u32,
    pub keys: u64,
    pub runs: Option<usize>,
}

#[derive(Clone, Default)]
struct Round {
    secs: f64,
    footprint: u64,
    segments: u64,
    live: u64,
    backref: u64,
}

fn cli(p: &Params, args: &[&str], stdin: Option<&[u8]>) -> Res<String> {
    let mut c = Command::new(&p.cli);
    c.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    c.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = c.spawn()?;
    if let Some(input) = stdin {
        child.stdin.take().ok_or("no stdin")?.write_all(input)?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(format!("cambium {args:?}: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(String::from_utf8(out.stdout)?)
}

fn batch(round: u32, keys: u64) -> Vec<u8> {
    let mut s = String::with_capacity(keys as usize * 64);
    for i in 0..keys {
        // key: 24 characters; value: 30.
        s.push_str(&format!("put\tkey{i:021}\tround{round:03}-value-{i:013}\n"));
    }
    s.into_bytes()
}

fn one(ctx: &Ctx, p: &Params, run: usize) -> Res<Vec<Round>> {
    let dir = ctx.fresh_dir(&format!("soak-{run}"))?;
    let db = dir.join("db");
    let d = db.to_str().ok_or("path")?;
    cli(p, &["init", d], None)?;
    let mut rounds = Vec::new();
    for r in 0..p.rounds {
        let input = batch(r, p.keys);
        let t = Instant::now();
        cli(p, &["snapshot", d, "main", "s"], None)?;
        cli(p, &["batch", d], Some(&input))?;
        cli(p, &["drop", d, "s"], None)?;
        let secs = t.elapsed().as_secs_f64();
        let s: serde_json::Value = serde_json::from_str(&cli(p, &["stats", "--json", d], None)?)?;
        let g = |k: &str| s[k].as_u64().unwrap_or(0);
        let round = Round {
            secs,
            footprint: g("footprint_bytes"),
            segments: g("segment_bytes"),
            live: g("live_bytes"),
            backref: g("backref_bytes"),
        };
        eprintln!(
            "  soak run {run} round {}: {secs:.1} s, footprint {}, segments {}, live {}",
            r + 1,
            fmt_bytes(round.footprint as f64),
            fmt_bytes(round.segments as f64),
            fmt_bytes(round.live as f64)
        );
        rounds.push(round);
    }
    ctx.remove_dir(&dir);
    Ok(rounds)
}

pub fn run(ctx: &Ctx, p: &Params) -> Res<(String, serde_json::Value)> {
    if !Path::new(&p.cli).exists() {
        return Err(format!(
            "{} not found (cargo build --release -p cambium, or --cli)",
            p.cli.display()
        )
        .into());
    }
    let runs = p.runs.unwrap_or(ctx.runs);
    let mut all = Vec::new();
    for r in 0..runs {
        all.push(one(ctx, p, r)?);
    }
    let mut md = format!(
        "`{}` with default options; {} keys rewritten per round; {runs} run(s), medians per round.\n\n\
         | round | time (snapshot + batch + drop) | footprint | segment bytes | live bytes | back-reference bytes |\n\
         |---|---|---|---|---|---|\n",
        p.cli.display(),
        p.keys
    );
    let mut js = Vec::new();
    for i in 0..p.rounds as usize {
        let m =
            |f: &dyn Fn(&Round) -> f64| median(&all.iter().map(|rs| f(&rs[i])).collect::<Vec<_>>());
        md.push_str(&format!(
            "| {} | {:.1} s | {} | {} | {} | {} |\n",
            i + 1,
            m(&|r| r.secs),
            fmt_bytes(m(&|r| r.footprint as f64)),
            fmt_bytes(m(&|r| r.segments as f64)),
            fmt_bytes(m(&|r| r.live as f64)),
            fmt_bytes(m(&|r| r.backref as f64)),
        ));
        js.push(
            json!({"round": i + 1, "secs": m(&|r| r.secs), "footprint": m(&|r| r.footprint as f64),
            "segment_bytes": m(&|r| r.segments as f64), "live_bytes": m(&|r| r.live as f64)}),
        );
    }
    let peak = all
        .iter()
        .flat_map(|rs| rs.iter().map(|r| r.segments))
        .max()
        .unwrap_or(0);
    md.push_str(&format!(
        "\nPeak segment bytes over all rounds and runs: {}.\n",
        fmt_bytes(peak as f64)
    ));
    Ok((md, json!(js)))
}
