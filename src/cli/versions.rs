//! The version commands: `snapshot`, `branch`, `versions`, `drop` and `diff`.

use super::codec::{human_bytes, human_time_utc};
use super::control::Outcome;
use super::error::{output_error, CliError, CliResult};
use super::open::{check_name, open_read_only};
use super::output::{print_json, print_key_value};
use super::Ctx;
use cambium::volume::Volume;
use cambium::{Change, Store, VersionInfo, VersionKind};
use serde::Serialize;
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

/// Makes a snapshot or a branch in an open store; the JSON is the new version as
/// `versions --json` lists it.
pub fn make_in(
    store: &Store,
    json: bool,
    source: &str,
    name: &str,
    kind: VersionKind,
) -> CliResult<Outcome> {
    // A volume's half-imported image is copied by no command (`volume snapshot`
    // refuses it too).
    if let Ok(vol) = Volume::open(store, source) {
        vol.check_complete()?;
    }
    match kind {
        VersionKind::Snapshot => store.snapshot(source, name)?,
        VersionKind::Branch => store.branch(source, name)?,
    }
    let text = format!("created {kind} {name} from {source}\n");
    if !json {
        return Outcome::new(text, serde_json::Value::Null);
    }
    // The listing is the one place the JSON comes from, so `snapshot --json` always
    // matches `versions --json`.
    match store.versions()?.into_iter().find(|v| v.name == name) {
        Some(info) => Outcome::new(text, info),
        None => Err(CliError::failure(format!(
            "{kind} {name:?} was made but is not listed"
        ))),
    }
}

/// `drop --json` output.
#[derive(Serialize)]
struct JsonDropped<'a> {
    dropped: &'a str,
}

/// Drops a version in an open store.
pub fn drop_in(store: &Store, name: &str) -> CliResult<Outcome> {
    store.drop_version(name)?;
    Outcome::new(format!("dropped {name}\n"), JsonDropped { dropped: name })
}

/// `cambium versions DIR`: a tree for people, one JSON array with `--json`.
pub fn versions(ctx: &Ctx, out: &mut impl Write, dir: &Path) -> CliResult {
    let store = open_read_only(dir)?;
    let list = store.versions()?;
    if ctx.json {
        return print_json(out, &list);
    }
    out.write_all(render_tree(&list).as_bytes())
        .map_err(output_error)
}

/// Lays the versions out as a tree, each under the version it was made from (in the
/// order they were made), with aligned columns under a header line.
pub fn render_tree(list: &[VersionInfo]) -> String {
    let header = [
        "VERSION",
        "KIND",
        "CREATED",
        "REFERENCED",
        "EXCLUSIVE",
        "KEYS",
    ];
    let cells: Vec<[String; 6]> = tree_labels(list)
        .into_iter()
        .map(|(label, i)| {
            let v = &list[i];
            [
                label,
                v.kind.to_string(),
                human_time_utc(v.created_unix_ms),
                human_bytes(v.referenced_bytes),
                human_bytes(v.exclusive_bytes),
                v.keys.to_string(),
            ]
        })
        .collect();
    align_columns(header, &cells)
}

/// The versions in tree order, each with its label: its name after `tree`-style
/// branch lines.
fn tree_labels(list: &[VersionInfo]) -> Vec<(String, usize)> {
    // Children by parent index; a version whose parent is not listed is a root.
    let index: HashMap<u32, usize> = list.iter().enumerate().map(|(i, v)| (v.id, i)).collect();
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); list.len()];
    let mut roots = Vec::new();
    for (i, v) in list.iter().enumerate() {
        match v.parent_id.and_then(|p| index.get(&p)) {
            Some(&p) if p != i => children[p].push(i),
            _ => roots.push(i),
        }
    }
    // Depth-first, with `tree`-style prefixes. `seen` guards against a parent cycle
    // (which a sound catalog never has): anything not reached is listed as a root.
    let mut rows: Vec<(String, usize)> = Vec::with_capacity(list.len());
    let mut seen = vec![false; list.len()];
    let mut stack: Vec<(usize, String, Option<bool>)> = Vec::new();
    let mut pending_roots = roots.into_iter().rev().collect::<Vec<_>>();
    loop {
        if stack.is_empty() {
            let next = pending_roots.pop().or_else(|| seen.iter().position(|s| !s));
            match next {
                Some(r) => stack.push((r, String::new(), None)),
                None => break,
            }
        }
        let Some((i, indent, last)) = stack.pop() else {
            break;
        };
        if seen[i] {
            continue;
        }
        seen[i] = true;
        let (branch, child_indent) = match last {
            None => ("", indent.clone()),
            Some(true) => ("└── ", format!("{indent}    ")),
            Some(false) => ("├── ", format!("{indent}│   ")),
        };
        rows.push((format!("{indent}{branch}{}", list[i].name), i));
        let kids = &children[i];
        for (n, &c) in kids.iter().enumerate().rev() {
            stack.push((c, child_indent.clone(), Some(n + 1 == kids.len())));
        }
    }
    rows
}

/// The header and the rows as text, columns two spaces apart: names, kinds and times
/// aligned left, numbers right.
fn align_columns(header: [&str; 6], cells: &[[String; 6]]) -> String {
    let mut width = header.map(|h| h.chars().count());
    for row in cells {
        for (w, c) in width.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut text = String::new();
    let mut line = |row: [&str; 6]| {
        let mut s = String::new();
        for (col, cell) in row.iter().enumerate() {
            let pad = width[col] - cell.chars().count();
            if col > 0 {
                s.push_str("  ");
            }
            // Names, kinds and times read left to right; numbers line up on the right.
            if col >= 3 {
                s.push_str(&" ".repeat(pad));
                s.push_str(cell);
            } else {
                s.push_str(cell);
                s.push_str(&" ".repeat(pad));
            }
        }
        text.push_str(s.trim_end());
        text.push('\n');
    };
    line(header);
    for row in cells {
        line(row.each_ref().map(String::as_str));
    }
    text
}

/// One `diff --json` line.
#[derive(Serialize)]
struct JsonChange {
    op: &'static str,
    key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<String>,
}

/// `cambium diff DIR A B [--keys-only]`: what changed from A to B, in key order.
pub fn diff(
    ctx: &Ctx,
    out: &mut impl Write,
    dir: &Path,
    a: &str,
    b: &str,
    keys_only: bool,
) -> CliResult {
    check_name(a)?;
    check_name(b)?;
    let store = open_read_only(dir)?;
    for change in store.diff(a, b)? {
        print_change(ctx, out, &change?, keys_only)?;
    }
    Ok(())
}

/// Prints one change as a line: `+ KEY VALUE`, `- KEY` or `~ KEY NEW-VALUE` (no
/// values with `--keys-only`), or a JSON object with `--json`.
fn print_change(ctx: &Ctx, out: &mut impl Write, change: &Change, keys_only: bool) -> CliResult {
    let (op, value) = match change {
        Change::Added { value, .. } => ("+", Some(value.as_slice())),
        Change::Removed { .. } => ("-", None),
        Change::Changed { new, .. } => ("~", Some(new.as_slice())),
    };
    let value = if keys_only { None } else { value };
    if ctx.json {
        let json = JsonChange {
            op,
            key: ctx.enc.json_string(change.key()),
            value: value.map(|v| ctx.enc.json_string(v)),
        };
        return print_json(out, &json);
    }
    write!(out, "{op} ").map_err(output_error)?;
    print_key_value(ctx, out, change.key(), value, b" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(id: u32, name: &str, parent: Option<u32>, kind: VersionKind) -> VersionInfo {
        VersionInfo {
            id,
            name: name.to_string(),
            kind,
            parent_id: parent,
            parent: None,
            created_unix_ms: 1_735_689_600_000 + u64::from(id) * 1000,
            created_lsn: u64::from(id),
            created_checkpoint: 1,
            referenced_bytes: 2048 * u64::from(id + 1),
            exclusive_bytes: 100 * u64::from(id),
            keys: u64::from(id) * 10,
        }
    }

    #[test]
    fn tree_layout() {
        use VersionKind::{Branch, Snapshot};
        let list = vec![
            v(0, "main", None, Branch),
            v(1, "s1", Some(0), Snapshot),
            v(2, "dev", Some(1), Branch),
            v(3, "s2", Some(0), Snapshot),
            v(4, "dev/x", Some(2), Branch),
            v(5, "orphan", Some(99), Branch),
            v(6, "s3", Some(1), Snapshot),
        ];
        let got = render_tree(&list);
        let lines: Vec<&str> = got.lines().collect();
        assert_eq!(lines.len(), 8, "{got}");
        assert!(lines[0].starts_with("VERSION"), "{got}");
        let kind_col = lines[0].find("KIND").unwrap();
        let names: Vec<String> = lines[1..]
            .iter()
            .map(|l| {
                l.chars()
                    .take(kind_col)
                    .collect::<String>()
                    .trim_end()
                    .to_string()
            })
            .collect();
        assert_eq!(
            names,
            [
                "main",
                "├── s1",
                "│   ├── dev",
                "│   │   └── dev/x",
                "│   └── s3",
                "└── s2",
                "orphan"
            ],
            "{got}"
        );
        // Columns line up: every KIND cell starts at the same character offset.
        let col = |l: &str| {
            let pos = l
                .find("branch")
                .or_else(|| l.find("snapshot"))
                .or_else(|| l.find("KIND"))
                .unwrap();
            l[..pos].chars().count()
        };
        let first = col(lines[0]);
        for l in &lines {
            assert_eq!(col(l), first, "{got}");
            assert_eq!(l.chars().count(), lines[0].chars().count(), "{got}");
        }
        assert!(lines[1].ends_with("2.0 KiB        0 B     0"), "{got}");
    }
}
