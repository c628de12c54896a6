//! OpenTelemetry traces over OTLP (HTTP, protobuf), off unless an endpoint is configured:
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the full URL), else `OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `FERROGRAPH_OTLP_ENDPOINT` (a base URL; `/v1/traces` is appended), as OpenTelemetry's own
//! SDKs read them. `OTEL_SERVICE_NAME` names the service (`ferrograph` by default).
//!
//! What is exported: the spans of target `ferrograph::trace`, which the runtime and the model
//! adapters make: one per run (`ferrograph.run`), superstep (`ferrograph.superstep`), node
//! task (`ferrograph.node`) and model call (`ferrograph.model`, with token counts), nested
//! in that order. Batches are sent from the batch processor's own thread with a blocking
//! HTTP client; what is still queued is sent when the command ends.

use anyhow::{Context, Result};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use std::time::Duration;

/// The target of the spans that are exported.
pub const TRACE_TARGET: &str = "ferrograph::trace";

/// The traces endpoint from the environment, if one is set.
pub fn endpoint_from_env() -> Option<String> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    if let Some(full) = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        return Some(full);
    }
    var("OTEL_EXPORTER_OTLP_ENDPOINT")
        .or_else(|| var("FERROGRAPH_OTLP_ENDPOINT"))
        .map(|base| format!("{}/v1/traces", base.trim_end_matches('/')))
}

/// A running exporter; [`Otel::shutdown`] sends what is queued.
pub struct Otel {
    provider: SdkTracerProvider,
}

/// The blocking reqwest client (the workspace's reqwest; the exporter's own would be a
/// second major version) as the exporter's HTTP client. It runs on the batch processor's
/// thread, outside the async runtime.
#[derive(Debug)]
struct BlockingClient(reqwest::blocking::Client);

#[async_trait::async_trait]
impl HttpClient for BlockingClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let resp = self
            .0
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers)
            .body(body.to_vec())
            .send()?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.bytes()?;
        let mut out = Response::builder().status(status).body(bytes)?;
        *out.headers_mut() = headers;
        Ok(out)
    }
}

impl Otel {
    /// Starts exporting to `endpoint` (the full traces URL). Call outside the async runtime.
    pub fn start(endpoint: &str) -> Result<Otel> {
        let client = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .context("building the OTLP HTTP client")?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(BlockingClient(client))
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(endpoint)
            .build()
            .with_context(|| format!("the OTLP exporter for {endpoint}"))?;
        let service = std::env::var("OTEL_SERVICE_NAME")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "ferrograph".to_string());
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                Resource::builder()
                    .with_service_name(service)
                    .with_attribute(opentelemetry::KeyValue::new(
                        "service.version",
                        env!("CARGO_PKG_VERSION"),
                    ))
                    .build(),
            )
            .build();
        Ok(Otel { provider })
    }

    /// The `tracing` layer that turns the trace spans into OpenTelemetry spans.
    pub fn layer<S>(&self) -> impl tracing_subscriber::Layer<S>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        use tracing_subscriber::Layer as _;
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("ferrograph"))
            .with_filter(
                tracing_subscriber::filter::Targets::new()
                    .with_target(TRACE_TARGET, tracing::Level::INFO),
            )
    }

    /// Sends what is queued and stops.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!("warning: the OTLP exporter did not shut down cleanly: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_url_follows_opentelemetrys_variables() {
        // One test touches these variables, so they are not raced.
        std::env::remove_var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
        std::env::remove_var("OTEL_EXPORTER_OTLP_ENDPOINT");
        std::env::remove_var("FERROGRAPH_OTLP_ENDPOINT");
        assert_eq!(endpoint_from_env(), None);
        std::env::set_var("FERROGRAPH_OTLP_ENDPOINT", "http://127.0.0.1:4318/");
        assert_eq!(
            endpoint_from_env().as_deref(),
            Some("http://127.0.0.1:4318/v1/traces")
        );
        std::env::set_var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:9/t");
        assert_eq!(endpoint_from_env().as_deref(), Some("http://c:9/t"));
        std::env::remove_var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
        std::env::remove_var("FERROGRAPH_OTLP_ENDPOINT");
    }
}
