//! Charts drawn on the server as SVG: a sensor's history (the average per bucket as a
//! line over its min/max band, the normal range as dashed lines), and a sparkline of a
//! device page. No script and no library: the browser only shows the markup.

use std::fmt::Write;

use chrono::{DateTime, Datelike, SecondsFormat, TimeZone, Utc};
use maud::{Markup, PreEscaped, html};

use crate::tools::defs::HistoryBucket;

const W: f64 = 800.0;
const H: f64 = 260.0;
/// Room for the axis labels.
const LEFT: f64 = 64.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 12.0;
const BOTTOM: f64 = 28.0;

/// One bucket, placed in time.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Bucket {
    t: i64,
    min: f64,
    max: f64,
    avg: f64,
}

/// A history chart over `[from, to)` (milliseconds).
pub struct Chart {
    pub from: i64,
    pub to: i64,
    /// The bucket width (milliseconds): buckets further apart are a gap, not a line.
    pub bucket_ms: i64,
    /// The sensor's normal range, drawn as dashed lines (the scale takes it in).
    pub range: Option<(f64, f64)>,
    pub unit: String,
    /// Stretches without stored points (milliseconds), as the history reports them.
    pub gaps: Vec<(i64, i64)>,
}

pub fn ms(t: &str) -> Option<i64> {
    DateTime::parse_from_rfc3339(t).ok().map(|t| t.timestamp_millis())
}

/// The buckets with numbers, in time order.
fn usable(buckets: &[HistoryBucket]) -> Vec<Bucket> {
    buckets
        .iter()
        .filter_map(|b| {
            // Drawn as floats (a chart has no use for the 17th digit).
            let (min, max, avg) = (b.min.as_ref()?.as_f64()?, b.max.as_ref()?.as_f64()?, b.avg?);
            (min.is_finite() && max.is_finite() && avg.is_finite()).then_some(Bucket {
                t: ms(&b.start)?,
                min,
                max,
                avg,
            })
        })
        .collect()
}

/// Runs of buckets without a gap between them: a gap is what `get_sensor_history`
/// reports as one (a stretch without stored points longer than the sensor's silence
/// allows), not a few empty buckets while a value stayed inside its deadband.
fn runs<'a>(buckets: &'a [Bucket], width: i64, gaps: &[(i64, i64)]) -> Vec<&'a [Bucket]> {
    let mut out = Vec::new();
    let mut start = 0;
    let apart = |a: &Bucket, b: &Bucket| gaps.iter().any(|&(from, to)| from < b.t && to > a.t + width);
    for i in 1..=buckets.len() {
        if i == buckets.len() || apart(&buckets[i - 1], &buckets[i]) {
            out.push(&buckets[start..i]);
            start = i;
        }
    }
    out.retain(|r| !r.is_empty());
    out
}

/// A short form of a number for an axis label.
fn label(v: f64) -> String {
    let a = v.abs();
    if a != 0.0 && !(0.01..100_000.0).contains(&a) {
        format!("{v:.2e}")
    } else if a >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// A time on the axis of a chart over `from..to`: the date once the range spans more than
/// half a day, the year once it is long (over a month) or not all in this year.
fn time_label(ms: i64, (from, to): (i64, i64)) -> String {
    let at = |ms: i64| Utc.timestamp_millis_opt(ms).single().unwrap_or_default();
    let span = to - from;
    let this_year = Utc::now().year();
    let other_year = at(from).year() != this_year || at(to).year() != this_year;
    let fmt = match (span > 12 * 3_600_000, span > 30 * 86_400_000 || other_year) {
        (false, false) => "%H:%M",
        (true, false) => "%m-%d %H:%M",
        _ if span > 30 * 86_400_000 => "%Y-%m-%d",
        _ => "%Y-%m-%d %H:%M",
    };
    at(ms).format(fmt).to_string()
}

impl Chart {
    /// The chart of `buckets`: an SVG element, or a sentence when there is nothing to draw.
    pub fn render(&self, buckets: &[HistoryBucket]) -> Markup {
        let data = usable(buckets);
        let span = (self.to - self.from).max(1);
        let (mut lo, mut hi) = data
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), b| (lo.min(b.min), hi.max(b.max)));
        if data.is_empty() {
            return html! { p.muted #chart-empty { "No stored history in this range." } };
        }
        // The scale takes in the normal range too, so its lines are always drawn: values
        // well inside it show as such, not as a line across the whole height.
        if let Some((a, b)) = self.range.filter(|(a, b)| a.is_finite() && b.is_finite()) {
            (lo, hi) = (lo.min(a).min(b), hi.max(a).max(b));
        }
        (lo, hi) = spread(lo, hi);
        let pad = (hi - lo) * 0.05;
        (lo, hi) = (lo - pad, hi + pad);
        let x = |t: i64| LEFT + (t - self.from) as f64 / span as f64 * (W - LEFT - RIGHT);
        let y = |v: f64| TOP + (hi - v) / (hi - lo) * (H - TOP - BOTTOM);
        let mut band = String::new();
        let mut line = String::new();
        for run in runs(&data, self.bucket_ms.max(1), &self.gaps) {
            let mut pts = String::new();
            for b in run {
                let _ = write!(pts, "{:.1},{:.1} ", x(b.t), y(b.max));
            }
            for b in run.iter().rev() {
                let _ = write!(pts, "{:.1},{:.1} ", x(b.t), y(b.min));
            }
            let _ = write!(band, r#"<polygon class="band" points="{}"/>"#, pts.trim_end());
            let avg: Vec<String> = match run {
                // One bucket alone is drawn as a short dash, so that it is seen.
                [b] => vec![
                    format!("{:.1},{:.1}", x(b.t) - 2.0, y(b.avg)),
                    format!("{:.1},{:.1}", x(b.t) + 2.0, y(b.avg)),
                ],
                _ => run.iter().map(|b| format!("{:.1},{:.1}", x(b.t), y(b.avg))).collect(),
            };
            let avg = avg.join(" ");
            let _ = write!(line, r#"<polyline class="avg" points="{avg}"/>"#);
        }
        let limits: Vec<f64> = self
            .range
            .map(|(a, b)| vec![a, b])
            .unwrap_or_default()
            .into_iter()
            .filter(|v| (lo..=hi).contains(v))
            .collect();
        let ticks = [hi - pad, (hi + lo) / 2.0, lo + pad];
        let bottom = H - BOTTOM;
        html! {
            svg.chart #chart viewBox={ "0 0 " (W) " " (H) } role="img" data-buckets=(data.len())
                aria-label={ "History from " (time_label(self.from, (self.from, self.to))) " to " (time_label(self.to, (self.from, self.to))) ", " (data.len()) (if data.len() == 1 { " bucket" } else { " buckets" }) } {
                title { "Average per bucket, with its minimum and maximum band" }
                @for v in ticks {
                    line.grid x1=(LEFT) x2=(W - RIGHT) y1=(format!("{:.1}", y(v))) y2=(format!("{:.1}", y(v))) {}
                    text x=(LEFT - 6.0) y=(format!("{:.1}", y(v) + 4.0)) text-anchor="end" { (label(v)) }
                }
                line.axis x1=(LEFT) x2=(LEFT) y1=(TOP) y2=(bottom) {}
                line.axis x1=(LEFT) x2=(W - RIGHT) y1=(bottom) y2=(bottom) {}
                @for v in &limits {
                    line.lim x1=(LEFT) x2=(W - RIGHT) y1=(format!("{:.1}", y(*v))) y2=(format!("{:.1}", y(*v))) {}
                }
                (PreEscaped(band))
                (PreEscaped(line))
                @for (i, anchor) in [(0i64, "start"), (1, "middle"), (2, "end")] {
                    text x=(format!("{:.1}", x(self.from + span * i / 2))) y=(H - 8.0) text-anchor=(anchor) {
                        (time_label(self.from + span * i / 2, (self.from, self.to)))
                    }
                }
                text x="4" y=(TOP + 4.0) { (self.unit) }
            }
        }
    }
}

/// A scale from `lo` to `hi` that has a height: constant values get room around them, as
/// much as a float that large can show (±1 around 21.5; ±1.8e16 around 2^64, where ±1 is
/// lost in the rounding and the chart divided by zero).
fn spread(lo: f64, hi: f64) -> (f64, f64) {
    let room = lo.abs().max(hi.abs()).max(1.0) * 1e-9;
    if hi - lo >= room {
        return (lo, hi);
    }
    let d = (lo.abs().max(hi.abs()) * 1e-3).max(1.0);
    (lo - d, hi + d)
}

/// A sparkline of averages (no axes), or a dash when there is nothing to draw.
pub fn sparkline(buckets: &[HistoryBucket], from: i64, to: i64) -> Markup {
    let data = usable(buckets);
    if data.len() < 2 {
        return html! { span.muted { "–" } };
    }
    let (lo, hi) =
        data.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), b| (lo.min(b.avg), hi.max(b.avg)));
    let (lo, hi) = spread(lo, hi);
    let span = (to - from).max(1) as f64;
    let pts: Vec<String> = data
        .iter()
        .map(|b| {
            format!("{:.1},{:.1}", (b.t - from) as f64 / span * 120.0, 22.0 - (b.avg - lo) / (hi - lo) * 20.0)
        })
        .collect();
    html! {
        svg.spark viewBox="0 0 120 24" role="img" aria-label={ "Last hour, " (label(lo)) " to " (label(hi)) } {
            polyline points=(pts.join(" ")) {}
        }
    }
}

/// An instant for a page (`2026-11-30 14:02:03Z`).
pub fn instant(ms_: i64) -> String {
    Utc.timestamp_millis_opt(ms_)
        .single()
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Secs, true).replace('T', " "))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::defs::Value;

    fn bucket(start: &str, min: f64, max: f64, avg: f64) -> HistoryBucket {
        HistoryBucket {
            start: start.into(),
            count: 1,
            min: Some(Value::Number(min)),
            max: Some(Value::Number(max)),
            avg: Some(avg),
            first: None,
            last: None,
        }
    }

    #[test]
    fn a_gap_splits_the_line_and_the_band() {
        let b = [
            bucket("2026-01-01T00:00:00Z", 1.0, 3.0, 2.0),
            bucket("2026-01-01T00:01:00Z", 1.0, 3.0, 2.0),
            bucket("2026-01-01T00:10:00Z", 2.0, 4.0, 3.0),
            bucket("2026-01-01T00:11:00Z", 2.0, 4.0, 3.0),
        ];
        let from = ms("2026-01-01T00:00:00Z").unwrap();
        let c = Chart {
            from,
            to: from + 3_600_000,
            bucket_ms: 60_000,
            range: Some((0.0, 3.5)),
            unit: "bar".into(),
            gaps: vec![(from + 60_000, from + 600_000)],
        };
        let svg = c.render(&b).into_string();
        assert_eq!(svg.matches("<polyline").count(), 2, "{svg}");
        assert_eq!(svg.matches("<polygon").count(), 2);
        // Regression (issue 32): a limit outside the data's scale (0.0 here) was not drawn;
        // the scale takes in the normal range.
        assert_eq!(svg.matches(r#"class="lim""#).count(), 2);
        assert!(svg.contains(r#"data-buckets="4""#));
    }

    #[test]
    fn buckets_apart_without_a_reported_gap_are_one_line() {
        let b =
            [bucket("2026-01-01T00:00:00Z", 1.0, 3.0, 2.0), bucket("2026-01-01T00:10:00Z", 2.0, 4.0, 3.0)];
        let from = ms("2026-01-01T00:00:00Z").unwrap();
        let c = Chart {
            from,
            to: from + 3_600_000,
            bucket_ms: 60_000,
            range: None,
            unit: "bar".into(),
            gaps: Vec::new(),
        };
        assert_eq!(c.render(&b).into_string().matches("<polyline").count(), 1);
    }

    /// Regression (helper-4): a constant 2^64 − 1 drew NaN and inf (±1 is lost at that size).
    #[test]
    fn constant_huge_values_are_drawn() {
        let v = u64::MAX as f64;
        let b = [bucket("2026-01-01T00:00:00Z", v, v, v), bucket("2026-01-01T00:01:00Z", v, v, v)];
        let from = ms("2026-01-01T00:00:00Z").unwrap();
        let c = Chart {
            from,
            to: from + 3_600_000,
            bucket_ms: 60_000,
            range: None,
            unit: "".into(),
            gaps: Vec::new(),
        };
        let svg = c.render(&b).into_string() + &sparkline(&b, from, from + 3_600_000).into_string();
        assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
        assert_eq!(spread(21.5, 21.5), (20.5, 22.5), "small constants as before");
    }

    #[test]
    fn nothing_to_draw_says_so() {
        let c = Chart { from: 0, to: 1, bucket_ms: 1, range: None, unit: "bar".into(), gaps: Vec::new() };
        assert!(c.render(&[]).into_string().contains("No stored history"));
        let b = HistoryBucket { min: None, ..bucket("2026-01-01T00:00:00Z", 0.0, 0.0, 0.0) };
        assert!(c.render(&[b]).into_string().contains("No stored history"));
        assert!(sparkline(&[], 0, 1).into_string().contains('–'));
    }

    #[test]
    fn labels_are_short() {
        assert_eq!(label(12.345), "12.35");
        assert_eq!(label(1234.4), "1234");
        assert_eq!(label(3.0), "3");
        assert_eq!(label(0.000_12), "1.20e-4");
    }

    #[test]
    fn time_labels_name_the_day_past_half_a_day_and_the_year_when_it_is_not_plain() {
        let t = 1_767_225_600_000 - 3_600_000; // 2025-12-31 23:00 UTC, a past year
        let now = Utc::now().timestamp_millis();
        assert_eq!(time_label(now - 3_600_000, (now - 3_600_000, now)).len(), 5, "HH:MM within hours");
        assert_eq!(time_label(now - 86_400_000, (now - 86_400_000, now)).len(), 11, "MM-DD HH:MM for a day");
        assert_eq!(time_label(t, (t - 3_600_000, t)), "2025-12-31 23:00", "another year is named");
        assert_eq!(time_label(t, (t - 7 * 86_400_000, t)), "2025-12-31 23:00");
        assert_eq!(time_label(t, (t - 365 * 86_400_000, t)), "2025-12-31");
    }
}
