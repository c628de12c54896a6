//! A small server for the browser and fuzz tests: the built-in workflows over a sled (or
//! memory) checkpoint store, on 127.0.0.1.
//!
//! ```text
//! cargo run -p ferrograph-server --example console_server -- --port 0 --data-dir DIR [--token T] [--tutor] [--ticket-pr] [--team]
//! ```
//!
//! `--tutor` adds the tutor workflow with a stand-in model that streams an answer quoted from
//! the course notes word by word (the routing guard picks the tools; quiz questions come from
//! the notes), over a hashing embedder: what the chat page's browser test drives. The real
//! model's tutor is tested in `workflows/tutor/tests/smollm2.rs`.
//!
//! `--team` adds the team workflow with its scripted model on the fixture brief.
//! `--ticket-pr` adds ticket-to-pr with its scripted engineer on the TaskMaster fixture
//! (written to `DIR/fx`, the one folder clients may name): what the console's diff test
//! drives.
//!
//! Prints `listening on http://127.0.0.1:PORT` once the socket is bound, then serves until
//! interrupted (Ctrl-C or SIGTERM).

use ferrograph::checkpoint_savers::SledSaver;
use ferrograph::{CheckpointSaver, MemorySaver, Runtime};
use ferrograph_server::{serve_on, AppState, DEFAULT_MAX_BODY_BYTES};
use std::io::Write;
use std::sync::Arc;

struct Args {
    port: u16,
    data_dir: Option<String>,
    token: Option<String>,
    max_body_bytes: usize,
    tutor: bool,
    ticket_pr: bool,
    team: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        port: 0,
        data_dir: None,
        token: None,
        max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        tutor: false,
        ticket_pr: false,
        team: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--port" => args.port = value()?.parse().map_err(|e| format!("--port: {e}"))?,
            "--data-dir" => args.data_dir = Some(value()?),
            "--token" => args.token = Some(value()?),
            "--tutor" => args.tutor = true,
            "--ticket-pr" => args.ticket_pr = true,
            "--team" => args.team = true,
            "--max-body-bytes" => {
                args.max_body_bytes = value()?
                    .parse()
                    .map_err(|e| format!("--max-body-bytes: {e}"))?
            }
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    let saver: Arc<dyn CheckpointSaver> = match &args.data_dir {
        Some(dir) => SledSaver::open(std::path::Path::new(dir).join("checkpoints"))?,
        None => Arc::new(MemorySaver::new()),
    };
    let runtime = Runtime::new().await?;
    let mut registry = ferrograph_basics::registry(&runtime, saver.clone()).await?;
    // Kept alive while serving when no data directory was given.
    let _scratch = tempfile::tempdir()?;
    if args.tutor {
        let data_dir = match &args.data_dir {
            Some(d) => std::path::PathBuf::from(d),
            None => _scratch.path().to_path_buf(),
        };
        register_tutor(&mut registry, &runtime, saver.clone(), data_dir).await?;
    }
    let mut access = ferrograph_server::access::Access::default();
    if args.ticket_pr {
        // The TaskMaster fixture under <data>/fx, the scripted engineer as the model, and the
        // data folder as the only root clients may name.
        let data_dir = match &args.data_dir {
            Some(d) => std::path::PathBuf::from(d),
            None => _scratch.path().to_path_buf(),
        };
        if !data_dir.join("fx").exists() {
            ferrograph_ticket_pr::fixture::create(&data_dir.join("fx"))?;
        }
        let model = ferrograph_ticket_pr::testing::scripted_model(
            ferrograph_ticket_pr::testing::Behaviour::Good,
        );
        ferrograph_ticket_pr::register_with(
            &mut registry,
            &runtime,
            saver.clone(),
            ferrograph_ticket_pr::testing::settings(&data_dir, Arc::new(model)),
        )
        .await?;
        access.roots = Some(ferrograph::runtime::PathRoots::new(
            [data_dir.clone()],
            data_dir.join("out"),
        )?);
        println!("ticket fixture at {}", data_dir.join("fx").display());
    }
    if args.team {
        // The team's fixture brief under <data>/teamfx and the scripted team as the model.
        let data_dir = match &args.data_dir {
            Some(d) => std::path::PathBuf::from(d),
            None => _scratch.path().to_path_buf(),
        };
        let fx = ferrograph_team::fixture::create(&data_dir.join("teamfx"))?;
        let model =
            ferrograph_team::testing::scripted_model(ferrograph_team::testing::Behaviour::Good);
        ferrograph_team::register_with(
            &mut registry,
            &runtime,
            saver.clone(),
            ferrograph_team::testing::settings(&data_dir, Arc::new(model)),
        )
        .await?;
        access.roots = Some(ferrograph::runtime::PathRoots::new(
            [data_dir.clone()],
            data_dir.join("out"),
        )?);
        println!("team brief at {}", fx.brief.display());
    }
    // The long-term store (the Agent Server API's /store routes and created assistants).
    let store_dir = match &args.data_dir {
        Some(d) => std::path::PathBuf::from(d).join("store"),
        None => _scratch.path().join("store"),
    };
    let (store, _) =
        ferrograph_store::SledStore::open(&store_dir, ferrograph_store::StoreOptions::default())?;
    let state = AppState::new(registry, saver, args.token)
        .with_max_body_bytes(args.max_body_bytes)
        .with_access(access)
        .with_store(Arc::new(ferrograph_store::StoreHandle::new(store)));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port)).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    std::io::stdout().flush()?;
    serve_on(listener, state, ferrograph_server::stop_signal()).await?;
    Ok(())
}

/// Streams the first passage of the course material in its prompt, word by word; no tool
/// calls and no JSON (the tutor's guard and checks take over there).
struct QuotingModel;

#[async_trait::async_trait]
impl ferrograph::chat::ChatModel for QuotingModel {
    fn model_name(&self) -> String {
        "quoting-stand-in".into()
    }

    async fn invoke(
        &self,
        messages: &[ferrograph::Message],
        options: &ferrograph::chat::GenerateOptions,
        sink: Option<ferrograph::chat::TokenSink>,
    ) -> Result<ferrograph::Message, ferrograph::chat::LlmError> {
        if !options.tools.is_empty() || options.response_format.is_some() {
            return Ok(ferrograph::Message::ai(""));
        }
        let system = messages.first().map(|m| m.content.as_str()).unwrap_or("");
        // The first line of prose in the material ("[path (heading)] text" lines, headings).
        let text = system
            .split("From the course:\n")
            .nth(1)
            .unwrap_or("")
            .lines()
            .map(|l| l.split_once("] ").map(|x| x.1).unwrap_or(l).trim())
            .find(|l| !l.starts_with('#') && l.split_whitespace().count() >= 6)
            .unwrap_or("The notes have nothing on that.")
            .replace("**", "");
        let answer = match text.find(". ") {
            Some(i) => format!("From the notes: {}", &text[..=i]),
            None => format!("From the notes: {text}"),
        };
        if let Some(sink) = &sink {
            for (i, word) in answer.split(' ').enumerate() {
                let piece = if i == 0 {
                    word.to_string()
                } else {
                    format!(" {word}")
                };
                sink.send("quoting-stand-in", &piece).await;
                tokio::time::sleep(std::time::Duration::from_millis(15)).await;
            }
        }
        Ok(ferrograph::Message::ai(answer))
    }
}

async fn register_tutor(
    registry: &mut ferrograph::Registry,
    runtime: &Runtime,
    saver: Arc<dyn CheckpointSaver>,
    data_dir: std::path::PathBuf,
) -> Result<(), Box<dyn std::error::Error>> {
    use ferrograph_index::{Embedder, HashEmbedder};
    let ws = ferrograph::WorkflowSettings {
        data_dir,
        max_steps: None,
        run_timeout: None,
        tool_timeout: None,
        llm: Some(Arc::new(QuotingModel)),
        fallback_llm: None,
        ..Default::default()
    };
    let settings = ferrograph_tutor::TutorSettings::from_workflow_settings(&ws);
    let embedder: ferrograph_tutor::course::EmbedderFactory =
        Arc::new(|| Ok(Arc::new(HashEmbedder::new(64)) as Arc<dyn Embedder>));
    let wf = ferrograph_tutor::TutorWorkflow::load(runtime, saver, settings, embedder).await?;
    registry.insert(
        "tutor",
        ferrograph::Entry {
            workflow: Arc::new(wf),
            description: "tutor chat (stand-in model for the browser test)",
            parse_input: ferrograph_tutor::parse_input,
            sample_input: ferrograph_tutor::sample_input,
            parse_args: Some(ferrograph_tutor::parse_args),
            input_paths: &[],
        },
    );
    Ok(())
}
