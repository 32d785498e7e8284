//! Laying out text tables: each column as wide as its widest cell, text left-aligned and
//! numbers right-aligned, and the short titles of the metric columns. Shared by every table
//! (the report's, its span section, `diff`'s).

use std::io::Write;

/// Column titles for the metric names.
pub(crate) fn title(metric: &str) -> &str {
    match metric {
        "retiring" => "Retiring",
        "bad_speculation" => "BadSpec",
        "frontend_bound" => "Frontend",
        "backend_bound" => "Backend",
        "light_operations" => "LightOps",
        "heavy_operations" => "HeavyOps",
        "branch_mispredicts" => "BrMisp",
        "machine_clears" => "MClears",
        "fetch_latency" => "FetchLat",
        "fetch_bandwidth" => "FetchBW",
        "memory_bound" => "MemBound",
        "core_bound" => "CoreBound",
        "smt_contention" => "SMT",
        other => other,
    }
}

/// Where a table's cells go, row by row. [`layout_twice`] hands them to a [`Widths`] and
/// then to a [`Lines`]: a table of every thread (100,000 rows of ~17 cells), held as a
/// `String` per cell while it was laid out, took ~100 MB.
pub(crate) trait Cells {
    /// Starts a row; the cells that follow are its cells.
    fn row(&mut self);
    fn cell(&mut self, cell: &str);
    /// The buffer `cell_fmt` formats into, kept from cell to cell so that a formatted cell
    /// allocates nothing.
    fn scratch(&mut self) -> &mut String;

    fn cell_fmt(&mut self, cell: std::fmt::Arguments<'_>) {
        let mut scratch = std::mem::take(self.scratch());
        scratch.clear();
        // Writing into a `String` cannot fail.
        let _ = std::fmt::Write::write_fmt(&mut scratch, cell);
        self.cell(&scratch);
        *self.scratch() = scratch;
    }
}

/// The first pass: each column's width, in characters.
struct Widths {
    widths: Vec<usize>,
    column: usize,
    scratch: String,
}

impl Cells for Widths {
    fn row(&mut self) {
        self.column = 0;
    }

    fn cell(&mut self, cell: &str) {
        // A cell past the header's columns is left out, as `layout` leaves it out.
        if let Some(width) = self.widths.get_mut(self.column) {
            *width = (*width).max(cell.chars().count());
        }
        self.column += 1;
    }

    fn scratch(&mut self) -> &mut String {
        &mut self.scratch
    }
}

/// The second pass: each row laid out in `line` and written to `out`.
struct Lines<'o> {
    out: &'o mut dyn Write,
    widths: Vec<usize>,
    text_columns: usize,
    line: String,
    /// The next cell's column; `None` before the first row.
    column: Option<usize>,
    scratch: String,
    /// The first write that failed; nothing is written after it.
    error: Option<std::io::Error>,
}

impl Lines<'_> {
    /// Writes the row in `line`, if one was started.
    fn end_row(&mut self) {
        if self.column.is_none() || self.error.is_some() {
            return;
        }
        let kept = self.line.trim_end().len();
        self.line.truncate(kept);
        self.line.push('\n');
        if let Err(err) = self.out.write_all(self.line.as_bytes()) {
            self.error = Some(err);
        }
        self.line.clear();
    }
}

impl Cells for Lines<'_> {
    fn row(&mut self) {
        self.end_row();
        self.column = Some(0);
    }

    fn cell(&mut self, cell: &str) {
        let Some(column) = self.column else { return };
        self.column = Some(column + 1);
        // A cell past the header's columns is left out, as `layout` leaves it out.
        let Some(width) = self.widths.get(column) else {
            return;
        };
        // A streamed row's length is not known until it ends: the last column cannot be
        // told apart, so `text_columns` 5 is not for these tables.
        let left = left_aligned(self.text_columns, column, usize::MAX);
        push_cell(&mut self.line, column, cell, *width, left);
    }

    fn scratch(&mut self) -> &mut String {
        &mut self.scratch
    }
}

/// [`layout`] of the rows `rows` makes, written to `out`: `rows` runs twice, once for the
/// column widths and once for the lines, so no cell is held (`text_columns` 1 to 4).
pub(crate) fn layout_twice(
    out: &mut dyn Write,
    header: &[String],
    text_columns: usize,
    rows: &dyn Fn(&mut dyn Cells),
) -> std::io::Result<()> {
    debug_assert!(
        text_columns != 5,
        "the last column of a streamed row is not known"
    );
    let mut widths = Widths {
        widths: header.iter().map(|cell| cell.chars().count()).collect(),
        column: 0,
        scratch: String::new(),
    };
    rows(&mut widths);
    let mut lines = Lines {
        out,
        widths: widths.widths,
        text_columns,
        line: String::new(),
        column: None,
        scratch: widths.scratch,
        error: None,
    };
    lines.row();
    for title in header {
        lines.cell(title);
    }
    rows(&mut lines);
    lines.end_row();
    match lines.error {
        Some(err) => Err(err),
        None => Ok(()),
    }
}

/// Whether `column` of a row of `cells` cells is text, left-aligned (see [`layout`]).
fn left_aligned(text_columns: usize, column: usize, cells: usize) -> bool {
    match text_columns {
        1 => column == 1,
        2 => column == 2,
        3 => column == 1 || column == 2,
        5 => column <= 1 || column + 1 == cells,
        _ => column <= 1,
    }
}

/// Appends `cell`, padded to `width`, to the line being laid out.
fn push_cell(line: &mut String, column: usize, cell: &str, width: usize, left: bool) {
    if column > 0 {
        line.push_str("  ");
    }
    let padding = width.saturating_sub(cell.chars().count());
    if left {
        line.push_str(cell);
        line.extend(std::iter::repeat_n(' ', padding));
    } else {
        line.extend(std::iter::repeat_n(' ', padding));
        line.push_str(cell);
    }
}

/// An amount of the weight counter `weight` as the tables print it: `cpu-clock`'s nanoseconds
/// as milliseconds (the `cpu ms` columns), any other counter's count as it is.
pub(crate) fn weight_cell(weight: &str, value: u64) -> String {
    if weight == "cpu-clock" {
        format!("{:.3}", value as f64 / 1e6)
    } else {
        value.to_string()
    }
}

/// `part` as a share of `total` (`-` when the total is 0), as the tables print shares.
pub(crate) fn share_cell(part: u64, total: u64) -> String {
    if total == 0 {
        "-".to_owned()
    } else {
        format!("{:.1}%", 100.0 * part as f64 / total as f64)
    }
}

/// `entity`'s value of each of `metrics` as a percentage cell (`-` where it has none).
pub(crate) fn metric_cells<'a>(
    entity: &'a super::Entity,
    metrics: &'a [&str],
) -> impl Iterator<Item = String> + 'a {
    metrics
        .iter()
        .map(|name| match entity.metrics.get(name).copied().flatten() {
            Some(fraction) => format!("{:.1}%", 100.0 * fraction),
            None => "-".to_owned(),
        })
}

/// Left-aligns the text columns (`text_columns`: 1 = column 1, 2 = column 2, 3 = columns 1
/// and 2, 4 = columns 0 and 1, 5 = columns 0 and 1 and the last), right-aligns the numbers.
pub(crate) fn layout(header: &[String], rows: &[Vec<String>], text_columns: usize) -> String {
    let mut widths: Vec<usize> = header.iter().map(|cell| cell.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    // Written straight into one string: a string per padded cell and per line made the table
    // the slowest of the outputs.
    let line = |text: &mut String, cells: &[String]| {
        let start = text.len();
        for (column, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            let left = left_aligned(text_columns, column, cells.len());
            push_cell(text, column, cell, *width, left);
        }
        let kept = text[start..].trim_end().len();
        text.truncate(start + kept);
        text.push('\n');
    };
    let mut text = String::new();
    line(&mut text, header);
    for row in rows {
        line(&mut text, row);
    }
    text
}

/// Appends each `(count, note)` whose count is not zero, the count in place of the note's
/// `{n}`: a diagnostic that did not happen is not mentioned.
pub(super) fn count_notes(text: &mut String, notes: &[(u64, &str)]) {
    for &(count, note) in notes {
        if count > 0 {
            *text += &note.replacen("{n}", &count.to_string(), 1);
        }
    }
}

/// What every section of the table shows its rows' figures with.
pub(super) struct Columns<'a> {
    /// The metric columns, in order.
    pub metrics: &'a [&'a str],
    /// The counter rows are weighed by, and its column's title (`cpu ms` for `cpu-clock`).
    pub weight: &'a str,
    pub weight_title: &'a str,
    /// What shares are of: the command's weight with `-- CMD`, else all that was counted.
    pub total_weight: u64,
}
