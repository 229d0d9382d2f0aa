//! Plain text tables: columns separated by two spaces, each as wide as its widest cell;
//! numbers right-aligned, text left-aligned.

/// Renders `header` and `rows`; every row has the header's length.
pub fn render<const N: usize>(header: &[&str; N], rows: &[[String; N]]) -> String {
    let mut widths = header.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let numeric: Vec<bool> = (0..N)
        .map(|i| {
            !rows.is_empty()
                && rows
                    .iter()
                    .all(|r| r[i] == "-" || r[i].trim_end_matches('%').parse::<f64>().is_ok())
        })
        .collect();
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let text: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if numeric[i] {
                    format!("{c:>w$}", w = widths[i])
                } else {
                    format!("{c:<w$}", w = widths[i])
                }
            })
            .collect();
        out.push_str(text.join("  ").trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}
