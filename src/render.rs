//! One way to render every result: a command's result is a [`Model`] (plain data that
//! serializes, its findings typed values), and one renderer per [`Format`] turns any model into
//! what stdout gets. A new format is one more arm of [`render`] (and a renderer beside `html`),
//! not an edit in every command. Pure: values in, strings out.

pub mod html;

use serde::Serialize;

/// How a result is rendered: `--format`, or `--json` for `json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// Tables and lines for a terminal.
    Text,
    /// The model itself, pretty-printed.
    Json,
    /// One self-contained page: inline CSS (and SVG), nothing fetched from anywhere.
    Html,
}

/// A command's result. Its serialized form is its JSON, and the generic page is built from that
/// same data, so only the terminal's text is written per model.
pub trait Model: Serialize {
    /// What the result is, as the page's title: `fleet status`.
    fn title(&self) -> String;
    /// The terminal's view, exactly what stdout gets in `text`.
    fn text(&self) -> String;
    /// A page made for this model (the report's); `None` (the default) is the generic page of
    /// its data.
    fn page(&self) -> Option<String> {
        None
    }
}

/// A server log's last lines for a terminal, each indented under its finding. A line longer
/// than a screen is cut: SGLang's first line (`server_args={...}`) runs to 20,000 characters,
/// and a search whose candidates run out of memory would print it for each of them. The whole
/// line stays in the log and in the JSON.
pub fn log_tail<'a>(lines: impl IntoIterator<Item = &'a str>) -> String {
    const WIDTH: usize = 240;
    lines
        .into_iter()
        .map(|l| match l.char_indices().nth(WIDTH) {
            Some((cut, _)) => format!(
                "    | {} ... ({} more characters)\n",
                &l[..cut],
                l[cut..].chars().count()
            ),
            None => format!("    | {l}\n"),
        })
        .collect()
}

/// A model that cannot be written as JSON: a map whose keys are not strings. A bug of the model.
#[derive(Debug, thiserror::Error)]
#[error("cannot render the result: {0}")]
pub struct RenderError(#[from] serde_json::Error);

/// `m` in `format`.
pub fn render<M: Model + ?Sized>(m: &M, format: Format) -> Result<String, RenderError> {
    Ok(match format {
        Format::Text => m.text(),
        Format::Json => json(m)?,
        Format::Html => match m.page() {
            Some(page) => page,
            None => html::page(&m.title(), m)?,
        },
    })
}

/// Pretty JSON and a final newline, as every command has printed it.
pub fn json<M: Serialize + ?Sized>(m: &M) -> Result<String, RenderError> {
    let mut s = serde_json::to_string_pretty(m)?;
    s.push('\n');
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Hosts {
        hosts: Vec<Host>,
    }

    #[derive(Serialize)]
    struct Host {
        name: &'static str,
        gpus: u32,
        error: Option<&'static str>,
    }

    impl Model for Hosts {
        fn title(&self) -> String {
            "fleet hosts".into()
        }
        fn text(&self) -> String {
            self.hosts
                .iter()
                .map(|h| format!("{} {}\n", h.name, h.gpus))
                .collect()
        }
    }

    #[test]
    fn a_log_line_longer_than_a_screen_is_cut_and_says_how_much_is_left() {
        let long = format!("server_args={{{}}}", "'x': 1, ".repeat(1000));
        let tail = log_tail([long.as_str(), "CUDA out of memory."]);
        let lines: Vec<&str> = tail.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(
            lines[0].starts_with("    | server_args={'x': 1,"),
            "{}",
            lines[0]
        );
        assert!(
            lines[0].ends_with(" ... (7774 more characters)"),
            "{}",
            lines[0]
        );
        assert!(lines[0].len() < 300);
        assert_eq!(lines[1], "    | CUDA out of memory.");
    }

    fn hosts() -> Hosts {
        Hosts {
            hosts: vec![
                Host {
                    name: "ct200",
                    gpus: 8,
                    error: None,
                },
                Host {
                    name: "box<2>",
                    gpus: 0,
                    error: Some("unreachable"),
                },
            ],
        }
    }

    #[test]
    fn one_model_renders_in_every_format() {
        let m = hosts();
        assert_eq!(render(&m, Format::Text).unwrap(), "ct200 8\nbox<2> 0\n");
        let json: serde_json::Value =
            serde_json::from_str(&render(&m, Format::Json).unwrap()).unwrap();
        assert_eq!(json["hosts"][1]["error"], "unreachable");
        let page = render(&m, Format::Html).unwrap();
        assert!(page.contains("<title>fleet hosts</title>"), "{page}");
        assert!(page.contains("box&lt;2&gt;"), "escaped: {page}");
        assert!(
            page.contains(r#"<td class="text">unreachable</td>"#),
            "{page}"
        );
        assert!(
            page.contains("<th>name</th><th>gpus</th><th>error</th>"),
            "{page}"
        );
    }
}
