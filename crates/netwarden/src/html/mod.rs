//! Self-contained HTML pages for `reach -o html`, `report -o html` and `diff -o html`.
//!
//! Each page is one file a user can mail or attach to a pull request: CSS and JavaScript are
//! inline, nothing is fetched (no CDN, no web font, no image), so it opens offline and leaks
//! nothing about the cluster to a third party.
//!
//! Pages are built in two pure steps: a typed page model from the same data the JSON outputs
//! come from ([`matrix::reach_page`], [`matrix::diff_page`], [`report::report_page`]), then a
//! renderer from the model to a string. Object names are attacker-controlled text (anyone who
//! can create a pod names it): they reach the page only through [`escape`] (HTML text and
//! attribute values) or [`script_json`] (data read by the page's script, which writes it with
//! `textContent`, never as markup).

pub mod matrix;
pub mod report;

use serde::Serialize;

/// The page frame every page shares: colours, tables, the legend.
const BASE_CSS: &str = include_str!("page.css");

/// `text` escaped for an HTML text node or a quoted attribute value.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `value` as JSON that is safe inside `<script type="application/json">`: `<`, `>` and `&`
/// are written as `\u003c`, `\u003e`, `\u0026` (so no `</script>` or `<!--` can end or
/// confuse the element), and U+2028/U+2029 escaped as older parsers want. The result is still
/// the same JSON value.
pub fn script_json(value: &impl Serialize) -> String {
    // Serializing the page models (strings, numbers, vectors) cannot fail.
    let json = serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned());
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

/// The document around a page's body: `title` is escaped here, `head_extra` and `body` are
/// markup the caller built with [`escape`].
fn document(title: &str, head_extra: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">\
<title>{}</title><style>{BASE_CSS}</style>{head_extra}</head>\n<body>{body}</body></html>\n",
        escape(title)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_script_ends() {
        assert_eq!(
            escape(r#"<b a="x" b='y'>&</b>"#),
            "&lt;b a=&quot;x&quot; b=&#39;y&#39;&gt;&amp;&lt;/b&gt;"
        );
        let hostile = "</script><script>alert(1)</script>\u{2028}";
        let json = script_json(&[hostile]);
        assert!(!json.contains('<') && !json.contains('>'), "{json}");
        // Still the same value for the page's JSON.parse.
        let back: Vec<String> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, [hostile]);
    }

    #[test]
    fn document_fetches_nothing() {
        let page = document("<t>", "", "<p>x</p>");
        assert!(page.starts_with("<!DOCTYPE html>"));
        assert!(page.contains("<title>&lt;t&gt;</title>"));
        assert!(page.contains("default-src 'none'"));
        for external in [
            "http://", "https://", "src=\"", "href=\"", "@import", "url(",
        ] {
            assert!(!page.contains(external), "{external} in the page");
        }
    }
}
