//! Whole functions instead of search/replace blocks: what a small code model writes when it
//! does not follow the block format ("the fixed function: ```python def f(…): …```").
//! A fenced Python definition replaces the definition of the same name in the file (its
//! decorators and body, found by indentation); definitions the file does not have are added
//! at its end; imports it lacks go after its last import. A fence for a file that does not
//! exist yet is that file's content.

/// A fenced code block of an answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Fence {
    /// The path written on the line before the fence (or in its info string), if any.
    pub path: Option<String>,
    /// The info string's language (`python`, `py`, or empty).
    pub lang: String,
    /// The code.
    pub text: String,
}

/// The fenced blocks of `answer`, in order (an unclosed last fence runs to the end).
pub fn fences(answer: &str) -> Vec<Fence> {
    let lines: Vec<&str> = answer.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let t = lines[i].trim_start();
        let ticks = t.chars().take_while(|c| *c == '`').count();
        if ticks < 3 {
            i += 1;
            continue;
        }
        let info = t[ticks..].trim();
        let (lang, info_path) = match info.split_once(char::is_whitespace) {
            Some((l, p)) => (l.to_string(), Some(p.trim().to_string())),
            None if info.contains('.') || info.contains('/') => {
                (String::new(), Some(info.to_string()))
            }
            None => (info.to_string(), None),
        };
        // The closing fence: backticks only, at least as many as the opening's (a line such
        // as a docstring's ```pycon opens nothing and closes nothing).
        let end = (i + 1..lines.len())
            .find(|&j| {
                let c = lines[j].trim();
                c.len() >= ticks && c.chars().all(|ch| ch == '`')
            })
            .unwrap_or(lines.len());
        let before = lines[..i]
            .iter()
            .rev()
            .map(|l| l.trim())
            .find(|l| !l.is_empty())
            .and_then(path_in);
        out.push(Fence {
            path: info_path.or(before),
            lang: lang.to_ascii_lowercase(),
            text: lines[i + 1..end.min(lines.len())].join("\n"),
        });
        i = end + 1;
    }
    out
}

/// A path named on a line (`src/pkg/x.py`, `` `x.py`: ``, `# File: x.py`).
fn path_in(line: &str) -> Option<String> {
    line.split(|c: char| c.is_whitespace() || c == '`' || c == '*' || c == ':' || c == '"')
        .map(|w| w.trim_matches(|c: char| c == '(' || c == ')' || c == ',' || c == '.'))
        .find(|w| {
            w.len() > 3
                && w.contains('.')
                && w.rsplit('.')
                    .next()
                    .is_some_and(|e| e.len() <= 4 && e.chars().all(char::is_alphanumeric))
                && w.chars().all(|c| c.is_alphanumeric() || "/._-".contains(c))
                && w.chars().next().is_some_and(char::is_alphanumeric)
        })
        .map(str::to_string)
}

/// Whether a fence holds Python (by its tag, or by its first code line when untagged).
pub fn is_python(f: &Fence) -> bool {
    match f.lang.as_str() {
        "python" | "py" | "python3" => true,
        "" => f.text.lines().map(str::trim_start).any(|l| {
            l.starts_with("def ") || l.starts_with("class ") || l.starts_with("async def ")
        }),
        _ => false,
    }
}

fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

fn def_name(line: &str) -> Option<&str> {
    let t = line.trim_start();
    let rest = t
        .strip_prefix("async def ")
        .or_else(|| t.strip_prefix("def "))
        .or_else(|| t.strip_prefix("class "))?;
    let end = rest
        .find(|c: char| !c.is_alphanumeric() && c != '_')
        .unwrap_or(rest.len());
    (end > 0).then(|| &rest[..end])
}

/// A definition of `lines`: its name, indentation, and line range (decorators included,
/// trailing blank lines excluded).
#[derive(Debug, Clone, PartialEq)]
struct Def {
    name: String,
    indent: usize,
    start: usize,
    end: usize,
}

/// The definitions of `lines` whose indentation is `at` (`None`: any).
fn defs(lines: &[&str], at: Option<usize>) -> Vec<Def> {
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let Some(name) = def_name(l) else { continue };
        let indent = indent_of(l);
        if at.is_some_and(|a| a != indent) {
            continue;
        }
        let mut start = i;
        while start > 0 {
            let p = lines[start - 1];
            if indent_of(p) == indent && p.trim_start().starts_with('@') {
                start -= 1;
            } else {
                break;
            }
        }
        let mut end = i + 1;
        let mut last = i;
        while end < lines.len() {
            let l = lines[end];
            if l.trim().is_empty() {
                end += 1;
                continue;
            }
            if indent_of(l) <= indent {
                break;
            }
            last = end;
            end += 1;
        }
        out.push(Def {
            name: name.to_string(),
            indent,
            start,
            end: last + 1,
        });
    }
    out
}

fn reindent(lines: &[&str], from: usize, to: usize) -> Vec<String> {
    lines
        .iter()
        .map(|l| {
            if l.trim().is_empty() {
                String::new()
            } else {
                let cut = indent_of(l).min(from);
                format!("{}{}", " ".repeat(to), &l[cut..])
            }
        })
        .collect()
}

/// What [`apply_fence`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    /// The new text of the file.
    pub text: String,
    /// Definitions replaced.
    pub replaced: Vec<String>,
    /// Definitions added.
    pub added: Vec<String>,
}

/// `file` with the Python definitions of `code` put in: each replaces the file's definition
/// of the same name (which must be unique), or is added at the end; imports the file lacks
/// go after its last import. `Err` says what the model must fix.
pub fn apply_fence(file: &str, code: &str) -> Result<Applied, String> {
    let code_lines: Vec<&str> = code.lines().collect();
    let base = code_lines
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| indent_of(l))
        .min()
        .unwrap_or(0);
    let new_defs = defs(&code_lines, Some(base));
    if new_defs.is_empty() {
        return Err(
            "the code block holds no function or class definition to put in the file".into(),
        );
    }
    let mut lines: Vec<String> = file.lines().map(str::to_string).collect();
    let mut replaced = Vec::new();
    let mut added = Vec::new();
    for d in &new_defs {
        let body = &code_lines[d.start..d.end];
        let view: Vec<&str> = lines.iter().map(String::as_str).collect();
        let found: Vec<Def> = defs(&view, None)
            .into_iter()
            .filter(|x| x.name == d.name)
            .collect();
        match found.as_slice() {
            [one] => {
                let new = reindent(body, base, one.indent);
                lines.splice(one.start..one.end, new);
                replaced.push(d.name.clone());
            }
            [] => {
                while lines.last().is_some_and(|l| l.trim().is_empty()) {
                    lines.pop();
                }
                if !lines.is_empty() {
                    lines.extend([String::new(), String::new()]);
                }
                lines.extend(reindent(body, base, 0));
                added.push(d.name.clone());
            }
            many => {
                return Err(format!(
                    "`{}` is defined {} times in the file: use a SEARCH/REPLACE block for the one to change",
                    d.name,
                    many.len()
                ))
            }
        }
    }
    // Imports of the code block the file does not have.
    let imports: Vec<&str> = code_lines
        .iter()
        .filter(|l| indent_of(l) == base)
        .map(|l| l.trim())
        .filter(|l| l.starts_with("import ") || l.starts_with("from "))
        .filter(|l| !lines.iter().any(|f| f.trim() == *l))
        .collect();
    if !imports.is_empty() {
        let at = lines
            .iter()
            .rposition(|l| {
                indent_of(l) == 0 && (l.starts_with("import ") || l.starts_with("from "))
            })
            .map_or(0, |i| i + 1);
        for (k, imp) in imports.iter().enumerate() {
            lines.insert(at + k, (*imp).to_string());
        }
    }
    let mut text = lines.join("\n");
    text.push('\n');
    Ok(Applied {
        text,
        replaced,
        added,
    })
}

/// The names a fence defines at its top level.
pub fn defined_names(code: &str) -> Vec<String> {
    let lines: Vec<&str> = code.lines().collect();
    let base = lines
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| indent_of(l))
        .min()
        .unwrap_or(0);
    defs(&lines, Some(base))
        .into_iter()
        .map(|d| d.name)
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const FILE: &str = "import os\n\n\nclass Size:\n    def show(self, n):\n        return str(n)\n\n    @property\n    def unit(self):\n        return \"B\"\n\n\ndef natural(n):\n    if n < 1000:\n        return \"%d Bytes\" % n\n\n    return \"%.1f kB\" % (n / 1000)\n\n\ndef other():\n    return 1\n";

    #[test]
    fn a_fenced_function_replaces_its_namesake_and_keeps_the_rest() {
        let answer = "The root cause: `natural` formats floats with %d.\n\nsrc/pkg/size.py\n```python\ndef natural(n):\n    if abs(n) < 1000:\n        return \"%d Bytes\" % int(n)\n    return \"%.1f kB\" % (n / 1000)\n```\n";
        let f = fences(answer);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].path.as_deref(), Some("src/pkg/size.py"));
        assert!(is_python(&f[0]));
        let a = apply_fence(FILE, &f[0].text).unwrap();
        assert_eq!(a.replaced, ["natural"]);
        assert!(a.text.contains("if abs(n) < 1000:"));
        assert!(!a.text.contains("if n < 1000:"));
        assert!(
            a.text.contains("def other():\n    return 1\n"),
            "{}",
            a.text
        );
        assert!(a.text.contains("class Size:"));
    }

    #[test]
    fn a_method_is_found_at_its_indentation_with_its_decorator() {
        let code = "@property\ndef unit(self):\n    return \"bytes\"\n";
        let a = apply_fence(FILE, code).unwrap();
        assert!(
            a.text
                .contains("    @property\n    def unit(self):\n        return \"bytes\"\n"),
            "{}",
            a.text
        );
        assert_eq!(a.text.matches("@property").count(), 1);
    }

    #[test]
    fn new_functions_and_imports_are_added() {
        let code =
            "import math\nimport os\n\ndef test_small():\n    assert natural(1) == \"1 Bytes\"\n";
        let a = apply_fence(FILE, code).unwrap();
        assert_eq!(a.added, ["test_small"]);
        assert!(a.text.starts_with("import os\nimport math\n"), "{}", a.text);
        assert!(a
            .text
            .trim_end()
            .ends_with("assert natural(1) == \"1 Bytes\""));
        assert_eq!(a.text.matches("import os").count(), 1);
    }

    #[test]
    fn a_fence_inside_the_code_does_not_close_it() {
        let answer = "x.py\n````python\ndef f():\n    \"\"\"Example:\n    ```pycon\n    >>> f()\n    ```\n    \"\"\"\n    return 1\n````\n";
        let f = fences(answer);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].text.contains(">>> f()") && f[0].text.ends_with("return 1"));
        assert_eq!(crate::prompts::fence_for("a\n```pycon\nb\n```"), "````");
        assert_eq!(crate::prompts::fence_for("a = 1"), "```");
    }

    #[test]
    fn ambiguous_or_empty_fences_are_errors() {
        let twice = "def f():\n    pass\n\n\ndef f():\n    return 2\n";
        assert!(apply_fence(twice, "def f():\n    return 3\n")
            .unwrap_err()
            .contains("2 times"));
        assert!(apply_fence(FILE, "x = 1\n").is_err());
        assert!(fences("no code here").is_empty());
        let untagged = fences("```\ndef f():\n    pass\n```");
        assert!(is_python(&untagged[0]));
        assert!(!is_python(&fences("```java\nclass A {}\n```")[0]));
        assert_eq!(
            defined_names("def a():\n    pass\nclass B:\n    def c(self): pass\n"),
            ["a", "B"]
        );
    }
}
