//! docs/FORMAT.md checked against the code.
//!
//! The fixed headers of the on-disk format are documented as tables, each preceded by a
//! `<!-- layout: NAME -->` marker, with one row per field:
//! `| offset | size | field | type | meaning |`. These tests parse those tables and compare
//! every row with the owning module's offset constants (`OFF_*`), so the document
//! cannot drift from the code: a changed offset, size, name or order on either side
//! fails here. The documented format version is checked against
//! [`crate::format::FORMAT_VERSION`].
//!
//! Each header's test sits next to its constants (superblock, node, segment, WAL
//! record) and calls [`check_layout`]; this module only reads the document, so it
//! names no other module and sits at the bottom of the layers.

const FORMAT_MD: &str = include_str!("../docs/FORMAT.md");

/// One row of a layout table.
#[derive(Debug)]
pub(crate) struct Row {
    pub offset: usize,
    pub size: usize,
    pub field: String,
    pub ty: String,
    pub meaning: String,
}

/// The rows of the table after `<!-- layout: NAME -->` in docs/FORMAT.md.
pub(crate) fn layout_table(name: &str) -> Vec<Row> {
    let marker = format!("<!-- layout: {name} -->");
    assert_eq!(
        FORMAT_MD.matches(&marker).count(),
        1,
        "docs/FORMAT.md must hold the marker {marker} exactly once"
    );
    let after = &FORMAT_MD[FORMAT_MD.find(&marker).expect("counted above") + marker.len()..];
    let mut lines = after.lines().skip_while(|l| l.trim().is_empty());
    let header = lines.next().unwrap_or_default();
    let columns: Vec<&str> = cells(header);
    assert_eq!(
        columns,
        ["offset", "size", "field", "type", "meaning"],
        "table {name}: unexpected columns"
    );
    let separator = lines.next().unwrap_or_default();
    assert!(
        separator.trim_start().starts_with("|-") || separator.trim_start().starts_with("|:"),
        "table {name}: no separator row after the header"
    );
    let rows: Vec<Row> = lines
        .take_while(|l| l.trim_start().starts_with('|'))
        .map(|l| {
            let c = cells(l);
            assert_eq!(c.len(), 5, "table {name}: row {l:?} does not have 5 cells");
            let number = |s: &str| {
                s.parse::<usize>()
                    .unwrap_or_else(|_| panic!("table {name}: {s:?} is not a number in {l:?}"))
            };
            Row {
                offset: number(c[0]),
                size: number(c[1]),
                field: c[2].to_owned(),
                ty: c[3].to_owned(),
                meaning: c[4].to_owned(),
            }
        })
        .collect();
    assert!(!rows.is_empty(), "table {name} has no rows");
    rows
}

/// The cells of a markdown table row, trimmed.
fn cells(line: &str) -> Vec<&str> {
    let line = line.trim();
    let inner = line
        .strip_prefix('|')
        .and_then(|l| l.strip_suffix('|'))
        .unwrap_or_else(|| panic!("not a table row: {line:?}"));
    inner.split('|').map(str::trim).collect()
}

/// The width of a documented field type.
fn type_width(ty: &str) -> Option<usize> {
    match ty {
        "u8" => Some(1),
        "u16" => Some(2),
        "u32" => Some(4),
        "u64" => Some(8),
        "BlockRef" => Some(crate::format::BlockRef::SIZE),
        _ => ty
            .strip_prefix("[u8; ")?
            .strip_suffix(']')?
            .trim()
            .parse()
            .ok(),
    }
}

/// Checks the table `name` against the code: `fields` are the field names and their
/// offset constants in order, `end` the header size. Each field's size is the distance
/// to the next offset (or to `end`), so the code's constants alone fix every row.
pub(crate) fn check_layout(name: &str, fields: &[(&str, usize)], end: usize) {
    let rows = layout_table(name);
    let doc: Vec<(&str, usize, usize)> = rows
        .iter()
        .map(|r| (r.field.as_str(), r.offset, r.size))
        .collect();
    let code: Vec<(&str, usize, usize)> = fields
        .iter()
        .enumerate()
        .map(|(i, &(field, offset))| {
            let next = fields.get(i + 1).map_or(end, |&(_, o)| o);
            (field, offset, next - offset)
        })
        .collect();
    assert_eq!(
        doc, code,
        "docs/FORMAT.md table {name} (field, offset, size) differs from the code's constants"
    );
    for r in &rows {
        assert_eq!(
            type_width(&r.ty),
            Some(r.size),
            "docs/FORMAT.md table {name}: field {} has type {:?} but size {}",
            r.field,
            r.ty,
            r.size
        );
    }
}

/// The number at the start of a table cell, like `2` in "2 (`FORMAT_VERSION`)".
pub(crate) fn leading_number(s: &str) -> Option<u64> {
    let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

#[test]
fn documented_format_version_is_the_code_s() {
    let version = crate::format::FORMAT_VERSION;
    let title = FORMAT_MD.lines().next().unwrap_or_default();
    let documented = title
        .strip_prefix("# cambium on-disk format, version ")
        .and_then(leading_number)
        .unwrap_or_else(|| panic!("docs/FORMAT.md title {title:?} names no version"));
    assert_eq!(
        documented,
        u64::from(version),
        "docs/FORMAT.md documents format version {documented}, the code writes {version}"
    );
    let current = format!("- **{version}** (this document)");
    assert!(
        FORMAT_MD.contains(&current),
        "docs/FORMAT.md's version history must have an entry {current:?}"
    );
    // Every table that documents the version field names the current one.
    for table in ["superblock-slot", "segment-header"] {
        let rows = layout_table(table);
        let row = rows
            .iter()
            .find(|r| r.field == "format_version")
            .unwrap_or_else(|| panic!("table {table} has no format_version row"));
        assert_eq!(
            leading_number(&row.meaning),
            Some(u64::from(version)),
            "table {table}: format_version says {:?}",
            row.meaning
        );
    }
}

#[test]
fn the_checker_notices_drift() {
    // A table whose code disagrees in one offset must fail the check.
    let drifted = std::panic::catch_unwind(|| {
        // The node header as documented, but with `reserved` one byte late.
        check_layout(
            "node-header",
            &[
                ("magic", 0),
                ("crc", 4),
                ("kind", 8),
                ("level", 9),
                ("reserved", 11),
                ("count", 12),
            ],
            16,
        );
    });
    assert!(drifted.is_err());
    assert_eq!(type_width("[u8; 12]"), Some(12));
    assert_eq!(type_width("BlockRef"), Some(16));
    assert_eq!(type_width("str"), None);
}
