//! Prints the durable-checkpoint benchmark (`ferrograph_benches::checkpoint`) as JSON: the same
//! document as `ferrograph bench checkpoint --json`, for `benches/peers/compare_checkpoint.py`
//! (`--ferrograph-cmd target/release/checkpoint_bench`). `--quick` shortens it.

fn main() -> std::process::ExitCode {
    let quick = std::env::args().any(|a| a == "--quick");
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("checkpoint_bench: no tokio runtime: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let result = rt.block_on(ferrograph_benches::checkpoint::measure_checkpoint(quick));
    match result.map(|doc| serde_json::to_string_pretty(&doc)) {
        Ok(Ok(text)) => {
            println!("{text}");
            std::process::ExitCode::SUCCESS
        }
        Ok(Err(e)) => {
            eprintln!("checkpoint_bench: {e}");
            std::process::ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("checkpoint_bench: {e}");
            std::process::ExitCode::from(1)
        }
    }
}
