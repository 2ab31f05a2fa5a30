//! `memprobe run --html FILE`: the run's report as one self-contained page
//! to explore in a browser. The JSON document (the same as `--json`'s) is
//! embedded, and drawn by `report.js` on canvases of its own: no library, no
//! network (every script and style is inline; nothing is fetched).
//!
//! The page zooms down to what the run kept: the timeline's points (at
//! most 100 000, thinned keeping maxima) and the followed processes' lines;
//! each pixel column draws the minimum and maximum of the points it holds,
//! so no peak is lost at any zoom.

use super::report::RunReport;

const SCRIPT: &str = include_str!("report.js");
const STYLE: &str = include_str!("report.css");

/// The page for `rep`.
pub(crate) fn render(rep: &RunReport) -> Result<String, String> {
    let doc = serde_json::to_value(rep).map_err(|e| e.to_string())?;
    render_value(&doc)
}

/// The page for a run's JSON document.
pub(crate) fn render_value(doc: &serde_json::Value) -> Result<String, String> {
    let json = serde_json::to_string(doc).map_err(|e| e.to_string())?;
    let command = doc["command"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    let title = format!("memprobe run: {}", html_text(&command));
    let mut page = String::with_capacity(json.len() + SCRIPT.len() + 4096);
    page.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    // Nothing may be fetched: the page works offline, as an artifact.
    page.push_str(
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
         script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">\n",
    );
    page.push_str(&format!(
        "<title>{title}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n"
    ));
    page.push_str(&format!(
        "<header><h1>{title}</h1><p>{}</p></header>\n",
        html_text(&headline(doc))
    ));
    page.push_str(
        "<div id=\"controls\"><button id=\"reset\">whole run</button> \
         <span id=\"range\"></span> <span class=\"hint\">wheel: zoom; drag: zoom to a span; \
         double-click: the whole run; hover a phase for its peaks</span></div>\n\
         <div id=\"panels\"></div>\n<div id=\"toggles\"></div>\n<div id=\"tip\" hidden></div>\n",
    );
    page.push_str("<script type=\"application/json\" id=\"memprobe-data\">");
    page.push_str(&script_safe(&json));
    page.push_str("</script>\n<script>\n");
    page.push_str(SCRIPT);
    page.push_str("</script>\n</body>\n</html>\n");
    Ok(page)
}

/// One line under the title: how the command ended and its peaks.
fn headline(doc: &serde_json::Value) -> String {
    let mib = |v: &serde_json::Value| {
        v.as_u64()
            .map(|b| format!("{:.1} MiB", b as f64 / 1048576.0))
    };
    let mut parts = Vec::new();
    if let Some(d) = doc["duration_s"].as_f64() {
        parts.push(format!("ran {d:.2} s"));
    }
    if let Some(s) = doc["exit"]["status"].as_i64() {
        parts.push(format!("exit status {s}"));
    }
    if let Some(p) = mib(&doc["tree"]["peak_rss_bytes"]) {
        parts.push(format!("peak tree RSS {p}"));
    }
    if let Some(p) = mib(&doc["peak_process"]["peak_rss_bytes"]) {
        parts.push(format!(
            "peak single process {p} (pid {})",
            doc["peak_process"]["pid"]
        ));
    }
    if let Some(v) = doc["oom_kill"]["verdict"].as_str().filter(|v| *v != "none") {
        parts.push(format!("OOM kill: {v}"));
    }
    parts.join(", ")
}

/// `s` as HTML text.
fn html_text(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// JSON text that cannot end its `<script>` element: `<` appears in JSON
/// only inside strings, where `\u003c` means the same.
fn script_safe(json: &str) -> String {
    json.replace('<', "\\u003c")
}

#[cfg(test)]
mod tests;
