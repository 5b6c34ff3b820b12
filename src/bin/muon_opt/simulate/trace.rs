//! The timeline as a Chrome/Perfetto trace (`chrome://tracing`, ui.perfetto.dev: one process
//! per rank, one track per stream, one slice per action) and as an SVG picture.

use serde_json::{Value, json};

use muon_opt::backend::ops::StreamKind;
use muon_opt::sim::engine::{Call, Class, Slice, Timeline};

fn stream_id(s: StreamKind) -> u32 {
    match s {
        StreamKind::Compute => 0,
        StreamKind::Comm => 1,
    }
}

fn slice_name(s: &Slice) -> String {
    match s.label.call {
        Call::WaitParams(b) => format!("{} (wait_params b{b})", s.label.what),
        Call::GradReady(b) => format!("{} (grad b{b})", s.label.what),
        Call::Forward => "forward".into(),
        Call::Backward => "backward".into(),
        Call::Step => format!("{} (step)", s.label.what),
        Call::ZeroGrad => format!("{} (zero_grad)", s.label.what),
        Call::Setup => format!("{} (setup)", s.label.what),
    }
}

fn category(c: Class) -> &'static str {
    match c {
        Class::Forward => "forward",
        Class::Backward => "backward",
        Class::Optimizer => "optimizer",
        Class::Collective => "collective",
        Class::Event => "event",
        Class::HostCopy => "host copy",
    }
}

/// The ranks worth drawing: all of a small group, else rank 0 and the rank with the most
/// optimizer compute.
pub fn ranks_to_show(timelines: &[Timeline]) -> Vec<usize> {
    if timelines.len() <= 8 {
        return (0..timelines.len()).collect();
    }
    let busy = |t: &Timeline| -> f64 {
        t.slices
            .iter()
            .filter(|s| s.class == Class::Optimizer)
            .map(|s| s.end - s.start)
            .sum()
    };
    let busiest = (0..timelines.len())
        .max_by(|&a, &b| busy(&timelines[a]).total_cmp(&busy(&timelines[b])))
        .unwrap_or(0);
    if busiest == 0 { vec![0] } else { vec![0, busiest] }
}

/// Chrome trace JSON of `ranks` (times in µs).
pub fn chrome(timelines: &[Timeline], ranks: &[usize]) -> String {
    let mut events: Vec<Value> = Vec::new();
    for &r in ranks {
        events.push(json!({"ph": "M", "name": "process_name", "pid": r, "args": {"name": format!("rank {r}")}}));
        for (tid, name) in [(0, "compute stream"), (1, "comm stream")] {
            events.push(json!({"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": name}}));
        }
        for s in timelines[r].slices.iter().filter(|s| s.class != Class::Event) {
            events.push(json!({
                "name": slice_name(s),
                "cat": category(s.class),
                "ph": "X",
                "pid": r,
                "tid": stream_id(s.stream),
                "ts": s.start * 1e6,
                "dur": (s.end - s.start) * 1e6,
            }));
        }
    }
    json!({"traceEvents": events, "displayTimeUnit": "ms"}).to_string()
}

fn color(c: Class) -> &'static str {
    match c {
        Class::Forward => "#8fb8de",
        Class::Backward => "#5b8db8",
        Class::Optimizer => "#e07b39",
        Class::Collective => "#6aa84f",
        Class::Event => "#999999",
        Class::HostCopy => "#cc0000",
    }
}

/// An SVG timeline of `ranks`: one row per stream, slices coloured by kind.
pub fn svg(timelines: &[Timeline], ranks: &[usize], title: &str) -> String {
    const WIDTH: f64 = 1600.0;
    const LEFT: f64 = 170.0;
    const ROW: f64 = 22.0;
    let end = ranks
        .iter()
        .flat_map(|&r| timelines[r].slices.iter().map(|s| s.end))
        .fold(1e-9, f64::max);
    let scale = (WIDTH - LEFT - 10.0) / end;
    let height = 60.0 + ROW * 2.0 * ranks.len() as f64 + 40.0;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n<text x=\"10\" y=\"20\">{title} ({:.3} ms)</text>\n",
        end * 1e3
    );
    for (row, &r) in ranks.iter().enumerate() {
        for (k, name) in [(0usize, "compute"), (1, "comm")] {
            let y = 40.0 + ROW * (2 * row + k) as f64;
            out.push_str(&format!(
                "<text x=\"10\" y=\"{:.1}\">rank {r} {name}</text>\n",
                y + 15.0
            ));
            for s in timelines[r]
                .slices
                .iter()
                .filter(|s| s.class != Class::Event && stream_id(s.stream) as usize == k)
            {
                let w = ((s.end - s.start) * scale).max(0.5);
                out.push_str(&format!(
                    "<rect x=\"{:.2}\" y=\"{y:.1}\" width=\"{w:.2}\" height=\"{:.1}\" fill=\"{}\"><title>{}</title></rect>\n",
                    LEFT + s.start * scale,
                    ROW - 4.0,
                    color(s.class),
                    slice_name(s)
                ));
            }
        }
    }
    let legend_y = height - 15.0;
    for (i, c) in [
        Class::Forward,
        Class::Backward,
        Class::Optimizer,
        Class::Collective,
        Class::HostCopy,
    ]
    .into_iter()
    .enumerate()
    {
        let x = 10.0 + 150.0 * i as f64;
        out.push_str(&format!(
            "<rect x=\"{x}\" y=\"{:.1}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{legend_y:.1}\">{}</text>\n",
            legend_y - 10.0,
            color(c),
            x + 16.0,
            category(c)
        ));
    }
    out.push_str("</svg>\n");
    out
}
