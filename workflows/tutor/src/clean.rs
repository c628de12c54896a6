//! Notes as a student reads them. Material people bring is often written for a web page (a
//! package's README): badges, images, HTML, link targets, tables. None of that helps a small
//! model or a student, and quoted raw it reads as noise. [`readable`] parses the Markdown
//! (with `pulldown-cmark`) and writes it back as plain Markdown that keeps what a reader sees:
//! headings, paragraphs (one per line), list items, **bold** terms, `code` spans and code
//! blocks, table rows; and drops images, badges, HTML tags, comments and link targets.

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

/// `src` (Markdown) as plain notes; see the module documentation.
pub fn readable(src: &str) -> String {
    let mut w = Writer::default();
    let parser = Parser::new_ext(
        src,
        Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TASKLISTS,
    );
    for event in parser {
        w.event(event);
    }
    w.finish()
}

#[derive(Default)]
struct Writer {
    out: String,
    /// The block being written (a paragraph, heading, item's text, table row).
    line: String,
    lists: usize,
    in_code: bool,
    /// Inside an image: its alt text is not shown.
    in_image: usize,
    heading: Option<usize>,
}

impl Writer {
    fn event(&mut self, event: Event<'_>) {
        if self.in_image > 0 {
            match event {
                Event::Start(Tag::Image { .. }) => self.in_image += 1,
                Event::End(TagEnd::Image) => self.in_image -= 1,
                _ => {}
            }
            return;
        }
        match event {
            Event::Start(tag) => self.start(tag),
            Event::End(tag) => self.end(tag),
            Event::Text(t) => {
                if self.in_code {
                    self.out.push_str(&t);
                } else {
                    self.text(&t);
                }
            }
            Event::Code(c) => {
                self.text(&format!("`{c}`"));
            }
            Event::InlineMath(m) | Event::DisplayMath(m) => self.text(&m),
            Event::Html(h) => {
                // Block HTML: keep its words when they make a sentence (a centred tagline),
                // drop tags, comments and badge rows.
                let words = strip_tags(&h);
                if words.split_whitespace().count() >= 4 {
                    self.flush();
                    self.line.push_str(words.trim());
                    self.flush();
                }
            }
            Event::InlineHtml(h) => {
                if h.trim_start().starts_with("<br") {
                    self.text(" ");
                }
            }
            Event::SoftBreak => self.text(" "),
            Event::HardBreak => self.flush(),
            Event::Rule | Event::FootnoteReference(_) => {}
            Event::TaskListMarker(done) => self.text(if done { "[x] " } else { "[ ] " }),
        }
    }

    fn start(&mut self, tag: Tag<'_>) {
        match tag {
            Tag::Heading { level, .. } => {
                self.flush();
                self.heading = Some(level as usize);
            }
            Tag::Paragraph
            | Tag::BlockQuote(_)
            | Tag::Table(_)
            | Tag::TableHead
            | Tag::TableRow => self.flush(),
            Tag::List(_) => {
                self.flush();
                self.lists += 1;
            }
            Tag::Item => {
                self.flush();
                self.line
                    .push_str(&"  ".repeat(self.lists.saturating_sub(1)));
                self.line.push_str("- ");
            }
            Tag::CodeBlock(kind) => {
                self.flush();
                let lang = match kind {
                    pulldown_cmark::CodeBlockKind::Fenced(l) => l.to_string(),
                    pulldown_cmark::CodeBlockKind::Indented => String::new(),
                };
                // Only the language's name: fences also carry attributes (`rust,ignore`).
                let lang = lang.split([',', ' ', '{']).next().unwrap_or("").to_string();
                self.out.push_str(&format!("```{lang}\n"));
                self.in_code = true;
            }
            Tag::Strong => self.line.push_str("**"),
            Tag::Image { .. } => self.in_image = 1,
            _ => {}
        }
    }

    fn end(&mut self, tag: TagEnd) {
        match tag {
            TagEnd::Heading(_) | TagEnd::Paragraph | TagEnd::BlockQuote(_) | TagEnd::Item => {
                self.flush()
            }
            TagEnd::TableCell => self.close_with(" | "),
            TagEnd::TableRow | TagEnd::TableHead | TagEnd::Table => self.flush(),
            TagEnd::List(_) => {
                self.flush();
                self.lists = self.lists.saturating_sub(1);
            }
            TagEnd::CodeBlock => {
                if !self.out.ends_with('\n') {
                    self.out.push('\n');
                }
                self.out.push_str("```\n\n");
                self.in_code = false;
            }
            // `** term **` is not bold in Markdown: close against the last word.
            TagEnd::Strong => self.close_with("**"),
            _ => {}
        }
    }

    /// Appends `s` right after the current block's last word.
    fn close_with(&mut self, s: &str) {
        self.line.truncate(self.line.trim_end().len());
        self.line.push_str(s);
    }

    fn text(&mut self, t: &str) {
        for c in t.chars() {
            let c = if c.is_whitespace() { ' ' } else { c };
            if c == ' ' && self.line.ends_with(' ') {
                continue;
            }
            self.line.push(c);
        }
    }

    /// Ends the current block: written when it has words, with a blank line after prose.
    fn flush(&mut self) {
        let mut line = std::mem::take(&mut self.line);
        let heading = self.heading.take();
        // Leftovers of dropped links and images: empty bold, stray separators; and emoji
        // short codes (`:balloon:`).
        line = line.replace("****", "");
        line = line
            .split(' ')
            .filter(|w| !is_shortcode(w))
            .collect::<Vec<_>>()
            .join(" ");
        let trimmed = line.trim_end_matches([' ', '|']).trim_end();
        let body = trimmed.trim_start_matches([' ', '-', '|']).trim();
        if !body.chars().any(char::is_alphanumeric) {
            return;
        }
        let is_item = trimmed.trim_start().starts_with("- ");
        if let Some(level) = heading {
            self.blank_line();
            self.out.push_str(&"#".repeat(level));
            self.out.push(' ');
            self.out.push_str(body);
            self.out.push_str("\n\n");
        } else if is_item || trimmed.contains(" | ") {
            self.out.push_str(trimmed);
            self.out.push('\n');
        } else {
            self.blank_line();
            self.out.push_str(trimmed.trim());
            self.out.push_str("\n\n");
        }
    }

    fn blank_line(&mut self) {
        if !self.out.is_empty() && !self.out.ends_with("\n\n") {
            if !self.out.ends_with('\n') {
                self.out.push('\n');
            }
            self.out.push('\n');
        }
    }

    fn finish(mut self) -> String {
        self.flush();
        let mut out = String::with_capacity(self.out.len());
        let mut blank = 0;
        for line in self.out.lines() {
            if line.trim().is_empty() {
                blank += 1;
                if blank > 1 {
                    continue;
                }
            } else {
                blank = 0;
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out.trim().to_string() + "\n"
    }
}

/// `:balloon:`, `:+1:`: an emoji's short code.
fn is_shortcode(w: &str) -> bool {
    w.len() > 2
        && w.starts_with(':')
        && w.ends_with(':')
        && w[1..w.len() - 1]
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_+-".contains(c))
}

/// The text of an HTML fragment: tags and comments removed, common entities decoded.
fn strip_tags(html: &str) -> String {
    let mut out = String::new();
    let mut rest = html;
    while let Some(i) = rest.find('<') {
        out.push_str(&rest[..i]);
        out.push(' ');
        let after = &rest[i..];
        let end = if after.starts_with("<!--") {
            after.find("-->").map(|e| e + 3)
        } else {
            after.find('>').map(|e| e + 1)
        };
        match end {
            Some(e) => rest = &after[e..],
            None => {
                rest = "";
                break;
            }
        }
    }
    out.push_str(rest);
    let out = out
        .replace("&nbsp;", " ")
        .replace("&amp;", "&")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'");
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_readme_loses_its_web_page_parts() {
        let src = r#"<p align="center"><img src="logo.png" alt="logo"></p>

# sled

[![crates.io](https://img.shields.io/crates/v/sled.svg)](https://crates.io/crates/sled)
[![docs](https://docs.rs/sled/badge.svg)](https://docs.rs/sled)

<!-- a comment -->
A lightweight high-performance pure-rust transactional embedded database.
See the [documentation](https://docs.rs/sled) and
the `Tree::watch_prefix` method.

* **API** similar to a threadsafe `BTreeMap<[u8], [u8]>`
* serializable (ACID) [transactions][tx]

| feature | status |
|---|---|
| ACID | yes |

```rust,no_run
let tree = sled::open("/tmp/welcome-to-sled")?;
```

[tx]: https://docs.rs/sled/transactions
"#;
        let out = readable(src);
        assert!(!out.contains("http"), "{out}");
        assert!(!out.contains('<') || out.contains("BTreeMap<[u8]"), "{out}");
        assert!(!out.contains("logo"), "{out}");
        assert!(!out.contains("comment"), "{out}");
        assert!(out.starts_with("# sled\n"), "{out}");
        assert!(
            out.contains(
                "A lightweight high-performance pure-rust transactional embedded database. See the documentation and the `Tree::watch_prefix` method.\n"
            ),
            "{out}"
        );
        assert!(
            out.contains("- **API** similar to a threadsafe `BTreeMap<[u8], [u8]>`\n"),
            "{out}"
        );
        assert!(
            out.contains("- serializable (ACID) transactions\n"),
            "{out}"
        );
        assert!(out.contains("ACID | yes"), "{out}");
        assert!(
            out.contains("```rust\nlet tree = sled::open(\"/tmp/welcome-to-sled\")?;\n```"),
            "{out}"
        );
    }

    #[test]
    fn our_own_notes_keep_their_shape() {
        let src = "# Transport\n\n**TCP** is reliable.\nIt orders bytes.\n\n- **UDP**: no handshake.\n- Ports: 16 bits.\n";
        assert_eq!(
            readable(src),
            "# Transport\n\n**TCP** is reliable. It orders bytes.\n\n- **UDP**: no handshake.\n- Ports: 16 bits.\n"
        );
    }

    #[test]
    fn emoji_short_codes_go() {
        assert_eq!(
            readable(":balloon: Thanks for your help improving the project! We are so happy to have you!"),
            "Thanks for your help improving the project! We are so happy to have you!\n"
        );
        assert_eq!(readable("Ratio 1:2: fine."), "Ratio 1:2: fine.\n");
    }

    #[test]
    fn html_taglines_keep_their_words() {
        let src = "<div align=\"center\">\n<h3>A runtime for writing reliable asynchronous applications</h3>\n</div>\n\nText.\n";
        let out = readable(src);
        assert!(
            out.starts_with("A runtime for writing reliable asynchronous applications\n"),
            "{out}"
        );
    }
}
