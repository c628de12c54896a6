//! The anti-corruption layers between bounded contexts (the seed's section 3): pure
//! functions, so each boundary is a tested translation and no context's model leaks into
//! another.
//!
//! - Requirement → Design: a story becomes a functional requirement.
//! - Design → Implementation: a specification becomes tasks in dependency order (a cycle is
//!   an error).
//! - Requirement → Quality: a story becomes test cases, one per acceptance criterion.

use crate::domain::{
    FunctionalRequirement, ImplementationTask, PriorityLevel, TechnicalSpec, TestCase, UserStory,
};
use std::collections::{BTreeMap, BTreeSet};

/// Why tasks cannot be ordered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TranslateError {
    /// The tasks depend on each other in a cycle.
    #[error("the implementation tasks depend on each other in a cycle: {}", .0.join(" → "))]
    Cycle(Vec<String>),
    /// A task depends on one that does not exist.
    #[error("task {task} depends on unknown task {missing}")]
    UnknownDependency {
        /// The task.
        task: String,
        /// What it names.
        missing: String,
    },
    /// The specification has no component.
    #[error("the specification has no component to implement")]
    Empty,
}

fn rank(p: PriorityLevel) -> u8 {
    match p {
        PriorityLevel::Critical => 1,
        PriorityLevel::High => 2,
        PriorityLevel::Medium => 3,
        PriorityLevel::Low => 4,
    }
}

fn sentence(s: &str) -> String {
    s.trim().trim_end_matches('.').to_string()
}

/// Requirement → Design: stories become functional requirements, most urgent first (a
/// stable order: equal ranks keep the stories' order).
pub fn stories_to_requirements(stories: &[UserStory]) -> Vec<FunctionalRequirement> {
    let mut out: Vec<FunctionalRequirement> = stories
        .iter()
        .enumerate()
        .map(|(i, s)| FunctionalRequirement {
            fr_id: format!("FR-{}", i + 1),
            story_id: s.story_id.clone(),
            statement: format!(
                "The system shall let a {} {}",
                sentence(&s.as_a)
                    .to_lowercase()
                    .trim_start_matches("a ")
                    .trim_start_matches("an "),
                sentence(&s.i_want)
            ),
            conditions: s.acceptance_criteria.iter().map(|c| sentence(c)).collect(),
            rank: rank(s.priority),
        })
        .collect();
    out.sort_by_key(|f| f.rank);
    out
}

/// Orders `tasks` so that each comes after its dependencies (Kahn's algorithm; ties keep
/// the given order). A cycle or an unknown dependency is an error.
pub fn order_tasks(
    tasks: &[ImplementationTask],
) -> Result<Vec<ImplementationTask>, TranslateError> {
    let ids: BTreeSet<&str> = tasks.iter().map(|t| t.task_id.as_str()).collect();
    for t in tasks {
        if let Some(m) = t.dependencies.iter().find(|d| !ids.contains(d.as_str())) {
            return Err(TranslateError::UnknownDependency {
                task: t.task_id.clone(),
                missing: m.clone(),
            });
        }
    }
    let mut done: BTreeSet<String> = BTreeSet::new();
    let mut out = Vec::with_capacity(tasks.len());
    while out.len() < tasks.len() {
        let next = tasks.iter().find(|t| {
            !done.contains(&t.task_id) && t.dependencies.iter().all(|d| done.contains(d))
        });
        match next {
            Some(t) => {
                done.insert(t.task_id.clone());
                out.push(t.clone());
            }
            None => {
                let left: Vec<String> = tasks
                    .iter()
                    .filter(|t| !done.contains(&t.task_id))
                    .map(|t| t.task_id.clone())
                    .collect();
                return Err(TranslateError::Cycle(cycle_in(tasks, &left)));
            }
        }
    }
    Ok(out)
}

/// One cycle among the tasks `left` (each has an unfinished dependency), closed.
fn cycle_in(tasks: &[ImplementationTask], left: &[String]) -> Vec<String> {
    let deps: BTreeMap<&str, Vec<&str>> = tasks
        .iter()
        .map(|t| {
            (
                t.task_id.as_str(),
                t.dependencies.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    let mut path: Vec<String> = Vec::new();
    let mut at = left.first().map(String::as_str).unwrap_or_default();
    while !path.iter().any(|p| p == at) {
        path.push(at.to_string());
        at = deps
            .get(at)
            .and_then(|d| d.iter().find(|x| left.iter().any(|l| l == *x)))
            .copied()
            .unwrap_or(at);
    }
    let start = path.iter().position(|p| p == at).unwrap_or(0);
    let mut cycle = path.split_off(start);
    cycle.push(at.to_string());
    cycle
}

/// Design → Implementation: one task per source file of the specification (its
/// components together), a file depending on the files whose components it names, then
/// the tests of `test_file`, which depend on every source task. Ordered.
pub fn spec_to_tasks(
    spec: &TechnicalSpec,
    requirements: &[FunctionalRequirement],
    test_file: &str,
) -> Result<Vec<ImplementationTask>, TranslateError> {
    let mut files: Vec<&str> = Vec::new();
    for c in &spec.components {
        if !files.contains(&c.file_path.as_str()) && c.file_path != test_file {
            files.push(c.file_path.as_str());
        }
    }
    if files.is_empty() {
        return Err(TranslateError::Empty);
    }
    let task_id = |f: &str| {
        files
            .iter()
            .position(|x| *x == f)
            .map(|i| format!("T-{}", i + 1))
    };
    let story_of = |name: &str| {
        spec.covers
            .get(name)
            .and_then(|frs| frs.first())
            .and_then(|fr| requirements.iter().find(|r| &r.fr_id == fr))
            .map(|r| r.story_id.clone())
            .or_else(|| requirements.first().map(|r| r.story_id.clone()))
            .unwrap_or_default()
    };
    let mut tasks = Vec::new();
    for f in &files {
        let comps: Vec<_> = spec
            .components
            .iter()
            .filter(|c| c.file_path == *f)
            .collect();
        let text: String = comps
            .iter()
            .map(|c| c.responsibility.to_lowercase())
            .collect::<Vec<_>>()
            .join(" ");
        let mut deps: Vec<String> = spec
            .components
            .iter()
            .filter(|o| o.file_path != *f && o.file_path != test_file)
            .filter(|o| text.contains(&o.name.to_lowercase()))
            .filter_map(|o| task_id(&o.file_path))
            .collect();
        deps.dedup();
        let frs: Vec<String> = comps
            .iter()
            .flat_map(|c| spec.covers.get(&c.name).cloned().unwrap_or_default())
            .collect();
        let conditions: Vec<String> = requirements
            .iter()
            .filter(|r| frs.contains(&r.fr_id))
            .flat_map(|r| r.conditions.clone())
            .collect();
        tasks.push(ImplementationTask {
            task_id: task_id(f).unwrap_or_default(),
            story_id: comps.first().map(|c| story_of(&c.name)).unwrap_or_default(),
            title: format!(
                "Implement {}",
                comps
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            description: format!(
                "{}. Done when: {}",
                comps
                    .iter()
                    .map(|c| sentence(&c.responsibility))
                    .collect::<Vec<_>>()
                    .join("; "),
                if conditions.is_empty() {
                    "its tests pass".to_string()
                } else {
                    conditions.join("; ")
                }
            ),
            file_path: f.to_string(),
            dependencies: deps,
            status: "pending".into(),
        });
    }
    let all: Vec<String> = tasks.iter().map(|t| t.task_id.clone()).collect();
    tasks.push(ImplementationTask {
        task_id: format!("T-{}", files.len() + 1),
        story_id: requirements
            .first()
            .map(|r| r.story_id.clone())
            .unwrap_or_default(),
        title: "Write the unit tests".into(),
        description: "One test per acceptance criterion; unittest; the suite passes".into(),
        file_path: test_file.to_string(),
        dependencies: all,
        status: "pending".into(),
    });
    order_tasks(&tasks)
}

/// Requirement → Quality: a story's test cases, one per acceptance criterion.
pub fn story_to_test_cases(story: &UserStory) -> Vec<TestCase> {
    story
        .acceptance_criteria
        .iter()
        .enumerate()
        .map(|(i, c)| TestCase {
            test_id: format!("TC-{}-{}", story.story_id, i + 1),
            story_id: story.story_id.clone(),
            title: sentence(c),
            test_type: "unit".into(),
            preconditions: vec![format!(
                "the program of story {} is installed",
                story.story_id
            )],
            steps: vec![format!(
                "as a {}: {}",
                sentence(&story.as_a),
                sentence(&story.i_want)
            )],
            expected_result: sentence(c),
            status: "pending".into(),
            matched_tests: Vec::new(),
            failure_reason: None,
        })
        .collect()
}

/// The words of a criterion that a test's name would carry (four letters or more, cut to
/// five, no stop words).
fn keywords(text: &str) -> BTreeSet<String> {
    const STOP: &[&str] = &[
        "that", "with", "when", "then", "from", "this", "shou", "must", "retu", "give", "each",
        "have", "into", "word",
    ];
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.len() >= 4)
        .map(|w| w.to_lowercase().chars().take(5).collect::<String>())
        .filter(|w| !STOP.contains(&w.as_str()))
        .collect()
}

/// The tests of `test_ids` whose names share a keyword with the test case.
pub fn match_tests(case: &TestCase, test_ids: &[String]) -> Vec<String> {
    let want = keywords(&format!("{} {}", case.title, case.expected_result));
    test_ids
        .iter()
        .filter(|id| {
            let name = id.rsplit('.').next().unwrap_or(id);
            let have = keywords(&name.replace('_', " "));
            !want.is_disjoint(&have)
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::domain::Component;
    use proptest::prelude::*;

    fn story(id: &str, p: PriorityLevel) -> UserStory {
        UserStory {
            story_id: id.into(),
            title: "Count".into(),
            as_a: "A support agent".into(),
            i_want: "to count the words of a message.".into(),
            so_that: "I see what customers ask".into(),
            acceptance_criteria: vec![
                "Counting ignores case.".into(),
                "Punctuation is dropped".into(),
            ],
            priority: p,
            story_points: 2,
            status: "approved".into(),
            created_by: "ba_agent".into(),
        }
    }

    fn task(id: &str, deps: &[&str]) -> ImplementationTask {
        ImplementationTask {
            task_id: id.into(),
            dependencies: deps.iter().map(|d| d.to_string()).collect(),
            ..ImplementationTask::default()
        }
    }

    #[test]
    fn stories_become_ranked_requirements() {
        let frs = stories_to_requirements(&[
            story("US-1", PriorityLevel::Low),
            story("US-2", PriorityLevel::High),
        ]);
        assert_eq!(frs[0].story_id, "US-2", "most urgent first");
        assert_eq!(
            frs[0].statement,
            "The system shall let a support agent to count the words of a message"
        );
        assert_eq!(
            frs[1].conditions,
            vec!["Counting ignores case", "Punctuation is dropped"]
        );
    }

    #[test]
    fn a_cycle_is_an_error_that_names_it() {
        let e = order_tasks(&[
            task("T-1", &["T-3"]),
            task("T-2", &["T-1"]),
            task("T-3", &["T-2"]),
        ])
        .unwrap_err();
        let TranslateError::Cycle(c) = e else {
            panic!("{e:?}")
        };
        assert_eq!(c.first(), c.last());
        assert_eq!(c.len(), 4, "{c:?}");
        let e = order_tasks(&[task("T-1", &["T-9"])]).unwrap_err();
        assert!(matches!(e, TranslateError::UnknownDependency { .. }));
    }

    #[test]
    fn spec_becomes_ordered_tasks_with_tests_last() {
        let comp = |n: &str, r: &str, f: &str| Component {
            name: n.into(),
            responsibility: r.into(),
            file_path: f.into(),
        };
        let spec = TechnicalSpec {
            components: vec![
                comp("cli", "parses arguments and calls the counter", "cli.py"),
                comp("counter", "counts words", "counter.py"),
                comp("tests", "tests", "test_counter.py"),
            ],
            covers: [("counter".to_string(), vec!["FR-1".to_string()])].into(),
            ..TechnicalSpec::default()
        };
        let frs = stories_to_requirements(&[story("US-1", PriorityLevel::High)]);
        let tasks = spec_to_tasks(&spec, &frs, "test_counter.py").unwrap();
        let files: Vec<&str> = tasks.iter().map(|t| t.file_path.as_str()).collect();
        assert_eq!(files, vec!["counter.py", "cli.py", "test_counter.py"]);
        assert!(tasks[1].dependencies.contains(&tasks[0].task_id));
        assert!(tasks[0].description.contains("Counting ignores case"));
        assert_eq!(
            spec_to_tasks(&TechnicalSpec::default(), &frs, "t.py"),
            Err(TranslateError::Empty)
        );
    }

    #[test]
    fn test_cases_come_one_per_criterion_and_match_tests_by_name() {
        let cases = story_to_test_cases(&story("US-1", PriorityLevel::High));
        assert_eq!(cases.len(), 2);
        assert_eq!(cases[0].test_id, "TC-US-1-1");
        let ids = vec![
            "test_w.T.test_counting_ignores_case".to_string(),
            "test_w.T.test_top".to_string(),
        ];
        assert_eq!(match_tests(&cases[0], &ids), vec![ids[0].clone()]);
        assert!(match_tests(&cases[1], &ids).is_empty());
    }

    proptest! {
        /// Any acyclic dependency set orders with every dependency first.
        #[test]
        fn orders_respect_dependencies(edges in proptest::collection::vec((0usize..8, 0usize..8), 0..20)) {
            let tasks: Vec<ImplementationTask> = (0..8)
                .map(|i| {
                    let deps: Vec<String> = edges.iter().filter(|(a, b)| *a == i && b < a).map(|(_, b)| format!("T-{b}")).collect();
                    ImplementationTask { task_id: format!("T-{i}"), dependencies: deps, ..ImplementationTask::default() }
                })
                .collect();
            let ordered = order_tasks(&tasks).unwrap();
            prop_assert_eq!(ordered.len(), 8);
            for (pos, t) in ordered.iter().enumerate() {
                for d in &t.dependencies {
                    let dp = ordered.iter().position(|x| &x.task_id == d).unwrap();
                    prop_assert!(dp < pos);
                }
            }
        }
    }
}
