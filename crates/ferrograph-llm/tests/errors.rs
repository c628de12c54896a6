//! Loading errors that need no model download.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use ferrograph_llm::{Engine, LlmError, LoadOptions};
use std::path::PathBuf;

fn temp_file(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferrograph-llm-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn gguf_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// The start of a version 3 GGUF declaring `tensors` tensors and one metadata entry,
/// `general.architecture` = `arch` (the tensor infos follow).
fn gguf_header(tensors: u64, arch: &str) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&tensors.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes()); // metadata entries
    gguf_string(&mut b, "general.architecture");
    b.extend_from_slice(&8u32.to_le_bytes()); // string
    gguf_string(&mut b, arch);
    b
}

#[test]
fn missing_model_names_the_fetch_command() {
    let err = Engine::load(
        std::path::Path::new("/nonexistent/SmolLM2-135M-Instruct.Q4_1.gguf"),
        &LoadOptions::default(),
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, LlmError::ModelMissing { .. }));
    assert!(
        text.contains("scripts/fetch-models.sh smollm2-135m-instruct-q4_1"),
        "{text}"
    );
    assert!(text.contains("ferrograph models fetch"), "{text}");
}

#[test]
fn garbage_is_an_invalid_model() {
    for (name, bytes) in [
        ("empty.gguf", &b""[..]),
        ("text.gguf", &b"hello world, not a model"[..]),
        (
            "truncated.gguf",
            &b"GGUF\x03\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\x7f"[..],
        ),
    ] {
        let err = Engine::load(&temp_file(name, bytes), &LoadOptions::default()).unwrap_err();
        assert!(
            matches!(err, LlmError::InvalidModel { .. }),
            "{name}: {err}"
        );
        assert!(!err.is_retryable());
    }
}

#[test]
fn unsupported_architecture_lists_the_supported_ones() {
    let b = gguf_header(0, "mamba");
    let err = Engine::load(&temp_file("mamba.gguf", &b), &LoadOptions::default()).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, LlmError::UnsupportedArchitecture { .. }),
        "{text}"
    );
    assert!(
        text.contains("mamba") && text.contains("llama") && text.contains("qwen2"),
        "{text}"
    );
}

/// A GGUF header that declares one `f32` tensor of 32 x 4 (512 bytes of data) and holds only
/// `data` bytes of it: what an interrupted download or copy leaves.
fn gguf_with_tensor_data(data: usize) -> Vec<u8> {
    let mut b = gguf_header(1, "llama");
    gguf_string(&mut b, "token_embd.weight");
    b.extend_from_slice(&2u32.to_le_bytes()); // dimensions
    b.extend_from_slice(&32u64.to_le_bytes());
    b.extend_from_slice(&4u64.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes()); // f32
    b.extend_from_slice(&0u64.to_le_bytes()); // offset in the data
    b.resize(b.len().next_multiple_of(32), 0); // the default alignment
    b.resize(b.len() + data, 0);
    b
}

#[test]
fn a_truncated_model_setting_fails_before_any_run_and_says_so() {
    let local = |path: &std::path::Path| ferrograph_llm::Provider::Local {
        model: Some(path.display().to_string()),
        device: Default::default(),
    };
    let cut = temp_file("cut.gguf", &gguf_with_tensor_data(100));
    let err = ferrograph_llm::chat_model_from_config(&local(&cut))
        .err()
        .expect("a truncated GGUF is refused when it is configured");
    let text = err.to_string();
    assert!(matches!(err, LlmError::InvalidModel { .. }), "{text}");
    assert!(
        text.contains("token_embd.weight") && text.contains("truncated"),
        "{text}"
    );
    // The same header with all of its data passes (loading is still lazy).
    let whole = temp_file("whole.gguf", &gguf_with_tensor_data(512));
    assert!(ferrograph_llm::chat_model_from_config(&local(&whole)).is_ok());
    // Not a GGUF at all, and no file: refused too, the missing one naming the fetch command.
    let text_file = temp_file("notes.gguf", b"this is not a model");
    assert!(matches!(
        ferrograph_llm::chat_model_from_config(&local(&text_file)).err(),
        Some(LlmError::InvalidModel { .. })
    ));
    let missing = std::path::Path::new("/nonexistent/model.gguf");
    assert!(matches!(
        ferrograph_llm::chat_model_from_config(&local(missing)).err(),
        Some(LlmError::ModelMissing { .. })
    ));
}
