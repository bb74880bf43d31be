//! The library's imports run one way: downward.
//!
//! `src/lib.rs` declares the modules bottom up, one layer per group. Every path a
//! library file names with `crate::` must lead to its own top-level module or to one
//! declared before it; a module never names one above it. Test modules (from the first
//! `#[cfg(test)] mod`) are not counted. `docs/design.md` draws the same layers; this
//! test is what keeps that drawing true. (The CLI, `src/cli/` and `src/main.rs`, uses
//! only the public API and is not part of the library's layers.)

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The top-level modules in declaration order.
fn layer_order() -> Vec<String> {
    let lib = fs::read_to_string(src().join("lib.rs")).expect("read src/lib.rs");
    lib.lines()
        .filter_map(|l| {
            let l = l.trim();
            let l = l.strip_prefix("pub ").unwrap_or(l);
            let name = l.strip_prefix("mod ")?.strip_suffix(';')?;
            Some(name.trim().to_owned())
        })
        .collect()
}

/// Library files with the top-level module each belongs to.
fn library_files() -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    let mut stack = vec![src()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).expect("read src/") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path.strip_prefix(src()).expect("under src/");
            let first = rel.components().next().expect("a component");
            let top = first
                .as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_owned();
            if path.extension().is_some_and(|e| e == "rs")
                && !matches!(top.as_str(), "lib" | "main" | "cli")
            {
                out.push((top, path));
            }
        }
    }
    out
}

/// The top-level modules a file names through `crate::`, outside its tests.
fn named_modules(text: &str) -> Vec<String> {
    let code = match text.find("#[cfg(test)]\nmod ") {
        Some(i) => &text[..i],
        None => text,
    };
    let mut out = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `use crate::{a::X, b};`
            let inner = &group[..group.find('}').unwrap_or(group.len())];
            for part in inner.split(',') {
                let name: String = part
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                out.push(name);
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            out.push(name);
        }
    }
    out.retain(|n| !n.is_empty());
    out
}

#[test]
fn no_module_names_a_layer_above_it() {
    let order = layer_order();
    assert!(
        order.len() > 10,
        "src/lib.rs declares too few modules: {order:?}"
    );
    let rank: HashMap<&str, usize> = order
        .iter()
        .enumerate()
        .map(|(i, m)| (m.as_str(), i))
        .collect();
    let mut upward = Vec::new();
    for (top, path) in library_files() {
        let Some(&own) = rank.get(top.as_str()) else {
            panic!("{} belongs to no module declared in lib.rs", path.display());
        };
        let text = fs::read_to_string(&path).expect("read a source file");
        for name in named_modules(&text) {
            match rank.get(name.as_str()) {
                Some(&r) if r > own => {
                    upward.push(format!("{} names crate::{name}", path.display()))
                }
                Some(_) => {}
                // An item of the crate root itself (a re-export): the facade's names
                // are for users, not for the layers.
                None => upward.push(format!(
                    "{} names crate::{name}, a crate-root item",
                    path.display()
                )),
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports that run upward:\n{}",
        upward.join("\n")
    );
}

#[test]
fn the_check_sees_an_upward_import() {
    let names = named_modules(
        "use crate::engine::Shared;\nuse crate::{store, wal::Op};\n#[cfg(test)]\nmod tests { use crate::verify; }",
    );
    assert_eq!(names, ["engine", "store", "wal"]);
}
