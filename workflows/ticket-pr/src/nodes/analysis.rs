//! The first four steps: the ticket and the repository (no model), the classifier, the
//! module picker, and retrieval.

use super::*;

/// Node 1: the ticket, the base commit and the modules; no model call.
pub(crate) async fn fetch_ticket(
    d: Arc<Deps>,
    s: Arc<TicketPrState>,
    _ctx: NodeContext,
) -> Result<Update, NodeError> {
    let fetched = (|| -> Result<Update, TicketPrError> {
        let store = TicketStore::open(&s.tickets)?;
        let t = store.get(s.ticket_key.trim())?;
        let repo = repo::open(Path::new(&s.repo))?;
        repo::check_clean(&repo)?;
        let (branch, commit) = repo::default_branch(&repo)?;
        let modules = repo::modules(&repo, &commit)?;
        let names: Vec<&str> = modules.iter().map(|m| m.name.as_str()).collect();
        let line = format!(
            "Fetched ticket {}: {} ({:?}); base {branch} at {}; modules: {}",
            t.key,
            t.summary,
            t.ticket_type,
            &commit[..commit.len().min(10)],
            names.join(", ")
        );
        Ok(Update::new()
            .ticket(t)
            .base_branch(branch)
            .base_commit(commit)
            .modules(modules)
            .messages(vec![line]))
    })();
    let out = if s.out.is_empty() {
        d.settings.data_dir.join("out").display().to_string()
    } else {
        s.out.clone()
    };
    Ok(match fetched {
        Ok(u) => u.out(out),
        Err(e @ TicketPrError::UnknownTicket(_)) => Update::new()
            .error(Some(e.to_string()))
            .status(status::UNKNOWN_TICKET.to_string())
            .messages(vec![format!("error: {e}")]),
        Err(e) => failed(e.to_string()),
    })
}

/// Node 2: the classifier; a ticket with acceptance criteria stays a story.
pub(crate) async fn classify_ticket(
    d: Arc<Deps>,
    s: Arc<TicketPrState>,
    ctx: NodeContext,
) -> Result<Update, NodeError> {
    let llm = match d.llm() {
        Ok(l) => l,
        Err(e) => return Ok(failed(e)),
    };
    let msgs = messages_for(&s, prompts::classify(&s));
    let (res, call) = llm
        .structured::<Classification>(
            "classify",
            &msgs,
            200,
            |_| {},
            TokenSink::from_context(&ctx),
        )
        .await;
    let calls = vec![call];
    let c = match res {
        Ok(c) => c,
        Err(e) => return Ok(failed(format!("classifying the ticket: {e}")).llm_calls(calls)),
    };
    let mut t = s.ticket.clone();
    let mut line = format!(
        "Classified as {:?}, complexity {:?}: {}",
        c.confirmed_type,
        c.complexity,
        c.technical_summary.trim()
    );
    if c.confirmed_type == TicketType::Bug && !t.acceptance_criteria.is_empty() {
        line.push_str(" (kept as a Story: the ticket has acceptance criteria)");
    } else {
        t.ticket_type = c.confirmed_type;
    }
    Ok(Update::new()
        .classification(Some(c))
        .ticket(t)
        .llm_calls(calls)
        .messages(vec![line]))
}

/// Node 3: the modules to change, from the repository's own list.
pub(crate) async fn identify_modules(
    d: Arc<Deps>,
    s: Arc<TicketPrState>,
    ctx: NodeContext,
) -> Result<Update, NodeError> {
    let llm = match d.llm() {
        Ok(l) => l,
        Err(e) => return Ok(failed(e)),
    };
    let with_module = |files: Vec<String>| -> Vec<(String, String)> {
        files
            .into_iter()
            .filter_map(|f| {
                let m = s.modules.iter().find(|m| m.files.contains(&f))?;
                Some((
                    f.rsplit('/').next().unwrap_or(&f).to_string(),
                    m.name.clone(),
                ))
            })
            .collect()
    };
    let named = with_module(named_files(&s, &s.modules));
    let named_exactly = with_module(named_files_exactly(&s, &s.modules));
    // The modules holding named files first: the first choices are the likely ones.
    let mut names: Vec<String> = Vec::new();
    for m in named
        .iter()
        .map(|(_, m)| m)
        .chain(s.modules.iter().map(|m| &m.name))
    {
        if !names.contains(m) {
            names.push(m.clone());
        }
    }
    let files: Vec<String> = s.modules.iter().flat_map(|m| m.files.clone()).collect();
    let msgs = messages_for(&s, prompts::identify_modules(&s, &s.modules, &named));
    let (res, call) = llm
        .structured::<ModuleChoice>(
            "identify_modules",
            &msgs,
            300,
            |schema| {
                if let Some(p) = schema.pointer_mut("/properties/affected_modules") {
                    p["items"] = json!({"type": "string", "enum": names});
                    p["maxItems"] = json!(names.len().min(3));
                }
                if files.len() <= 300 {
                    if let Some(p) = schema.pointer_mut("/properties/files_likely_to_change") {
                        p["items"] = json!({"type": "string", "enum": files});
                    }
                }
            },
            TokenSink::from_context(&ctx),
        )
        .await;
    let calls = vec![call];
    let choice = match res {
        Ok(c) => c,
        Err(e) => {
            return Ok(failed(format!("identifying the modules: {e}")).llm_calls(calls));
        }
    };
    let mut chosen: Vec<String> = Vec::new();
    for m in &choice.affected_modules {
        if s.modules.iter().any(|x| &x.name == m) && !chosen.contains(m) {
            chosen.push(m.clone());
        }
    }
    // A module holding a file the ticket names exactly is always in scope: the ticket's own
    // words are stronger evidence than a small model's pick.
    let mut added = Vec::new();
    for (file, m) in &named_exactly {
        if !chosen.contains(m) {
            chosen.push(m.clone());
            added.push(format!("{m} (the ticket names {file})"));
        }
    }
    // Chosen modules with no tests of their own get the repository's test module (the
    // top-level `tests/` of a Python package): the tests of the change go there.
    let has_tests = |name: &String| {
        s.modules
            .iter()
            .any(|m| &m.name == name && m.files.iter().any(|f| repo::is_test_path(f)))
    };
    if !chosen.is_empty() && !chosen.iter().any(has_tests) {
        if let Some(t) = s.modules.iter().find(|m| {
            !chosen.contains(&m.name)
                && m.files.iter().all(|f| repo::is_test_path(f))
                && m.files.iter().any(|f| {
                    ferrograph_index::chunk::language_for_path(f).is_some_and(|l| l != "markdown")
                })
        }) {
            chosen.push(t.name.clone());
            added.push(format!("{} (the tests of the chosen modules)", t.name));
        }
    }
    if chosen.is_empty() {
        return Ok(failed(format!(
            "the model named no module of the repository (it said {:?}; the repository has {})",
            choice.affected_modules,
            s.modules
                .iter()
                .map(|m| m.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .llm_calls(calls));
    }
    let affected_files: Vec<String> = choice
        .files_likely_to_change
        .iter()
        .filter(|f| {
            s.modules
                .iter()
                .any(|m| chosen.contains(&m.name) && m.files.contains(f))
        })
        .cloned()
        .collect();
    // A looping or rambling reason is left out rather than shown.
    let reasoning = match first_sentence(&choice.reasoning) {
        r if edit::degenerate(&r) || r.chars().count() > 200 => "no usable reason given".into(),
        r => r,
    };
    let mut line = format!("Modules affected: {} ({reasoning})", chosen.join(", "));
    if !added.is_empty() {
        line.push_str(&format!("; added: {}", added.join(", ")));
    }
    Ok(Update::new()
        .messages(vec![line])
        .affected_modules(chosen)
        .module_reasoning(reasoning)
        .affected_files(affected_files)
        .llm_calls(calls))
}

/// Node 4: the top 4 chunks of each selected module (a path filter per module), merged by
/// similarity, top 10.
pub(crate) async fn retrieve_context(
    d: Arc<Deps>,
    s: Arc<TicketPrState>,
    _ctx: NodeContext,
) -> Result<Update, NodeError> {
    let repo_dir = match std::path::absolute(&s.repo) {
        Ok(p) => p,
        Err(e) => return Ok(failed(format!("{}: {e}", s.repo))),
    };
    let retriever = match d.retriever(&repo_dir).await {
        Ok(r) => r,
        Err(e) => return Ok(failed(format!("indexing the repository: {e}"))),
    };
    let text = format!("{} {}", s.ticket.summary, s.ticket.description);
    let mut chunks: Vec<Chunk> = Vec::new();
    for m in s.selected_modules() {
        let q = Query::new(text.clone())
            // The top level's prefix is every path: ask for more and keep its own four.
            .k(if m.path.is_empty() { 16 } else { 4 })
            .filter(Filter::path_prefix(m.prefix()));
        let hits = match retriever.search_async(q).await {
            Ok(h) => h,
            Err(e) => return Ok(failed(format!("searching {}: {e}", m.name))),
        };
        chunks.extend(
            hits.into_iter()
                .filter(|h| m.files.contains(&h.path))
                .take(4)
                .map(|h| Chunk {
                    file_path: h.path,
                    module: m.name.clone(),
                    start_line: h.start_line,
                    end_line: h.end_line,
                    similarity: h.score,
                    text: h.text,
                }),
        );
    }
    chunks.sort_by(|a, b| b.similarity.total_cmp(&a.similarity));
    chunks.truncate(10);
    let list: Vec<String> = chunks
        .iter()
        .map(|c| format!("{} ({:.2})", c.file_path, c.similarity))
        .collect();
    Ok(Update::new()
        .messages(vec![format!(
            "Retrieved {} chunks: {}",
            chunks.len(),
            list.join(", ")
        )])
        .retrieved_chunks(chunks))
}

/// The first sentence of a model's free text (a small model's later sentences tend to loop).
pub(crate) fn first_sentence(text: &str) -> String {
    let t = text.trim();
    match t.find(". ") {
        Some(i) => t[..=i].to_string(),
        None => t.to_string(),
    }
}

/// Files of `modules` whose names the ticket itself spells exactly (`TaskService`).
pub(crate) fn named_files_exactly(s: &TicketPrState, modules: &[repo::Module]) -> Vec<String> {
    let text = format!("{} {}", s.ticket.summary, s.ticket.description);
    files_named_in(&text, modules, false)
}

/// Files of `modules` whose names the ticket or the classifier mentions: first those named
/// exactly (`TaskService.findOverdue` names `TaskService.java`), then those named loosely
/// (in another case or in the plural: "tasks" names `Task.java`).
pub(crate) fn named_files(s: &TicketPrState, modules: &[repo::Module]) -> Vec<String> {
    let mut text = format!("{} {}", s.ticket.summary, s.ticket.description);
    if let Some(c) = &s.classification {
        text.push(' ');
        text.push_str(&c.affected_components.join(" "));
    }
    files_named_in(&text, modules, true)
}

/// Files of `modules` whose stem is a word of `text`, then (when `loose`) those whose stem
/// is a word in another case or without its plural `s`.
fn files_named_in(text: &str, modules: &[repo::Module], loose: bool) -> Vec<String> {
    let words = edit::identifiers(text);
    let stem = |p: &String| {
        Path::new(p)
            .file_stem()
            .map(|st| st.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let files: Vec<&String> = modules.iter().flat_map(|m| m.files.iter()).collect();
    let mut out: Vec<String> = files
        .iter()
        .filter(|p| words.contains(&stem(p)))
        .map(|p| (*p).clone())
        .collect();
    if loose {
        let lower: std::collections::HashSet<String> = words
            .iter()
            .flat_map(|w| {
                let l = w.to_lowercase();
                let singular = l.strip_suffix('s').map(str::to_string);
                std::iter::once(l).chain(singular)
            })
            .collect();
        for p in files {
            if !out.contains(p) && lower.contains(&stem(p).to_lowercase()) {
                out.push(p.clone());
            }
        }
    }
    out
}
