//! Worker process of the server's durability test (`tests/tests/server_crash.rs`).
//!
//! ```text
//! server_worker DIR
//!     Serves the basics workflows over HTTP on 127.0.0.1 (a free port) with a SledSaver in
//!     DIR; prints `listening ADDR` once it accepts connections, then serves until killed.
//! ```

use ferrograph::checkpoint_savers::SledSaver;
use ferrograph::prelude::*;
use ferrograph::CheckpointSaver;
use std::io::Write;
use std::sync::Arc;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let dir = std::env::args().nth(1).ok_or("usage: server_worker DIR")?;
    let saver: Arc<dyn CheckpointSaver> = SledSaver::open(dir)?;
    let runtime = Runtime::new().await?;
    let registry = ferrograph_basics::registry(&runtime, saver.clone()).await?;
    let state = ferrograph_server::AppState::new(registry, saver, None);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening {addr}")?;
        out.flush()?;
    }
    ferrograph_server::serve_on(listener, state, std::future::pending()).await?;
    Ok(())
}
