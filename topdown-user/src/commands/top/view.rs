//! `topdown top`'s screen: rows out of a [`Report`], sorted and filtered, drawn into a ratatui
//! buffer. Pure: no terminal, no session, so the layout is tested cell by cell.

use ratatui::{
    buffer::Buffer,
    layout::Rect,
    style::{Color, Modifier, Style},
};

use crate::{
    functions::distribution::Distribution,
    model::{L1_METRICS, L2_METRICS, Name},
    report::{Entity, Report},
    spans::report::SpanEntry,
};

/// Which rows the table shows (a key switches between them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    Processes,
    Threads,
    Cgroups,
    Functions,
    /// Spans per kind and key (`--span`, `--postgres`): queries.
    Spans,
}

impl View {
    fn title(self) -> &'static str {
        match self {
            View::Processes => "processes",
            View::Threads => "threads",
            View::Cgroups => "cgroups",
            View::Functions => "functions",
            View::Spans => "spans",
        }
    }

    fn columns(self) -> (&'static str, &'static str) {
        match self {
            View::Processes => ("PID", "COMM"),
            View::Threads => ("TID", "COMM"),
            View::Cgroups => ("ID", "CGROUP"),
            View::Functions => ("CALLS", "FUNCTION"),
            View::Spans => ("CALLS", "SPAN"),
        }
    }

    /// Whether up and down select a row, whose distribution `d` shows.
    pub fn selects(self) -> bool {
        matches!(self, View::Functions | View::Spans)
    }
}

/// The row order (`s` cycles through them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sort {
    /// Heaviest first (slots, or on-CPU time).
    Weight,
    /// By the fraction of the n-th shown category, largest first.
    Category(usize),
    Name,
}

/// What the user has chosen: everything the keys change.
#[derive(Clone, Debug, PartialEq)]
pub struct Ui {
    pub view: View,
    pub sort: Sort,
    /// Rows whose name contains this (case-insensitive).
    pub filter: String,
    /// `/` typed, Enter or Esc not yet: the text being edited.
    pub editing: Option<String>,
    /// The level shown (1, or 2 when the session counts level 2).
    pub level: u8,
    pub paused: bool,
    /// A one-line note for the user (a key that cannot apply, the command's exit).
    pub message: Option<String>,
    /// The functions or spans view's selected row (from the top; up and down move it).
    pub selected: usize,
    /// `d`: the functions and spans views show the selected row's distribution.
    pub distribution: bool,
}

impl Ui {
    pub fn new(level: u8) -> Self {
        Self {
            view: View::Processes,
            sort: Sort::Weight,
            filter: String::new(),
            editing: None,
            level: level.clamp(1, 2),
            paused: false,
            message: None,
            selected: 0,
            distribution: false,
        }
    }

    /// The sort after `s`: weight, then each shown category, then name, then weight again.
    pub fn next_sort(&self, categories: usize) -> Sort {
        match self.sort {
            Sort::Weight if categories > 0 => Sort::Category(0),
            Sort::Weight => Sort::Name,
            Sort::Category(index) if index + 1 < categories => Sort::Category(index + 1),
            Sort::Category(_) => Sort::Name,
            Sort::Name => Sort::Weight,
        }
    }
}

/// What the header says besides the report itself.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    pub cpus: usize,
    pub refresh_ms: u64,
    /// topdown's BPF run time over the last refresh, percent of all CPUs; `None` until
    /// measured or where the kernel's statistics are off.
    pub overhead_percent: Option<f64>,
    /// The level the session counts (level 2 can be shown only if it is 2).
    pub counted_level: u8,
}

/// One table row.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub id: String,
    pub name: String,
    pub weight: u64,
    /// Fraction (0..1) of each shown category; `None` where the model has no value.
    pub fractions: Vec<Option<f64>>,
    /// In the functions and spans views: the row's index in the report's `functions` or
    /// `spans`.
    pub entry: Option<usize>,
}

/// The categories shown at `level` for `report`, in fixed order (level-1 extras such as AMD's
/// `smt_contention` after the standard four); none for the software model (level 0).
pub fn categories(report: &Report, level: u8) -> Vec<String> {
    categories_of(report.level, report.totals.metrics.keys(), level)
}

/// [`categories`] of a report counted at `counted_level` whose totals have the metrics
/// `metric_names`.
pub fn categories_of<'k>(
    counted_level: u8,
    metric_names: impl Iterator<Item = &'k Name>,
    level: u8,
) -> Vec<String> {
    if counted_level == 0 {
        return Vec::new();
    }
    let extra = metric_names.filter(|name| {
        !name.contains('.')
            && !L1_METRICS.contains(&name.as_str())
            && !L2_METRICS.contains(&name.as_str())
    });
    if level >= 2 && counted_level >= 2 {
        L2_METRICS
            .iter()
            .map(|name| (*name).to_owned())
            .chain(extra.map(|name| name.to_string()))
            .collect()
    } else {
        L1_METRICS
            .iter()
            .map(|name| (*name).to_owned())
            .chain(extra.map(|name| name.to_string()))
            .collect()
    }
}

/// Fixed colours: a level-2 category takes its level-1 parent's hue (light for the second
/// child), so switching levels keeps the picture readable.
pub fn colour(category: &str) -> Color {
    match category {
        "retiring" | "light_operations" => Color::Green,
        "heavy_operations" => Color::LightGreen,
        "bad_speculation" | "branch_mispredicts" => Color::Red,
        "machine_clears" => Color::LightRed,
        // xterm-256 purple and orange: the SVG call tree's colours (report/svg.rs), so a
        // category looks the same in every picture topdown draws.
        "frontend_bound" | "fetch_latency" => Color::Indexed(98),
        "fetch_bandwidth" => Color::Indexed(141),
        "backend_bound" | "memory_bound" => Color::Indexed(208),
        "core_bound" => Color::Indexed(214),
        _ => Color::Yellow,
    }
}

/// Short column titles.
pub fn title(category: &str) -> &str {
    match category {
        "retiring" => "Retire",
        "bad_speculation" => "BadSpec",
        "frontend_bound" => "Front",
        "backend_bound" => "Back",
        "light_operations" => "Light",
        "heavy_operations" => "Heavy",
        "branch_mispredicts" => "BrMisp",
        "machine_clears" => "MClear",
        "fetch_latency" => "FLat",
        "fetch_bandwidth" => "FBW",
        "memory_bound" => "Mem",
        "core_bound" => "Core",
        "smt_contention" => "SMT",
        other => other,
    }
}

/// The rows of `view` in `report`, filtered and sorted as `ui` says.
pub fn rows(report: &Report, ui: &Ui, categories: &[String]) -> Vec<Row> {
    let weight = report.weight_counter.as_str();
    let row = |id: String, name: String, entity: &Entity| Row {
        id,
        name,
        weight: entity.count(weight),
        fractions: categories
            .iter()
            .map(|category| entity.metrics.get(category).copied().flatten())
            .collect(),
        entry: None,
    };
    let mut rows: Vec<Row> = match ui.view {
        View::Processes => report
            .processes
            .iter()
            .map(|p| row(p.pid.to_string(), p.comm.clone(), &p.entity))
            .collect(),
        View::Threads => report
            .tasks
            .iter()
            .map(|t| row(t.tid.to_string(), t.comm.clone(), &t.entity))
            .collect(),
        View::Cgroups => report
            .cgroups
            .iter()
            .map(|c| {
                let name = c.path.clone().unwrap_or_else(|| format!("cgroup {}", c.id));
                let name = match c.container.as_ref().and_then(|info| info.id.as_ref()) {
                    Some(id) => format!("{name} [{id}]"),
                    None => name,
                };
                row(c.id.to_string(), name, &c.entity)
            })
            .collect(),
        View::Functions => report
            .functions
            .iter()
            .enumerate()
            .filter(|(_, f)| f.calls > 0)
            .map(|(index, f)| {
                // The binary's file name: its directory rarely fits and seldom tells apart.
                let target = std::path::Path::new(&f.target).file_name().map_or_else(
                    || f.target.clone(),
                    |name| name.to_string_lossy().into_owned(),
                );
                Row {
                    entry: Some(index),
                    ..row(
                        f.calls.to_string(),
                        format!("{} ({target})", f.symbol),
                        &f.inclusive,
                    )
                }
            })
            .collect(),
        View::Spans => report
            .spans
            .iter()
            .enumerate()
            .filter(|(_, span)| span.calls > 0)
            .map(|(index, span)| Row {
                entry: Some(index),
                ..row(span.calls.to_string(), span_name(span), &span.entity)
            })
            .collect(),
    };
    let filter = ui.editing.as_ref().unwrap_or(&ui.filter).to_lowercase();
    if !filter.is_empty() {
        rows.retain(|row| row.name.to_lowercase().contains(&filter));
    }
    // Rows that counted nothing this refresh say nothing: leave them out, as top does.
    rows.retain(|row| row.weight > 0);
    match ui.sort {
        Sort::Weight => rows.sort_by(|a, b| b.weight.cmp(&a.weight).then(a.name.cmp(&b.name))),
        Sort::Category(index) => rows.sort_by(|a, b| {
            let key = |row: &Row| row.fractions.get(index).copied().flatten().unwrap_or(-1.0);
            key(b)
                .total_cmp(&key(a))
                .then(b.weight.cmp(&a.weight))
                .then(a.name.cmp(&b.name))
        }),
        Sort::Name => rows.sort_by(|a, b| a.name.cmp(&b.name).then(b.weight.cmp(&a.weight))),
    }
    rows
}

/// Widths of a stacked bar's segments: cumulative rounding, so the segments of fractions that
/// sum to 1 fill `width` exactly and each segment is within one cell of its true width.
pub fn segments(fractions: &[Option<f64>], width: u16) -> Vec<u16> {
    let mut sum = 0.0;
    let mut drawn = 0u16;
    fractions
        .iter()
        .map(|fraction| {
            sum += fraction.unwrap_or(0.0).max(0.0);
            let end = (sum.min(1.0) * f64::from(width)).round() as u16;
            let cells = end.saturating_sub(drawn);
            drawn = drawn.max(end);
            cells
        })
        .collect()
}

/// The glyph of a bar cell.
pub const BAR: &str = "█";

const ID_WIDTH: u16 = 8;
const NAME_WIDTH: u16 = 16;
const WEIGHT_WIDTH: u16 = 12;
const SHARE_WIDTH: u16 = 7;
const MIN_BAR: u16 = 10;

fn percent(fraction: Option<f64>) -> String {
    fraction.map_or_else(|| "-".to_owned(), |f| format!("{:.1}%", 100.0 * f))
}

fn weight_text(report: &Report, weight: u64) -> String {
    if report.weight_counter == "cpu-clock" {
        format!("{:.1}ms", weight as f64 / 1e6)
    } else {
        weight.to_string()
    }
}

/// Draws the whole screen into `buf` over `area`.
pub fn draw(buf: &mut Buffer, area: Rect, report: &Report, header: &Header, ui: &Ui) {
    if area.height == 0 || area.width == 0 {
        return;
    }
    let width = area.width;
    let mut y = area.y;
    let bottom = area.y + area.height;
    let line = |buf: &mut Buffer, y: &mut u16, x: u16, text: &str, style: Style| -> u16 {
        let (end, _) = buf.set_stringn(
            x,
            *y,
            text,
            usize::from((area.x + width).saturating_sub(x)),
            style,
        );
        end
    };
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let level_text = if report.level == 0 {
        "on-CPU time (no TopDown)".to_owned()
    } else {
        format!("level {}", ui.level)
    };
    let overhead = header
        .overhead_percent
        .map_or_else(|| "n/a".to_owned(), |p| format!("{p:.2}%"));
    let top_line = format!(
        "topdown top - model {}{} | {} | {} CPUs | refresh {} ms | overhead {} | {}",
        report.model,
        if report.synthetic { " (SYNTHETIC)" } else { "" },
        level_text,
        header.cpus,
        header.refresh_ms,
        overhead,
        report.scope,
    );
    line(buf, &mut y, area.x, &top_line, bold);
    y += 1;
    if y >= bottom {
        return;
    }

    // The legend: each category's colour, then the state of the keys.
    let categories = categories(report, ui.level);
    let mut x = area.x;
    for category in &categories {
        x = line(buf, &mut y, x, BAR, Style::default().fg(colour(category)));
        x = line(
            buf,
            &mut y,
            x,
            &format!(" {}  ", category),
            Style::default(),
        );
    }
    let sort = match ui.sort {
        Sort::Weight => report.weight_counter.clone(),
        Sort::Category(index) => categories
            .get(index)
            .cloned()
            .unwrap_or_else(|| report.weight_counter.clone()),
        Sort::Name => "name".to_owned(),
    };
    let mut state = format!("[{}, sort {}", ui.view.title(), sort);
    if !ui.filter.is_empty() && ui.editing.is_none() {
        state += &format!(", filter '{}'", ui.filter);
    }
    if ui.paused {
        state += ", PAUSED";
    }
    state += "]";
    line(buf, &mut y, x, &state, Style::default());
    y += 1;
    if y >= bottom {
        return;
    }

    // Column header.
    let (id_title, name_title) = ui.view.columns();
    let weight_title = if report.weight_counter == "cpu-clock" {
        "on-CPU"
    } else {
        report.weight_counter.as_str()
    };
    let category_width: u16 = if categories.len() > 5 { 7 } else { 8 };
    let fixed = ID_WIDTH
        + NAME_WIDTH
        + WEIGHT_WIDTH
        + SHARE_WIDTH
        + category_width * categories.len() as u16;
    let bar_width = width.saturating_sub(fixed + 1).max(MIN_BAR);
    let mut cells = vec![
        format!("{id_title:>w$} ", w = usize::from(ID_WIDTH - 1)),
        format!("{name_title:<w$} ", w = usize::from(NAME_WIDTH - 1)),
        format!("{weight_title:>w$} ", w = usize::from(WEIGHT_WIDTH - 1)),
        format!("{:>w$} ", "share", w = usize::from(SHARE_WIDTH - 1)),
    ];
    cells.extend(categories.iter().map(|category| {
        format!(
            "{:>w$} ",
            title(category),
            w = usize::from(category_width - 1)
        )
    }));
    line(
        buf,
        &mut y,
        area.x,
        &cells.concat(),
        Style::default().add_modifier(Modifier::REVERSED),
    );
    y += 1;

    let help = match &ui.editing {
        Some(text) => format!("filter: {text}_   (Enter keeps it, Esc clears it)"),
        None => ui.message.clone().unwrap_or_else(|| {
            if report.spans.is_empty() {
                "q quit  p/t/c/f processes/threads/cgroups/functions  s sort  / filter  l level  space pause  \u{2191}\u{2193} select  d distribution".to_owned()
            } else {
                "q quit  p/t/c/f/r processes/threads/cgroups/functions/spans  s sort  / filter  l level  space pause  \u{2191}\u{2193} select  d distribution".to_owned()
            }
        }),
    };
    let help_y = bottom.saturating_sub(1);
    let mut rows_bottom = help_y;
    let rows = rows(report, ui, &categories);
    let selected = (ui.view.selects() && !rows.is_empty()).then(|| ui.selected.min(rows.len() - 1));
    if ui.distribution && ui.view.selects() {
        // The lower part of the screen, up to half of it, shows the selected entry's calls.
        let room = (rows_bottom.saturating_sub(y)) / 2;
        let entry = selected.and_then(|index| rows[index].entry);
        let shown = match ui.view {
            View::Functions => entry
                .and_then(|index| report.functions.get(index))
                .map(|f| Shown {
                    name: f.symbol.clone(),
                    distribution: f.distribution.as_ref(),
                    per: "inclusive {weight} per call",
                }),
            _ => entry
                .and_then(|index| report.spans.get(index))
                .map(|span| Shown {
                    name: span_name(span),
                    distribution: span.distribution.as_ref(),
                    per: "{weight} per span",
                }),
        };
        let panel_top = rows_bottom.saturating_sub(room);
        distribution_panel(
            buf,
            area,
            panel_top,
            rows_bottom,
            report,
            shown,
            &categories,
        );
        rows_bottom = panel_top;
    }
    let total_weight = report.totals.count(&report.weight_counter);
    for (index, row) in rows.into_iter().enumerate() {
        if y >= rows_bottom {
            break;
        }
        let row_style = if selected == Some(index) {
            Style::default().add_modifier(Modifier::REVERSED)
        } else {
            Style::default()
        };
        let share = if total_weight == 0 {
            None
        } else {
            Some(row.weight as f64 / total_weight as f64)
        };
        let mut text = format!(
            "{:>w$} ",
            clip(&row.id, ID_WIDTH - 1),
            w = usize::from(ID_WIDTH - 1)
        );
        text += &format!(
            "{:<w$} ",
            clip(&row.name, NAME_WIDTH - 1),
            w = usize::from(NAME_WIDTH - 1)
        );
        text += &format!(
            "{:>w$} ",
            clip(&weight_text(report, row.weight), WEIGHT_WIDTH - 1),
            w = usize::from(WEIGHT_WIDTH - 1)
        );
        text += &format!("{:>w$} ", percent(share), w = usize::from(SHARE_WIDTH - 1));
        for fraction in &row.fractions {
            text += &format!(
                "{:>w$} ",
                percent(*fraction),
                w = usize::from(category_width - 1)
            );
        }
        let mut x = line(buf, &mut y, area.x, &text, row_style);
        // The software model has no categories: its bar is the row's share of on-CPU time.
        let (widths, colours): (Vec<u16>, Vec<Color>) = if categories.is_empty() {
            (segments(&[share], bar_width), vec![Color::Cyan])
        } else {
            (
                segments(&row.fractions, bar_width),
                categories.iter().map(|c| colour(c)).collect(),
            )
        };
        for (cells, colour) in widths.into_iter().zip(colours) {
            for _ in 0..cells {
                if x >= area.x + width {
                    break;
                }
                x = line(buf, &mut y, x, BAR, Style::default().fg(colour));
            }
        }
        y += 1;
    }
    if help_y > area.y + 2 {
        let mut help_y = help_y;
        line(buf, &mut help_y, area.x, &help, Style::default());
    }
}

/// What the distribution panel shows: the selected function or span.
struct Shown<'a> {
    name: String,
    distribution: Option<&'a Distribution>,
    /// What a bucket's values are, `{weight}` standing for the weight counter.
    per: &'static str,
}

/// How the spans view names a span kind and key: by its text where it has one (a query id's).
fn span_name(span: &SpanEntry) -> String {
    let key = span.text.as_ref().unwrap_or(&span.key);
    if key.is_empty() {
        span.kind.clone()
    } else {
        format!("{} {key}", span.kind)
    }
}

/// The selected function's or span's distribution (`crate::functions::distribution`) between
/// `top` and `bottom`: a title with its percentiles, then a line per bucket, slowest at the
/// bottom, with its bounds, calls, a bar of its calls (log scale) in its categories' colours and
/// why its calls take that long. Keeps to the last buckets when they do not all fit.
fn distribution_panel(
    buf: &mut Buffer,
    area: Rect,
    top: u16,
    bottom: u16,
    report: &Report,
    shown: Option<Shown<'_>>,
    categories: &[String],
) {
    if top >= bottom {
        return;
    }
    let mut y = top;
    let right = area.x + area.width;
    let put = |buf: &mut Buffer, x: u16, y: u16, text: &str, style: Style| -> u16 {
        buf.set_stringn(x, y, text, usize::from(right.saturating_sub(x)), style)
            .0
    };
    let weight = &report.weight_counter;
    let Some(shown) = shown else {
        put(
            buf,
            area.x,
            y,
            "nothing selected (up/down select a row)",
            Style::default(),
        );
        return;
    };
    let Some(distribution) = shown.distribution.filter(|d| d.calls() > 0) else {
        put(
            buf,
            area.x,
            y,
            &format!("{}: no calls in a histogram this refresh", shown.name),
            Style::default(),
        );
        return;
    };
    let percentiles = distribution
        .percentiles
        .map(|p| format!("p50 {:.0}  p90 {:.0}  p99 {:.0}", p.p50, p.p90, p.p99))
        .unwrap_or_default();
    put(
        buf,
        area.x,
        y,
        &format!(
            "{}: {}  {percentiles}",
            shown.name,
            shown.per.replace("{weight}", weight)
        ),
        Style::default().add_modifier(Modifier::BOLD),
    );
    y += 1;
    let most = distribution.most_calls();
    let shown = usize::from(bottom - y);
    let skip = distribution.buckets.len().saturating_sub(shown);
    const BOUNDS: usize = 24;
    const CALLS: usize = 9;
    const WHY: u16 = 34;
    let bar_width = area
        .width
        .saturating_sub((BOUNDS + CALLS) as u16 + WHY + 2)
        .max(MIN_BAR);
    for bucket in distribution.buckets.iter().skip(skip) {
        if y >= bottom {
            break;
        }
        let bounds = format!("[{}, {})", bucket.low, bucket.high);
        let mut x = put(
            buf,
            area.x,
            y,
            &format!(
                "{bounds:>w$} {:>c$} ",
                bucket.calls,
                w = BOUNDS - 1,
                c = CALLS - 1
            ),
            Style::default(),
        );
        let length = (f64::from(bar_width) * (1.0 + bucket.calls as f64).ln()
            / (1.0 + most as f64).ln())
        .round() as u16;
        let fractions: Vec<Option<f64>> = categories
            .iter()
            .map(|category| bucket.entity.metrics.get(category).copied().flatten())
            .collect();
        let (widths, colours): (Vec<u16>, Vec<Color>) = if categories.is_empty() {
            (vec![length.max(1)], vec![Color::Cyan])
        } else {
            (
                segments(&fractions, length.max(1)),
                categories.iter().map(|c| colour(c)).collect(),
            )
        };
        let bar_end = x + bar_width;
        for (cells, colour) in widths.into_iter().zip(colours) {
            for _ in 0..cells {
                x = put(buf, x, y, BAR, Style::default().fg(colour));
            }
        }
        let why =
            crate::functions::distribution::dominant_categories(&bucket.entity).unwrap_or_default();
        put(buf, bar_end.max(x) + 1, y, &why, Style::default());
        y += 1;
    }
}

/// `text` cut to `width` characters, the last one an ellipsis when cut.
fn clip(text: &str, width: u16) -> String {
    let width = usize::from(width);
    if text.chars().count() <= width {
        text.to_owned()
    } else {
        let mut cut: String = text.chars().take(width.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}

#[cfg(test)]
pub mod tests;
