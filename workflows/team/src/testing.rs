//! A scripted team model for the workflow's tests and its crash-test worker (behind the
//! `testing` feature). It plays competent agents on the word-statistics fixture: objectives
//! from the brief's bullets, one story each, one component per file, and a correct module
//! with its tests. It proves the graph's routes and the real sandbox runs, never that a
//! model is useful; the end-to-end test runs SmolLM2.

use crate::{sandbox, TeamSettings, NAME};
use ferrograph::chat::{ChatModel, LlmError};
use ferrograph::core::message::Message;
use ferrograph_chat::testing::{ScriptCall, ScriptedModel};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;

/// How the scripted model behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// Answers well.
    Good,
    /// Answers well, but its code fails its tests every time.
    BadCode,
    /// Every call fails with a non-retryable error (every agent falls back).
    Fails,
}

/// The module a competent engineer writes for the fixture.
pub const GOOD_MODULE: &str = r#""""Word statistics."""
import argparse
import re
import sys
from collections import Counter


def count_words(text):
    """Word -> count, ignoring case and punctuation."""
    return dict(Counter(re.findall(r"[a-z0-9]+", text.lower())))


def top_words(text, n):
    """The n most frequent (word, count) pairs, ties alphabetical."""
    return sorted(count_words(text).items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def main(argv=None, out=sys.stdout):
    parser = argparse.ArgumentParser()
    parser.add_argument("file")
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args(argv)
    with open(args.file, encoding="utf-8") as fh:
        for word, count in top_words(fh.read(), args.top):
            print(f"{word} {count}", file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
"#;

/// Its tests.
pub const GOOD_TESTS: &str = r#"import io
import os
import tempfile
import unittest

import wordstats


class WordStatsTest(unittest.TestCase):
    def test_count_words_ignores_case_and_punctuation(self):
        self.assertEqual(wordstats.count_words("Hi, hi! HI"), {"hi": 3})

    def test_top_words_ties_broken_alphabetically(self):
        self.assertEqual(wordstats.top_words("b a b a c", 2), [("a", 2), ("b", 2)])

    def test_command_line_prints_word_count_lines(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "m.txt")
            with open(p, "w", encoding="utf-8") as fh:
                fh.write("x y x")
            out = io.StringIO()
            wordstats.main([p, "--top", "1"], out=out)
            self.assertEqual(out.getvalue(), "x 2\n")


if __name__ == "__main__":
    unittest.main()
"#;

const BAD_MODULE: &str =
    "def count_words(text):\n    return {}\n\n\ndef top_words(text, n):\n    return []\n";

fn bullets(prompt: &str, after: &str) -> Vec<String> {
    let Some(at) = prompt.find(after) else {
        return Vec::new();
    };
    prompt[at..]
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty() || l.is_empty())
        .filter_map(|l| l.trim().strip_prefix("- "))
        .map(|l| l.split(": ").last().unwrap_or(l).to_string())
        .collect()
}

fn answer(call: &ScriptCall<'_>, behaviour: Behaviour) -> Result<Message, LlmError> {
    if behaviour == Behaviour::Fails {
        return Err(LlmError::Schema {
            message: "scripted failure".into(),
            output: "not json".into(),
        });
    }
    let (title, schema) = call.json_schema();
    let prompt = call.last_prompt();
    let v = match title {
        "Clarification" => {
            let objectives: Vec<String> = prompt
                .lines()
                .filter_map(|l| l.trim().strip_prefix("- "))
                .map(str::to_string)
                .take(4)
                .collect();
            json!({"objectives": objectives, "out_of_scope": ["stemming"], "assumptions": ["messages are English text"], "success_metrics": ["the support team sees the top words of a day in one command"]})
        }
        "UserStories" => {
            let objectives = bullets(&prompt, "Objectives:");
            let stories: Vec<Value> = objectives
                .iter()
                .map(|o| json!({"title": o.chars().take(60).collect::<String>(), "as_a": "support agent", "i_want": o, "so_that": "I spot new problems early", "acceptance_criteria": [o], "priority": "high", "story_points": 3}))
                .collect();
            json!({"stories": stories})
        }
        "TechnicalDesign" => {
            let files: Vec<Value> = schema
                .pointer("/$defs/Component/properties/file_path/enum")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let reqs: String = bullets(&prompt, "Functional requirements:")
                .first()
                .cloned()
                .unwrap_or_default()
                .chars()
                .take(90)
                .collect();
            let comps: Vec<Value> = files
                .iter()
                .map(|f| json!({"name": f.as_str().unwrap_or("app").trim_end_matches(".py"), "responsibility": format!("counts words: {reqs}"), "file_path": f}))
                .collect();
            json!({"components": comps, "decision": {"title": "Counter from the standard library", "context": "Counting words of a text needs a multiset", "decision": "Use collections.Counter and sort by count then word", "consequences": ["no dependency"], "alternatives": ["a hand-written dictionary loop"]}})
        }
        "DesignReview" => {
            json!({"approved": true, "notes": ["keep the command line thin over top_words"]})
        }
        "PythonModule" => {
            let code = if prompt.starts_with("Write the Python module") {
                if behaviour == Behaviour::BadCode {
                    BAD_MODULE
                } else {
                    GOOD_MODULE
                }
            } else {
                GOOD_TESTS
            };
            json!({"code": code})
        }
        "Runbook" => {
            json!({"summary": "Release wordstats.py to the support team's folder.", "rollout_steps": ["Tag the approved commit", "Copy the release", "Point CURRENT at it"], "smoke_checks": ["the unit tests pass in the release folder"], "rollback_steps": ["Point CURRENT back", "Remove the release folder"]})
        }
        other => {
            return Err(LlmError::Schema {
                message: format!("the script has no answer for `{other}`"),
                output: String::new(),
            })
        }
    };
    Ok(Message::ai(v.to_string()))
}

/// The scripted model.
pub fn scripted_model(behaviour: Behaviour) -> ScriptedModel {
    ScriptedModel::new("scripted-team", move |call| answer(&call, behaviour))
}

/// Settings with `model` (as primary and its own fallback) under `data_dir`.
pub fn settings(data_dir: &Path, model: Arc<dyn ChatModel>) -> TeamSettings {
    TeamSettings {
        data_dir: data_dir.join(NAME),
        llm: Some(crate::team_llm(model, None)),
        crash_at: std::env::var(crate::CRASH_ENV)
            .ok()
            .filter(|v| !v.is_empty()),
        limits: sandbox::Limits::default(),
    }
}
