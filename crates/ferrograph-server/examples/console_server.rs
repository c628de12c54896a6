//! A small server for the browser and fuzz tests: the built-in workflows over a sled (or
//! memory) checkpoint store, on 127.0.0.1.
//!
//! ```text
//! cargo run -p ferrograph-server --example console_server -- --port 0 --data-dir DIR [--token T]
//! ```
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
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        port: 0,
        data_dir: None,
        token: None,
        max_body_bytes: DEFAULT_MAX_BODY_BYTES,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--port" => args.port = value()?.parse().map_err(|e| format!("--port: {e}"))?,
            "--data-dir" => args.data_dir = Some(value()?),
            "--token" => args.token = Some(value()?),
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

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    let saver: Arc<dyn CheckpointSaver> = match &args.data_dir {
        Some(dir) => SledSaver::open(std::path::Path::new(dir).join("checkpoints"))?,
        None => Arc::new(MemorySaver::new()),
    };
    let runtime = Runtime::new().await?;
    let registry = ferrograph_basics::registry(&runtime, saver.clone()).await?;
    let state = AppState::new(registry, saver, args.token).with_max_body_bytes(args.max_body_bytes);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port)).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    std::io::stdout().flush()?;
    serve_on(listener, state, shutdown_signal()).await?;
    Ok(())
}
