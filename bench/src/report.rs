//! The driver the workload benchmarks share: run the chosen workloads in order, print
//! one markdown report on stdout, and write their JSON results to a file if asked.

use crate::workload::Res;
use std::path::Path;

/// Runs `run` for each workload and reports; exits 1 on the first error (the bench
/// binary's name `bin` prefixes every message).
pub fn run_workloads(
    bin: &str,
    title: &str,
    workloads: &[String],
    json_path: Option<&Path>,
    mut run: impl FnMut(&str) -> Res<(String, serde_json::Value)>,
) {
    let mut report = format!("# {title}\n");
    let mut json = serde_json::Map::new();
    for w in workloads {
        match run(w) {
            Ok((md, js)) => {
                report.push_str(&format!("\n## {w}\n\n{md}"));
                json.insert(w.clone(), js);
            }
            Err(e) => {
                eprintln!("{bin}: {w}: {e}");
                std::process::exit(1);
            }
        }
    }
    print!("{report}");
    if let Some(path) = json_path {
        let text = serde_json::to_string_pretty(&json).unwrap_or_default();
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("{bin}: writing {}: {e}", path.display());
            std::process::exit(1);
        }
    }
}
