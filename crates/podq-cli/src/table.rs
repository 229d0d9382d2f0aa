//! Plain text tables: columns separated by two spaces, each as wide as its widest cell.

/// How a column's cells line up.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Text: padded on the right.
    Left,
    /// Numbers: padded on the left.
    Right,
}

/// Renders `header` and `rows` with the given column alignments, and a rule of dashes
/// under the header when `rule` is set. Every row has the header's length.
pub fn aligned<R: AsRef<[String]>>(
    header: &[&str],
    rows: &[R],
    align: &[Align],
    rule: bool,
) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row.as_ref()) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| -> String {
        let parts: Vec<String> = cells
            .zip(&widths)
            .zip(align)
            .map(|((cell, &w), a)| {
                let pad = " ".repeat(w - cell.chars().count());
                match a {
                    Align::Left => format!("{cell}{pad}"),
                    Align::Right => format!("{pad}{cell}"),
                }
            })
            .collect();
        let mut text = parts.join("  ").trim_end().to_owned();
        text.push('\n');
        text
    };
    let mut out = line(&mut header.iter().copied());
    if rule {
        let dashes: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
        out.push_str(&dashes.join("  "));
        out.push('\n');
    }
    for row in rows {
        out.push_str(&line(&mut row.as_ref().iter().map(String::as_str)));
    }
    out
}

/// Renders `header` and `rows`, numbers (and `-`, `12%`) right-aligned, text left.
pub fn render<const N: usize>(header: &[&str; N], rows: &[[String; N]]) -> String {
    let align: Vec<Align> = (0..N)
        .map(|i| {
            let numeric = !rows.is_empty()
                && rows
                    .iter()
                    .all(|r| r[i] == "-" || r[i].trim_end_matches('%').parse::<f64>().is_ok());
            if numeric {
                Align::Right
            } else {
                Align::Left
            }
        })
        .collect();
    aligned(header, rows, &align, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_right_text_left() {
        let rows = [
            ["a".to_owned(), "1".to_owned()],
            ["bbb".to_owned(), "10%".to_owned()],
        ];
        assert_eq!(
            render(&["name", "n"], &rows),
            "name    n\na       1\nbbb   10%\n"
        );
    }

    #[test]
    fn rule_under_the_header() {
        let rows = vec![vec!["x".to_owned(), "2.5 k".to_owned()]];
        let text = aligned(&["sys", "rate"], &rows, &[Align::Left, Align::Right], true);
        assert_eq!(text, "sys   rate\n---  -----\nx    2.5 k\n");
    }
}
