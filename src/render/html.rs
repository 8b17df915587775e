//! The generic page: any model's data as one self-contained HTML page (field tables for
//! objects, one table for a list of records).
//! Nothing on it loads from anywhere: inline CSS, no script, no font, no URL.

use maud::{DOCTYPE, Markup, PreEscaped, html};
use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::Number;

/// The generic page's stylesheet (the report's page has its own, with its charts').
pub const CSS: &str = r#"
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#222;max-width:980px;margin:24px auto;padding:0 16px}
h1{font-size:22px;margin:0 0 12px}
table{border-collapse:collapse;margin:6px 0 14px;font-variant-numeric:tabular-nums}
th,td{padding:2px 8px;border-bottom:1px solid #e4e4e4;text-align:right;vertical-align:top}
th:first-child,td:first-child{text-align:left}
table.fields>tbody>tr>th{text-align:left;font-weight:600;color:#444}
table.fields>tbody>tr>td{text-align:left}
td table{margin:0}
td pre,td.text{text-align:left}
pre{margin:0;white-space:pre-wrap;font:12px/1.35 ui-monospace,Menlo,Consolas,monospace}
.none{color:#999}
@media print{body{max-width:none;margin:0;font-size:11px}table{break-inside:avoid}}
"#;

/// A page's `<head>` with its style sheet: no network for a page that must open offline, so the
/// content security policy lets nothing load from anywhere. The report's page shares it.
pub(crate) fn head(title: &str, css: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:";
            meta name="viewport" content="width=device-width, initial-scale=1";
            title { (title) }
            style { (PreEscaped(css)) }
        }
    }
}

/// `model`'s data as a page under `title`.
pub fn page<M: Serialize + ?Sized>(title: &str, model: &M) -> Result<String, serde_json::Error> {
    // Through text, as `Value` would sort the fields: the page keeps the model's order.
    let data: Tree = serde_json::from_str(&serde_json::to_string(model)?)?;
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            (head(title, CSS))
            body {
                h1 { (title) }
                div #result { (value(&data)) }
            }
        }
    };
    let mut s = page.into_string();
    s.push('\n');
    Ok(s)
}

/// A JSON value whose objects keep their fields in order.
#[derive(Debug, Clone, PartialEq)]
enum Tree {
    Null,
    Bool(bool),
    Number(Number),
    String(String),
    Array(Vec<Tree>),
    Object(Vec<(String, Tree)>),
}

impl<'de> Deserialize<'de> for Tree {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TreeVisitor)
    }
}

struct TreeVisitor;

impl<'de> Visitor<'de> for TreeVisitor {
    type Value = Tree;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Tree, E> {
        Ok(Tree::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Tree, E> {
        Ok(Tree::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Tree, E> {
        Ok(Tree::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Tree, E> {
        Ok(Number::from_f64(v).map_or(Tree::Null, Tree::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Tree, E> {
        Ok(Tree::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Tree, E> {
        Ok(Tree::String(v))
    }

    fn visit_unit<E>(self) -> Result<Tree, E> {
        Ok(Tree::Null)
    }

    fn visit_none<E>(self) -> Result<Tree, E> {
        Ok(Tree::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Tree, D::Error> {
        Tree::deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Tree, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Tree::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Tree, A::Error> {
        let mut fields = Vec::new();
        while let Some(field) = map.next_entry::<String, Tree>()? {
            fields.push(field);
        }
        Ok(Tree::Object(fields))
    }
}

impl Tree {
    fn is_object(&self) -> bool {
        matches!(self, Tree::Object(_))
    }

    fn is_scalar(&self) -> bool {
        !matches!(self, Tree::Array(_) | Tree::Object(_))
    }

    fn get(&self, key: &str) -> Option<&Tree> {
        match self {
            Tree::Object(fields) => fields.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// One value: a scalar as text, an object as a table of its fields, a list of objects as one
/// table with a column per field.
fn value(v: &Tree) -> Markup {
    match v {
        Tree::Null => html! { span.none { "-" } },
        Tree::Bool(b) => html! { (if *b { "yes" } else { "no" }) },
        Tree::Number(n) => html! { (number(n)) },
        Tree::String(s) if s.contains('\n') => html! { pre { (s) } },
        Tree::String(s) => html! { (s) },
        Tree::Array(items) if items.is_empty() => html! { span.none { "none" } },
        Tree::Array(items) if items.iter().all(Tree::is_object) => records(items),
        Tree::Array(items) if items.iter().all(Tree::is_scalar) => {
            let words: Vec<String> = items.iter().map(scalar).collect();
            html! { (words.join(", ")) }
        }
        Tree::Array(items) => html! { ol { @for i in items { li { (value(i)) } } } },
        Tree::Object(fields) => html! {
            table.fields { tbody { @for (k, v) in fields { tr { th { (k) } td { (value(v)) } } } } }
        },
    }
}

fn scalar(v: &Tree) -> String {
    match v {
        Tree::String(s) => s.clone(),
        Tree::Number(n) => number(n),
        Tree::Bool(b) => b.to_string(),
        _ => "-".into(),
    }
}

/// A whole number as it is; a fraction to at most 3 decimals, its trailing zeros dropped: the
/// page is read, and the JSON has every digit.
fn number(n: &Number) -> String {
    if n.is_f64()
        && let Some(f) = n.as_f64()
    {
        let s = format!("{f:.3}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        return if s == "-0" { "0".into() } else { s.to_string() };
    }
    n.to_string()
}

/// A list of records as one table; its columns are the fields in the order they first appear.
fn records(items: &[Tree]) -> Markup {
    let mut columns: Vec<&str> = Vec::new();
    for item in items {
        if let Tree::Object(fields) = item {
            for (k, _) in fields {
                if !columns.contains(&k.as_str()) {
                    columns.push(k);
                }
            }
        }
    }
    html! {
        table.records {
            thead { tr { @for c in &columns { th { (c) } } } }
            tbody {
                @for item in items {
                    tr { @for c in &columns {
                        @let cell = item.get(c).unwrap_or(&Tree::Null);
                        td class=[matches!(cell, Tree::String(_)).then_some("text")] { (value(cell)) }
                    } }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn records_share_one_table_and_fractions_are_short() {
        let page = page(
            "fleet status",
            &json!([
                {"host": "ct200", "gpu": 0, "tok_s": 1234.56789, "health": null},
                {"host": "ct200", "gpu": 1, "log": "line 1\nline 2", "tok_s": 2.0},
            ]),
        )
        .unwrap();
        assert_eq!(page.matches("<table").count(), 1, "{page}");
        for column in ["host", "gpu", "tok_s", "health", "log"] {
            assert!(page.contains(&format!("<th>{column}</th>")), "{page}");
        }
        assert!(
            page.contains(">1234.568<") && page.contains(">2<"),
            "{page}"
        );
        assert!(page.contains("<pre>line 1\nline 2</pre>"), "{page}");
        assert!(!page.contains("http://") && !page.contains("https://"));
    }

    #[test]
    fn an_object_is_a_table_of_its_fields_and_lists_of_words_are_joined() {
        let page = page(
            "p",
            &json!({"name": "seed", "args": ["--tp", "1"], "empty": [], "ok": true}),
        )
        .unwrap();
        assert!(page.contains("<th>args</th><td>--tp, 1</td>"), "{page}");
        assert!(page.contains("<th>ok</th><td>yes</td>"), "{page}");
        assert!(page.contains("none"), "{page}");
    }

    #[derive(Serialize)]
    struct Instance {
        port: u16,
        host: &'static str,
        args: Option<Vec<u32>>,
    }

    #[test]
    fn columns_keep_the_models_order() {
        let rows = [Instance {
            port: 30000,
            host: "ct200",
            args: None,
        }];
        let page = page("fleet status", &rows).unwrap();
        assert!(
            page.contains("<tr><th>port</th><th>host</th><th>args</th></tr>"),
            "{page}"
        );
        assert!(
            page.contains("<td>30000</td><td class=\"text\">ct200</td>"),
            "{page}"
        );
    }
}
