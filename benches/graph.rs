//! Criterion benches of graph overhead: a 10-node chain and a 100-way fan-out with a join,
//! each without a checkpointer and with the in-memory one.

#![allow(clippy::expect_used, missing_docs)]

use criterion::{criterion_group, criterion_main, Criterion};
use ferrograph::prelude::*;
use ferrograph_benches::{chain10, fanout100, ChainStateUpdate, FanStateUpdate};
use std::sync::Arc;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn graphs(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let runtime = rt.block_on(Runtime::new()).expect("ferrograph runtime");
    let chain = rt.block_on(runtime.load(chain10())).expect("load");
    let chain_mem = chain
        .clone()
        .with_checkpointer(Arc::new(MemorySaver::new()));
    let fan = rt.block_on(runtime.load(fanout100())).expect("load");
    let fan_mem = fan.clone().with_checkpointer(Arc::new(MemorySaver::new()));

    let mut group = c.benchmark_group("graph");
    group.bench_function("chain10/none", |b| {
        b.to_async(&rt).iter(|| async {
            chain
                .invoke(
                    RunInput::Update(ChainStateUpdate::new()),
                    RunConfig::default(),
                )
                .await
                .expect("run")
        })
    });
    let mut n = 0u64;
    group.bench_function("chain10/memory", |b| {
        b.to_async(&rt).iter(|| {
            n += 1;
            let cfg = RunConfig::thread(format!("c{n}"));
            let r = &chain_mem;
            async move {
                r.invoke(RunInput::Update(ChainStateUpdate::new()), cfg)
                    .await
                    .expect("run")
            }
        })
    });
    group.bench_function("fanout100/none", |b| {
        b.to_async(&rt).iter(|| async {
            fan.invoke(
                RunInput::Update(FanStateUpdate::new()),
                RunConfig::default(),
            )
            .await
            .expect("run")
        })
    });
    let mut m = 0u64;
    group.bench_function("fanout100/memory", |b| {
        b.to_async(&rt).iter(|| {
            m += 1;
            let cfg = RunConfig::thread(format!("f{m}"));
            let r = &fan_mem;
            async move {
                r.invoke(RunInput::Update(FanStateUpdate::new()), cfg)
                    .await
                    .expect("run")
            }
        })
    });
    group.finish();
}

criterion_group!(benches, graphs);
criterion_main!(benches);
