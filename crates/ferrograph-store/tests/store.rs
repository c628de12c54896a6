//! The long-term store on disk: namespaces, filters, TTL, reopening, reconciliation after a
//! crash between the item and its vector, semantic search with the real all-MiniLM-L6-v2, and
//! the store reached from graph nodes and tools across threads.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use ferrograph::core::store::{
    FieldCondition, IndexFields, NamespaceQuery, PutOptions, SearchRequest, Store, StoreError,
};
use ferrograph::prelude::*;
use ferrograph_index::{BertEmbedder, EmbedOptions, Embedder, DEFAULT_EMBEDDING_MODEL};
use ferrograph_store::{SledStore, StoreHandle, StoreOptions};
use serde_json::json;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

fn ns(labels: &[&str]) -> Vec<String> {
    labels.iter().map(|s| s.to_string()).collect()
}

fn plain(dir: &std::path::Path) -> StoreHandle {
    StoreHandle::new(SledStore::open(dir, StoreOptions::plain()).unwrap().0)
}

#[tokio::test]
async fn items_are_namespaced_filtered_listed_and_kept_across_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let store = plain(dir.path());
    let ana = ns(&["students", "ana", "memories"]);
    let ben = ns(&["students", "ben", "memories"]);
    store
        .put(
            &ana,
            "m1",
            json!({"text": "likes fractions", "subject": "math", "level": 2}),
            PutOptions::default(),
        )
        .await
        .unwrap();
    store
        .put(
            &ana,
            "m2",
            json!({"text": "struggles with verbs", "subject": "spanish", "level": 1}),
            PutOptions::default(),
        )
        .await
        .unwrap();
    store
        .put(
            &ben,
            "m1",
            json!({"text": "prefers examples", "subject": "math", "level": 3}),
            PutOptions::default(),
        )
        .await
        .unwrap();
    store
        .put(
            &ns(&["courses", "math"]),
            "guide",
            json!("Unit 1: fractions"),
            PutOptions::default(),
        )
        .await
        .unwrap();

    let got = store.get(&ana, "m1").await.unwrap().unwrap();
    assert_eq!(got.value["text"], "likes fractions");
    assert_eq!(got.namespace, ana);
    assert!(store.get(&ana, "nope").await.unwrap().is_none());
    assert!(store.get(&ns(&["students"]), "m1").await.unwrap().is_none());

    // Overwrite keeps the creation time.
    tokio::time::sleep(Duration::from_millis(5)).await;
    store
        .put(
            &ana,
            "m1",
            json!({"text": "likes fractions a lot", "subject": "math", "level": 2}),
            PutOptions::default(),
        )
        .await
        .unwrap();
    let again = store.get(&ana, "m1").await.unwrap().unwrap();
    assert_eq!(again.created_at_ms, got.created_at_ms);
    assert!(again.updated_at_ms > got.updated_at_ms);

    // Search under a prefix, newest first, with filters.
    let all = store
        .search(SearchRequest::under(["students"]))
        .await
        .unwrap();
    assert_eq!(all.len(), 3);
    assert_eq!(all[0].item.key, "m1");
    assert_eq!(all[0].item.namespace, ana, "newest first");
    let math = store
        .search(
            SearchRequest::under(["students"]).filter("subject", FieldCondition::Eq(json!("math"))),
        )
        .await
        .unwrap();
    assert_eq!(math.len(), 2);
    let hard = store
        .search(SearchRequest::under(["students"]).filter("level", FieldCondition::Gte(json!(2))))
        .await
        .unwrap();
    let mut who: Vec<String> = hard.iter().map(|h| h.item.namespace[1].clone()).collect();
    who.sort();
    assert_eq!(who, vec!["ana", "ben"]);
    let page = store
        .search(SearchRequest {
            offset: 1,
            ..SearchRequest::under(["students"]).limit(1)
        })
        .await
        .unwrap();
    assert_eq!(page.len(), 1);
    assert_eq!(page[0].item.key, all[1].item.key);
    // A prefix is whole labels: "stud" matches nothing.
    assert!(store
        .search(SearchRequest::under(["stud"]))
        .await
        .unwrap()
        .is_empty());

    // Namespaces.
    let spaces = store
        .list_namespaces(NamespaceQuery::default())
        .await
        .unwrap();
    assert_eq!(
        spaces,
        vec![ns(&["courses", "math"]), ana.clone(), ben.clone()]
    );
    let students = store
        .list_namespaces(NamespaceQuery {
            prefix: ns(&["students"]),
            max_depth: Some(2),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        students,
        vec![ns(&["students", "ana"]), ns(&["students", "ben"])]
    );
    let memories = store
        .list_namespaces(NamespaceQuery {
            suffix: ns(&["memories"]),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(memories.len(), 2);

    // Bad requests are typed errors.
    let err = store
        .put(&[], "k", json!(1), PutOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");
    let err = store
        .put(&ana, "bad\nkey", json!(1), PutOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");
    let err = store
        .search(SearchRequest::under(["students"]).query("fractions"))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NoIndex), "{err}");

    // Delete, then reopen: what was written is there, what was deleted is not.
    assert!(store.delete(&ben, "m1").await.unwrap());
    assert!(!store.delete(&ben, "m1").await.unwrap());
    drop(store);
    let store = plain(dir.path());
    assert_eq!(
        store.get(&ana, "m1").await.unwrap().unwrap().value["text"],
        "likes fractions a lot"
    );
    assert!(store.get(&ben, "m1").await.unwrap().is_none());
    assert_eq!(
        store
            .search(SearchRequest::under(["students"]))
            .await
            .unwrap()
            .len(),
        2
    );
}

#[tokio::test]
async fn items_expire_after_their_ttl_and_reads_refresh_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = plain(dir.path());
    let space = ns(&["sessions"]);
    let ttl = PutOptions::ttl(Duration::from_millis(300));
    store
        .put(&space, "short", json!("gone soon"), ttl.clone())
        .await
        .unwrap();
    store
        .put(&space, "kept", json!("read often"), ttl)
        .await
        .unwrap();
    store
        .put(&space, "forever", json!("no ttl"), PutOptions::default())
        .await
        .unwrap();
    let first = store.get(&space, "kept").await.unwrap().unwrap();
    assert!(first.expires_at_ms.is_some());
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(120)).await;
        assert!(
            store.get(&space, "kept").await.unwrap().is_some(),
            "a read did not refresh the ttl"
        );
    }
    assert!(store.get(&space, "short").await.unwrap().is_none());
    let left: Vec<String> = store
        .search(SearchRequest::under(["sessions"]))
        .await
        .unwrap()
        .into_iter()
        .map(|h| h.item.key)
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(store.inner().sweep_expired().unwrap(), 1);
    drop(store);
    let (reopened, _) = SledStore::open(dir.path(), StoreOptions::plain()).unwrap();
    let store = StoreHandle::new(reopened);
    assert!(store.get(&space, "kept").await.unwrap().is_none());
    assert!(store.get(&space, "forever").await.unwrap().is_some());
}

fn minilm() -> Option<Arc<dyn Embedder>> {
    static E: OnceLock<Option<Arc<dyn Embedder>>> = OnceLock::new();
    E.get_or_init(|| {
        match BertEmbedder::from_manifest(DEFAULT_EMBEDDING_MODEL, EmbedOptions { max_tokens: 128, ..EmbedOptions::default() }) {
            Ok(e) => Some(Arc::new(e) as Arc<dyn Embedder>),
            Err(e) => {
                if std::env::var_os("CI").is_some() {
                    panic!("cannot load {DEFAULT_EMBEDDING_MODEL} in CI (run scripts/fetch-models.sh): {e}");
                }
                eprintln!("\n!!!!!! SKIPPING the semantic store test: {e}\n");
                None
            }
        }
    })
    .clone()
}

#[tokio::test]
async fn semantic_search_with_minilm_finds_by_meaning_and_survives_a_crash_between_stores() {
    let Some(embedder) = minilm() else { return };
    let dir = tempfile::tempdir().unwrap();
    let open = |e: Option<Arc<dyn Embedder>>| {
        let options = match e {
            Some(e) => StoreOptions::semantic(e).fields(["text"]),
            None => StoreOptions::plain(),
        };
        SledStore::open(dir.path(), options).unwrap()
    };
    let (inner, report) = open(Some(embedder.clone()));
    assert_eq!(report.items, 0);
    let store = StoreHandle::new(inner);
    let ana = ns(&["students", "ana"]);
    let ben = ns(&["students", "ben"]);
    let facts = [
        (
            &ana,
            "a1",
            "Ana gets confused when adding fractions with different denominators",
            "math",
        ),
        (
            &ana,
            "a2",
            "Ana enjoys reading novels about space travel",
            "reading",
        ),
        (&ana, "a3", "Ana's favourite sport is basketball", "sport"),
        (
            &ben,
            "b1",
            "Ben cannot tell apart the past and present tense of Spanish verbs",
            "spanish",
        ),
        (
            &ben,
            "b2",
            "Ben adds fractions easily but forgets to simplify them",
            "math",
        ),
    ];
    for (space, key, text, subject) in facts {
        store
            .put(
                space,
                key,
                json!({"text": text, "subject": subject}),
                PutOptions::default(),
            )
            .await
            .unwrap();
    }
    // Not embedded: found by listing, never by meaning.
    store
        .put(
            &ana,
            "raw",
            json!({"text": "fractions fractions fractions"}),
            PutOptions {
                index: IndexFields::Skip,
                ..Default::default()
            },
        )
        .await
        .unwrap();

    let hits = store
        .search(
            SearchRequest::under(["students", "ana"])
                .query("trouble with fraction arithmetic")
                .limit(3),
        )
        .await
        .unwrap();
    assert_eq!(hits[0].item.key, "a1", "{hits:#?}");
    assert!(hits.iter().all(|h| h.item.namespace == ana));
    assert!(hits.iter().all(|h| h.item.key != "raw"));
    assert!(hits[0].score.unwrap() > hits.last().unwrap().score.unwrap());
    let hits = store
        .search(
            SearchRequest::under(["students"])
                .query("Spanish grammar")
                .limit(1),
        )
        .await
        .unwrap();
    assert_eq!(hits[0].item.key, "b1");
    let hits = store
        .search(
            SearchRequest::under(["students"])
                .query("fractions")
                .filter("subject", FieldCondition::Eq(json!("math")))
                .limit(10),
        )
        .await
        .unwrap();
    let mut keys: Vec<&str> = hits.iter().map(|h| h.item.key.as_str()).collect();
    keys.sort();
    assert_eq!(keys, vec!["a1", "b2"]);

    // Deleted items leave the search at once.
    store.delete(&ana, "a1").await.unwrap();
    let hits = store
        .search(
            SearchRequest::under(["students", "ana"])
                .query("fraction arithmetic")
                .limit(1),
        )
        .await
        .unwrap();
    assert_ne!(hits[0].item.key, "a1");
    drop(store);

    // Reopening does not embed again.
    let (inner, report) = open(Some(embedder.clone()));
    assert_eq!(
        (report.items, report.reembedded, report.orphans_removed),
        (5, 0, 0)
    );
    drop(inner);

    // What a crash between the two stores leaves (simulated by writing through a store opened
    // without its index): an item whose vector is stale, and a vector whose item is gone.
    // Opening with the index repairs both before anything is served.
    let (inner, _) = open(None);
    let plain = StoreHandle::new(inner);
    plain
        .put(
            &ben,
            "b2",
            json!({"text": "Ben now loves geometry proofs", "subject": "math"}),
            PutOptions::default(),
        )
        .await
        .unwrap();
    plain.delete(&ana, "a3").await.unwrap();
    drop(plain);
    let (inner, report) = open(Some(embedder));
    assert_eq!(report.reembedded, 1, "{report:?}");
    assert_eq!(report.orphans_removed, 1, "{report:?}");
    let store = StoreHandle::new(inner);
    let hits = store
        .search(
            SearchRequest::under(["students"])
                .query("basketball")
                .limit(10),
        )
        .await
        .unwrap();
    assert!(hits.iter().all(|h| h.item.key != "a3"));
    let hits = store
        .search(
            SearchRequest::under(["students", "ben"])
                .query("geometry")
                .limit(1),
        )
        .await
        .unwrap();
    assert_eq!(hits[0].item.key, "b2");
    assert!(hits[0].item.value["text"]
        .as_str()
        .unwrap()
        .contains("geometry"));
}

#[derive(State, Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
struct Turn {
    user: String,
    said: String,
    #[reducer(append)]
    recalled: Vec<String>,
}

// LangGraph: nodes get the store (`store: BaseStore` / `runtime.store`); what one thread puts,
// another thread of the same graph reads.
#[tokio::test]
async fn nodes_and_tools_share_the_store_across_threads() {
    use ferrograph_tools::{Tool, ToolContext, ToolError, ToolExecutor, ToolRegistry};

    #[derive(Debug)]
    struct Recall;
    #[async_trait::async_trait]
    impl Tool for Recall {
        fn name(&self) -> &str {
            "recall"
        }
        fn description(&self) -> &str {
            "What is remembered about the user."
        }
        fn parameters(&self) -> serde_json::Value {
            json!({"type": "object", "properties": {"user": {"type": "string"}}, "required": ["user"]})
        }
        async fn call(
            &self,
            args: serde_json::Value,
            ctx: &ToolContext,
        ) -> Result<serde_json::Value, ToolError> {
            let store = ctx
                .store
                .as_ref()
                .ok_or_else(|| ToolError::failed("no store"))?;
            let user = args["user"].as_str().unwrap_or_default().to_string();
            let items = store
                .search(SearchRequest::under(["users", user.as_str()]))
                .await
                .map_err(|e| ToolError::failed(e.to_string()))?;
            Ok(json!(items
                .iter()
                .map(|i| i.item.value["said"].clone())
                .collect::<Vec<_>>()))
        }
    }
    let tools = ToolExecutor::new(ToolRegistry::new().with(Recall).unwrap());

    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(plain(dir.path()));
    let graph = StateGraph::<Turn>::new("memory")
        .add_node("remember", |s: Arc<Turn>, ctx: NodeContext| async move {
            let store = ctx.store().ok_or_else(|| NodeError::fatal("no store"))?;
            let space = ns(&["users", &s.user]);
            let key = ctx.thread_id().unwrap_or("none").to_string();
            store
                .put(&space, &key, json!({"said": s.said}), PutOptions::default())
                .await
                .map_err(NodeError::from_error)?;
            Ok(TurnUpdate::new())
        })
        .add_node("recall", move |s: Arc<Turn>, ctx: NodeContext| {
            let tools = tools.clone();
            async move {
                let call = ToolCall::new("recall", json!({"user": s.user}));
                let out = tools.execute(&[call], Some(&ctx)).await;
                Ok(TurnUpdate::new().recalled(vec![out[0].content.clone()]))
            }
        })
        .add_edge(START, "remember")
        .add_edge("remember", "recall")
        .add_edge("recall", END)
        .compile()
        .unwrap();
    let runner = Runtime::new()
        .await
        .unwrap()
        .load(graph)
        .await
        .unwrap()
        .with_checkpointer(Arc::new(MemorySaver::new()))
        .with_store(store.clone());
    let turn = |said: &str| {
        RunInput::Update(
            TurnUpdate::new()
                .user("ana".to_string())
                .said(said.to_string()),
        )
    };
    runner
        .invoke(turn("I like maps"), RunConfig::thread("monday"))
        .await
        .unwrap();
    let out = runner
        .invoke(turn("and rivers"), RunConfig::thread("tuesday"))
        .await
        .unwrap();
    let recalled = &out.state.recalled[0];
    assert!(recalled.contains("I like maps"), "{recalled}");
    assert!(recalled.contains("and rivers"), "{recalled}");
    // Another user's memory is not reachable under ana's namespace.
    let out = runner
        .invoke(
            RunInput::Update(
                TurnUpdate::new()
                    .user("ben".to_string())
                    .said("hello".to_string()),
            ),
            RunConfig::thread("ben-1"),
        )
        .await
        .unwrap();
    assert!(!out.state.recalled[0].contains("maps"));
    assert_eq!(
        store
            .list_namespaces(NamespaceQuery::default())
            .await
            .unwrap()
            .len(),
        2
    );
}
