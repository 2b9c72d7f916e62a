//! The `report -o html` page: per monitored policy its would-deny counts over time (a bar
//! chart drawn as inline SVG from a series computed here), the promotion status, and the
//! aggregated flows — the same [`Report`] the JSON and table outputs print, plus the events'
//! timestamps for the series.
//!
//! The page needs no script: every number is computed in Rust and written as markup.
//!
//! Policy names are namespaced (`ns/name`) or admin policies (`Kind/name`, SPEC 8): both are
//! only ever text. A policy row links to its chart by the chart's position (`#series-N`), never
//! by an anchor built from the name.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use netwarden_monitor::event::{Event, EventAction};
use netwarden_monitor::report::{PolicyRow, Report};
use netwarden_monitor::Timestamp;

use super::{document, escape};

/// At most this many bars per chart: enough to see a trend, few enough to read.
const MAX_BUCKETS: i64 = 60;

/// Bucket widths a reader recognises, in seconds; wider spans use whole days.
const NICE_WIDTHS: &[i64] = &[
    1, 5, 10, 30, 60, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400,
];

/// The time axis every chart of the page shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Axis {
    /// Start of the first bucket (a multiple of `bucket_seconds` since the epoch).
    pub start: Timestamp,
    pub bucket_seconds: i64,
    pub buckets: usize,
}

impl Axis {
    /// The axis from `first` to `last` (inclusive) with at most [`MAX_BUCKETS`] buckets.
    pub fn spanning(first: Timestamp, last: Timestamp) -> Axis {
        let (first_s, last_s) = (first.0.div_euclid(1_000_000), last.0.div_euclid(1_000_000));
        let span = (last_s - first_s).max(0) + 1;
        // Buckets needed for `span` seconds at `width` each, rounding up.
        let needed = |width: i64| span / width + i64::from(span % width != 0);
        // One bucket is kept for the start's rounding down to a multiple of the width.
        let width = NICE_WIDTHS
            .iter()
            .copied()
            .find(|w| needed(*w) < MAX_BUCKETS)
            .unwrap_or_else(|| (span / (MAX_BUCKETS - 1) / 86400 + 1) * 86400);
        let start = first_s.div_euclid(width) * width;
        let buckets = ((last_s - start) / width + 1) as usize;
        Axis {
            start: Timestamp::from_secs(start),
            bucket_seconds: width,
            buckets,
        }
    }

    /// The bucket holding `t`, if it is on the axis.
    pub fn bucket(&self, t: Timestamp) -> Option<usize> {
        let offset = t.0.div_euclid(1_000_000) - self.start.0.div_euclid(1_000_000);
        let i = offset.div_euclid(self.bucket_seconds);
        (0..self.buckets as i64).contains(&i).then_some(i as usize)
    }

    fn bucket_start(&self, i: usize) -> Timestamp {
        Timestamp::from_secs(self.start.0.div_euclid(1_000_000) + i as i64 * self.bucket_seconds)
    }
}

/// One policy's chart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicySeries {
    pub policy: String,
    /// Would-deny events per bucket of the page's axis.
    pub counts: Vec<u64>,
}

/// Everything the report page shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportPage {
    pub title: String,
    pub report: Report,
    /// `None` when there is no event to put on a time axis.
    pub axis: Option<Axis>,
    /// One per policy of the report that is monitored (it has would-deny events, or the
    /// report lists it as monitored without any).
    pub series: Vec<PolicySeries>,
}

/// Would-deny counts per bucket for every policy `events` name as monitored, on an axis from
/// the first to the last would-deny (a recorded stream may be read long after it ended, so
/// `now` does not stretch the axis; the clean window's start is marked when it falls on it).
pub fn report_page(report: &Report, events: &[Event], title: &str) -> ReportPage {
    let would_deny = || events.iter().filter(|e| e.action == EventAction::WouldDeny);
    let first = would_deny().map(|e| e.time).min();
    let last = would_deny().map(|e| e.time).max();
    let axis = first.zip(last).map(|(f, l)| Axis::spanning(f, l));
    let mut counts: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    // Every policy that would-deny, and every monitored one with a clean record.
    for row in &report.policies {
        if row.would_deny > 0 || row.deny == 0 {
            counts.insert(&row.policy, vec![0; axis.map_or(0, |a| a.buckets)]);
        }
    }
    if let Some(axis) = axis {
        for ev in would_deny() {
            let Some(i) = axis.bucket(ev.time) else {
                continue;
            };
            for p in &ev.policies {
                if let Some(series) = counts.get_mut(p.as_str()) {
                    series[i] += 1;
                }
            }
        }
    }
    ReportPage {
        title: title.to_owned(),
        report: report.clone(),
        axis,
        series: counts
            .into_iter()
            .map(|(policy, counts)| PolicySeries {
                policy: policy.to_owned(),
                counts,
            })
            .collect(),
    }
}

const CHART_W: usize = 600;
const CHART_H: usize = 90;
const PAD_L: usize = 36;
const PAD_B: usize = 16;

/// A bar chart of `counts` on `axis`, with the start of the clean window marked.
fn chart(series: &PolicySeries, axis: &Axis, clean_from: Timestamp) -> String {
    let max = series.counts.iter().copied().max().unwrap_or(0).max(1);
    let plot_w = (CHART_W - PAD_L) as f64;
    let plot_h = (CHART_H - PAD_B - 4) as f64;
    let bar_w = plot_w / axis.buckets.max(1) as f64;
    let mut svg = format!(
        "<svg class=\"chart\" width=\"{CHART_W}\" height=\"{CHART_H}\" viewBox=\"0 0 {CHART_W} {CHART_H}\" role=\"img\">\
<title>would-deny per {} s: {}</title>",
        axis.bucket_seconds,
        escape(&series.policy)
    );
    let base = CHART_H - PAD_B;
    let _ = write!(
        svg,
        "<line x1=\"{PAD_L}\" y1=\"{base}\" x2=\"{CHART_W}\" y2=\"{base}\"/>\
<text x=\"{}\" y=\"12\" text-anchor=\"end\">{max}</text><text x=\"{}\" y=\"{base}\" text-anchor=\"end\">0</text>",
        PAD_L - 4,
        PAD_L - 4
    );
    for (i, count) in series.counts.iter().enumerate() {
        if *count == 0 {
            continue;
        }
        let h = plot_h * *count as f64 / max as f64;
        let _ = write!(
            svg,
            "<rect class=\"b\" x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\"><title>{}: {count} would-deny</title></rect>",
            PAD_L as f64 + i as f64 * bar_w,
            base as f64 - h,
            (bar_w - 1.0).max(1.0),
            axis.bucket_start(i)
        );
    }
    if let Some(i) = axis.bucket(clean_from) {
        let x = PAD_L as f64 + i as f64 * bar_w;
        let _ = write!(
            svg,
            "<line x1=\"{x:.1}\" y1=\"4\" x2=\"{x:.1}\" y2=\"{base}\" stroke-dasharray=\"3 3\"><title>clean window starts {clean_from}</title></line>"
        );
    }
    let end = axis.bucket_start(axis.buckets);
    let _ = write!(
        svg,
        "<text x=\"{PAD_L}\" y=\"{}\">{}</text><text x=\"{CHART_W}\" y=\"{}\" text-anchor=\"end\">{end}</text></svg>",
        CHART_H - 3,
        axis.start,
        CHART_H - 3
    );
    svg
}

/// The verdict, and why (`report`'s reason: which evidence condition fails).
fn status_cell(row: &PolicyRow) -> String {
    let text = row.status.as_str();
    let mut cell = format!(
        "<span class=\"status {}\">{}</span>",
        text.replace(' ', "-"),
        escape(text)
    );
    if !row.reason.is_empty() {
        let _ = write!(
            cell,
            " <span class=\"reason\">{}</span>",
            escape(&row.reason)
        );
    }
    cell
}

fn or_dash(t: Option<Timestamp>) -> String {
    t.map_or_else(|| "-".to_owned(), |t| t.to_string())
}

/// The page.
pub fn render(page: &ReportPage) -> String {
    let r = &page.report;
    let mut body = format!(
        "<h1>{}</h1><p class=\"muted\">As of {}, clean window {} s.</p><h2>Policies</h2>",
        escape(&page.title),
        r.now,
        r.clean_for_seconds
    );
    if r.policies.is_empty() {
        body.push_str("<p>No events.</p>");
    } else {
        body.push_str(
            "<table class=\"rows\" id=\"policies\"><tr><th>Policy</th><th>Would-deny</th><th>Deny</th>\
<th>Last would-deny</th><th>Status</th></tr>",
        );
        let chart_of: BTreeMap<&str, usize> = match page.axis {
            Some(_) => page
                .series
                .iter()
                .enumerate()
                .map(|(i, s)| (s.policy.as_str(), i))
                .collect(),
            None => BTreeMap::new(),
        };
        for p in &r.policies {
            let name = match chart_of.get(p.policy.as_str()) {
                Some(i) => format!("<a href=\"#series-{i}\">{}</a>", escape(&p.policy)),
                None => escape(&p.policy),
            };
            let _ = write!(
                body,
                "<tr><td>{name}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                p.would_deny,
                p.deny,
                or_dash(p.last_would_deny),
                status_cell(p)
            );
        }
        body.push_str("</table>");
    }
    body.push_str("<h2>Would-deny over time</h2>");
    match page.axis {
        None => body.push_str("<p>No would-deny events.</p>"),
        Some(axis) => {
            let clean_from = r
                .now
                .minus(std::time::Duration::from_secs(r.clean_for_seconds));
            let _ = write!(
                body,
                "<p class=\"muted\">{} s per bar; the dashed line is where the clean window starts.</p>",
                axis.bucket_seconds
            );
            for (i, s) in page.series.iter().enumerate() {
                let total: u64 = s.counts.iter().sum();
                let _ = write!(
                    body,
                    "<div class=\"series\" id=\"series-{i}\"><h3>{} <span class=\"muted\">({total})</span></h3>{}</div>",
                    escape(&s.policy),
                    chart(s, &axis, clean_from)
                );
            }
        }
    }
    body.push_str("<h2>Flows</h2>");
    if r.flows.is_empty() {
        body.push_str("<p>None.</p>");
    } else {
        body.push_str(
            "<table class=\"rows\" id=\"flows\"><tr><th>Policy</th><th>Action</th><th>Source</th>\
<th>Destination</th><th>Port</th><th>Count</th><th>First seen</th><th>Last seen</th></tr>",
        );
        for f in &r.flows {
            let port = match f.port {
                Some(p) => format!("{p}/{}", f.protocol),
                None => f.protocol.clone(),
            };
            let _ = write!(
                body,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&f.policy),
                f.action.as_str(),
                escape(&f.source),
                escape(&f.destination),
                escape(&port),
                f.count,
                f.first_seen,
                f.last_seen
            );
        }
        body.push_str("</table>");
    }
    document(&page.title, "", &body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use netwarden_engine::Direction;
    use netwarden_monitor::aggregate;
    use netwarden_monitor::event::Cause;
    use std::time::Duration;

    fn would_deny(secs: i64, pod: &str, policies: &[&str]) -> Event {
        Event {
            time: Timestamp::from_secs(secs),
            node: "n".into(),
            action: EventAction::WouldDeny,
            direction: Direction::Ingress,
            pod: pod.into(),
            interface: "eth0".into(),
            network: "default".into(),
            peer: Some("x/client-0".into()),
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
            sport: Some(40000),
            dport: Some(80),
            protocol: "TCP".into(),
            policies: policies.iter().map(|s| s.to_string()).collect(),
            enforced_policies: vec![],
            cause: Some(Cause::NewIsolation),
        }
    }

    #[test]
    fn axis_uses_nice_widths() {
        let a = Axis::spanning(
            Timestamp::from_secs(1000),
            Timestamp::from_secs(1000 + 3599),
        );
        // One hour from 1000 s: 60 one-minute buckets are too many, so five minutes.
        assert_eq!((a.bucket_seconds, a.buckets), (300, 13));
        assert_eq!(a.start, Timestamp::from_secs(900));
        assert_eq!(a.bucket(Timestamp::from_secs(1199)), Some(0));
        assert_eq!(a.bucket(Timestamp::from_secs(1200)), Some(1));
        assert_eq!(a.bucket(Timestamp::from_secs(899)), None);
        let one = Axis::spanning(Timestamp::from_secs(5), Timestamp::from_secs(5));
        assert_eq!((one.bucket_seconds, one.buckets), (1, 1));
        // A year: whole days.
        let y = Axis::spanning(Timestamp::from_secs(0), Timestamp::from_secs(365 * 86400));
        assert_eq!(y.bucket_seconds % 86400, 0);
        assert!(y.buckets as i64 <= MAX_BUCKETS, "{y:?}");
    }

    #[test]
    fn series_count_would_deny_per_bucket_and_policy() {
        let events = vec![
            would_deny(0, "x/web-0", &["x/new"]),
            would_deny(10, "x/web-0", &["x/new", "x/other"]),
            would_deny(300, "x/web-1", &["x/new"]),
        ];
        let report = aggregate(
            &events,
            &[],
            Timestamp::from_secs(600),
            Duration::from_secs(60),
        );
        let page = report_page(&report, &events, "r");
        let axis = page.axis.unwrap();
        // 0 s to 300 s: 10 s buckets (5 s would make 61).
        assert_eq!((axis.bucket_seconds, axis.buckets), (10, 31));
        let series = |p: &str| page.series.iter().find(|s| s.policy == p).unwrap();
        assert_eq!(series("x/new").counts.iter().sum::<u64>(), 3);
        assert_eq!(
            (
                series("x/new").counts[0],
                series("x/new").counts[1],
                series("x/new").counts[30]
            ),
            (1, 1, 1)
        );
        assert_eq!(series("x/other").counts.iter().sum::<u64>(), 1);
        let html = render(&page);
        assert_eq!(html.matches("<svg class=\"chart\"").count(), 2);
        assert_eq!(html.matches("<rect class=\"b\"").count(), 4);
        // Events alone are no evidence for promotion: without the agents' status records the
        // verdict says so (the verdicts themselves are tested in netwarden-monitor).
        assert!(html.contains("<span class=\"status not-ready\">not ready</span>"));
        assert!(html.contains("no evidence yet"), "{html}");
        assert!(!html.contains("<span class=\"status ready-to-promote\">"));
    }

    /// An admin policy (SPEC 8), named `Kind/name` by its events, gets its chart, its row and
    /// its flows beside a namespaced policy of the same name.
    #[test]
    fn admin_policies_have_their_chart_and_rows() {
        let events = vec![
            would_deny(0, "x/web-0", &["ClusterNetworkPolicy/web"]),
            would_deny(5, "x/web-0", &["x/web", "ClusterNetworkPolicy/web"]),
        ];
        let report = aggregate(
            &events,
            &[],
            Timestamp::from_secs(60),
            Duration::from_secs(60),
        );
        let page = report_page(&report, &events, "r");
        let series = |p: &str| page.series.iter().find(|s| s.policy == p).unwrap();
        assert_eq!(
            series("ClusterNetworkPolicy/web")
                .counts
                .iter()
                .sum::<u64>(),
            2
        );
        assert_eq!(series("x/web").counts.iter().sum::<u64>(), 1);
        let html = render(&page);
        assert_eq!(html.matches("<svg class=\"chart\"").count(), 2);
        assert!(html.contains("ClusterNetworkPolicy/web"), "{html}");
    }

    #[test]
    fn hostile_policy_names_are_escaped() {
        let hostile = "x/<script>alert(1)</script>";
        let events = vec![would_deny(0, "x/<b>pod</b>", &[hostile])];
        let report = aggregate(
            &events,
            &[],
            Timestamp::from_secs(10),
            Duration::from_secs(60),
        );
        let html = render(&report_page(&report, &events, "r"));
        assert!(!html.contains("<script"), "{html}");
        assert!(!html.contains("<b>"), "{html}");
        assert!(html.contains("x/&lt;script&gt;alert(1)&lt;/script&gt;"));
    }

    /// Admin policies (SPEC 8) are named `Kind/name`: rows and charts show the name as text,
    /// and a row links to its chart by position, so neither the `/` nor markup in a name
    /// makes or breaks an anchor.
    #[test]
    fn admin_policy_rows_link_to_their_charts() {
        let hostile = "AdminNetworkPolicy/a\"><b>x</b>#series-0";
        let mut events = vec![
            would_deny(0, "shop/web-0", &["AdminNetworkPolicy/audit"]),
            would_deny(20, "shop/web-0", &["AdminNetworkPolicy/audit", hostile]),
            would_deny(40, "shop/web-0", &["shop/new"]),
        ];
        for e in &mut events {
            e.cause = Some(Cause::AdminTier);
        }
        let report = aggregate(
            &events,
            &[],
            Timestamp::from_secs(100),
            Duration::from_secs(60),
        );
        let page = report_page(&report, &events, "r");
        let names: Vec<&str> = page.series.iter().map(|s| s.policy.as_str()).collect();
        assert_eq!(
            names,
            [
                "AdminNetworkPolicy/a\"><b>x</b>#series-0",
                "AdminNetworkPolicy/audit",
                "shop/new"
            ]
        );
        let html = render(&page);
        assert!(!html.contains("<b>") && !html.contains("\"><b"), "{html}");
        for (i, name) in names.iter().enumerate() {
            let link = format!("<td><a href=\"#series-{i}\">{}</a></td>", escape(name));
            assert!(html.contains(&link), "{link} missing: {html}");
            let chart = format!(
                "<div class=\"series\" id=\"series-{i}\"><h3>{} ",
                escape(name)
            );
            assert!(html.contains(&chart), "{chart} missing: {html}");
        }
        // Every anchor is one the page made: ids `series-N` only.
        assert_eq!(html.matches(" id=\"series-").count(), 3);
        assert_eq!(html.matches("href=\"#").count(), 3);
        let audit = &page.series[1];
        assert_eq!(audit.counts.iter().sum::<u64>(), 2);
    }

    #[test]
    fn no_events_no_chart() {
        let report = aggregate(&[], &[], Timestamp::from_secs(10), Duration::from_secs(60));
        let html = render(&report_page(&report, &[], "r"));
        assert!(html.contains("No would-deny events.") && !html.contains("<svg"));
    }
}
