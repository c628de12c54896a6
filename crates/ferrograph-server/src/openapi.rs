//! The OpenAPI 3.0 document of the API, written by hand (served at `/openapi.json`).

use serde_json::{json, Value};

fn err(description: &str) -> Value {
    json!({
        "description": description,
        "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } }
    })
}

fn ok(description: &str, schema: &str) -> Value {
    json!({
        "description": description,
        "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{schema}") } } }
    })
}

fn body(schema: &str) -> Value {
    json!({
        "required": true,
        "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{schema}") } } }
    })
}

fn id_param() -> Value {
    json!({
        "name": "id", "in": "path", "required": true,
        "description": "Thread id: 1 to 128 characters of A-Z a-z 0-9 - _ . : not starting with a dot.",
        "schema": { "type": "string", "pattern": "^[A-Za-z0-9_:-][A-Za-z0-9._:-]{0,127}$" }
    })
}

/// A schema that the workflow's sample input fits and that its state accepts: the sample's
/// fields with the types of their values, nothing else (unknown fields are refused), each
/// optional (an input is a partial update of the state).
fn schema_of(sample: &Value) -> Value {
    match sample {
        Value::Null => json!({ "nullable": true }),
        Value::Bool(_) => json!({ "type": "boolean" }),
        Value::Number(n) if n.is_i64() || n.is_u64() => json!({ "type": "integer" }),
        Value::Number(_) => json!({ "type": "number" }),
        Value::String(_) => json!({ "type": "string" }),
        Value::Array(items) => match items.first() {
            Some(first) => json!({ "type": "array", "items": schema_of(first) }),
            None => json!({ "type": "array" }),
        },
        Value::Object(fields) => {
            let properties: serde_json::Map<String, Value> = fields
                .iter()
                .map(|(k, v)| (k.clone(), schema_of(v)))
                .collect();
            json!({ "type": "object", "additionalProperties": false, "properties": properties })
        }
    }
}

/// The input schema of each workflow (from its sample input), titled by name, with the sample
/// as its example.
fn input_schemas(samples: &[(String, Value)]) -> Vec<Value> {
    samples
        .iter()
        .map(|(name, sample)| {
            let mut schema = schema_of(sample);
            if let Some(o) = schema.as_object_mut() {
                o.insert("title".into(), json!(format!("{name} input")));
                o.insert("example".into(), sample.clone());
            }
            schema
        })
        .collect()
}

/// Adds the responses every protected route can give.
fn with_common(mut responses: Value) -> Value {
    if let Some(map) = responses.as_object_mut() {
        map.entry("401")
            .or_insert_with(|| err("A bearer token is required and missing or wrong."));
        map.entry("403").or_insert_with(|| {
            err("`host_not_allowed`: the `Host` header names neither an IP address, `localhost` nor a configured host; `origin_not_allowed`: a cross-origin page that is not configured; `path_not_allowed`: a path in the input lies outside the server's workspace or output roots.")
        });
    }
    responses
}

/// The document. `samples` are the names of the served workflows with their sample inputs,
/// `nodes` the node names of all of them (`as_node` of a state update) (the `workflow` field of
/// `POST /threads` is one of them).
pub(crate) fn document(samples: &[(String, Value)], nodes: &[String]) -> Value {
    let mut doc = ours(samples, nodes);
    if let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) {
        for (path, ops) in agent_paths() {
            match paths.get_mut(&path).and_then(Value::as_object_mut) {
                Some(existing) => {
                    if let Value::Object(ops) = ops {
                        existing.extend(ops);
                    }
                }
                None => {
                    paths.insert(path, ops);
                }
            }
        }
    }
    doc
}

/// The Agent Server API's routes (LangGraph's shapes, see `agent`): described loosely (any
/// JSON object in, any JSON out) with every status they answer, so that a fuzzer checks they
/// never fail with a 5xx and answer only what is documented.
fn agent_paths() -> serde_json::Map<String, Value> {
    let any = json!({ "description": "LangGraph's shape.", "content": { "application/json": { "schema": {} } } });
    let sse = json!({ "description": "Server-Sent Events in LangGraph's stream modes.", "content": { "text/event-stream": { "schema": { "type": "string" } } } });
    let object_body = json!({
        "required": false,
        "content": { "application/json": { "schema": { "type": "object" } } }
    });
    let refusals = |mut r: Value| {
        if let Some(m) = r.as_object_mut() {
            for (code, what) in [
                ("400", "Bad JSON, query or path."),
                ("404", "No such thread, assistant, graph, run, checkpoint or item."),
                ("409", "A run is in progress on the thread, the thread runs another graph, or the assistant exists."),
                ("413", "The body is larger than the server's limit."),
                ("415", "The Content-Type is not JSON."),
                ("422", "The body does not fit, or asks for what ferrograph does not do (`unsupported`, with the reason)."),
                ("503", "The server has no long-term store."),
            ] {
                m.entry(code).or_insert_with(|| err(what));
            }
        }
        with_common(r)
    };
    let op = |id: &str, summary: &str, with_body: bool, ok_code: &str, ok_resp: &Value| {
        let mut o = json!({
            "operationId": id,
            "summary": summary,
            "tags": ["Agent Server API"],
            "responses": refusals(json!({ ok_code: ok_resp })),
        });
        if with_body {
            o["requestBody"] = object_body.clone();
        }
        o
    };
    let path_param = |name: &str| json!({ "name": name, "in": "path", "required": true, "schema": { "type": "string" } });
    let mut m = serde_json::Map::new();
    let mut add = |path: &str, params: Vec<Value>, ops: Vec<(&str, Value)>| {
        let mut entry = serde_json::Map::new();
        if !params.is_empty() {
            entry.insert("parameters".into(), Value::Array(params));
        }
        for (method, o) in ops {
            entry.insert(method.into(), o);
        }
        m.insert(path.to_string(), Value::Object(entry));
    };
    let none = json!({ "description": "Done." });
    add(
        "/info",
        vec![],
        vec![(
            "get",
            op(
                "agentInfo",
                "What this server is and which parts of the API it has.",
                false,
                "200",
                &any,
            ),
        )],
    );
    add(
        "/ok",
        vec![],
        vec![(
            "get",
            op(
                "agentOk",
                "Liveness, the Agent Server API's way.",
                false,
                "200",
                &any,
            ),
        )],
    );
    add(
        "/assistants",
        vec![],
        vec![(
            "post",
            op(
                "createAssistant",
                "Creates an assistant: a graph plus config, metadata and a name.",
                true,
                "200",
                &any,
            ),
        )],
    );
    add(
        "/assistants/search",
        vec![],
        vec![(
            "post",
            op(
                "searchAssistants",
                "Assistants by graph, name or metadata.",
                true,
                "200",
                &any,
            ),
        )],
    );
    add(
        "/assistants/count",
        vec![],
        vec![(
            "post",
            op(
                "countAssistants",
                "How many assistants match.",
                true,
                "200",
                &any,
            ),
        )],
    );
    add(
        "/assistants/{aid}",
        vec![path_param("aid")],
        vec![
            (
                "get",
                op(
                    "getAssistant",
                    "An assistant (or a graph's default one, by name).",
                    false,
                    "200",
                    &any,
                ),
            ),
            (
                "patch",
                op(
                    "patchAssistant",
                    "Changes an assistant, as a new version.",
                    true,
                    "200",
                    &any,
                ),
            ),
            (
                "delete",
                op(
                    "deleteAssistant",
                    "Deletes a created assistant.",
                    false,
                    "204",
                    &none,
                ),
            ),
        ],
    );
    add(
        "/assistants/{aid}/graph",
        vec![path_param("aid")],
        vec![(
            "get",
            op(
                "getAssistantGraph",
                "The graph in LangGraph's JSON.",
                false,
                "200",
                &any,
            ),
        )],
    );
    add(
        "/assistants/{aid}/schemas",
        vec![path_param("aid")],
        vec![(
            "get",
            op(
                "getAssistantSchemas",
                "The input and config schemas.",
                false,
                "200",
                &any,
            ),
        )],
    );
    add(
        "/assistants/{aid}/subgraphs",
        vec![path_param("aid")],
        vec![(
            "get",
            op(
                "getAssistantSubgraphs",
                "Subgraphs (none are listed).",
                false,
                "200",
                &any,
            ),
        )],
    );
    add(
        "/assistants/{aid}/versions",
        vec![path_param("aid")],
        vec![(
            "post",
            op(
                "assistantVersions",
                "An assistant's versions, newest first.",
                true,
                "200",
                &any,
            ),
        )],
    );
    add(
        "/assistants/{aid}/latest",
        vec![path_param("aid")],
        vec![(
            "post",
            op(
                "setAssistantLatest",
                "Makes a version current.",
                true,
                "200",
                &any,
            ),
        )],
    );
    add(
        "/threads/search",
        vec![],
        vec![(
            "post",
            op(
                "searchThreads",
                "Threads by status, metadata, values or ids.",
                true,
                "200",
                &any,
            ),
        )],
    );
    add(
        "/threads/count",
        vec![],
        vec![(
            "post",
            op("countThreads", "How many threads match.", true, "200", &any),
        )],
    );
    add(
        "/threads/{id}/copy",
        vec![id_param()],
        vec![(
            "post",
            op(
                "copyThread",
                "A new thread with this one's graph, metadata and state.",
                false,
                "200",
                &any,
            ),
        )],
    );
    add(
        "/threads/{id}/state/checkpoint",
        vec![id_param()],
        vec![(
            "post",
            op(
                "getStateAtCheckpoint",
                "The state at a checkpoint.",
                true,
                "200",
                &any,
            ),
        )],
    );
    add(
        "/threads/{id}/state/{checkpoint}",
        vec![id_param(), path_param("checkpoint")],
        vec![(
            "get",
            op(
                "getStateAt",
                "The state at a checkpoint.",
                false,
                "200",
                &any,
            ),
        )],
    );
    // The two pictures answer the same formats.
    let picture = |id: &str, summary: &str| {
        let mut o = op(
            id,
            summary,
            false,
            "200",
            &json!({
                "description": "SVG (default), Mermaid text or LangGraph's JSON.",
                "content": { "image/svg+xml": { "schema": { "type": "string" } }, "text/plain": { "schema": { "type": "string" } }, "application/json": { "schema": {} } }
            }),
        );
        o["parameters"] = json!([{ "name": "format", "in": "query", "required": false, "schema": { "type": "string", "enum": ["svg", "mermaid", "json"] } }]);
        o
    };
    add(
        "/threads/{id}/graph",
        vec![id_param()],
        vec![(
            "get",
            picture(
                "getThreadGraph",
                "The thread's graph with its path and current node highlighted.",
            ),
        )],
    );
    add(
        "/workflows/{name}/graph",
        vec![path_param("name")],
        vec![("get", picture("getWorkflowGraph", "A workflow's graph."))],
    );
    add(
        "/threads/{id}/runs/wait",
        vec![id_param()],
        vec![(
            "post",
            op(
                "agentWaitRun",
                "Runs and answers the final values.",
                true,
                "200",
                &any,
            ),
        )],
    );
    add(
        "/threads/{id}/runs/stream",
        vec![id_param()],
        vec![(
            "post",
            op("agentStreamRun", "Runs and streams.", true, "200", &sse),
        )],
    );
    add(
        "/threads/{id}/runs/{rid}",
        vec![id_param(), path_param("rid")],
        vec![
            ("get", op("getRun", "A run.", false, "200", &any)),
            (
                "delete",
                op("deleteRun", "Forgets a finished run.", false, "204", &none),
            ),
        ],
    );
    add(
        "/threads/{id}/runs/{rid}/join",
        vec![id_param(), path_param("rid")],
        vec![(
            "get",
            op(
                "joinRun",
                "Waits for a run and answers its result (410 `run_result_dropped` when the server's run-memory caps dropped it).",
                false,
                "200",
                &any,
            ),
        )],
    );
    add(
        "/threads/{id}/runs/{rid}/cancel",
        vec![id_param(), path_param("rid")],
        vec![(
            "post",
            op("cancelRun", "Cancels a run.", false, "202", &none),
        )],
    );
    add(
        "/runs",
        vec![],
        vec![(
            "post",
            op(
                "createStatelessRun",
                "A background run on a new thread.",
                true,
                "200",
                &any,
            ),
        )],
    );
    add(
        "/runs/wait",
        vec![],
        vec![(
            "post",
            op(
                "statelessWaitRun",
                "A run on a new thread, waited for.",
                true,
                "200",
                &any,
            ),
        )],
    );
    add(
        "/runs/cancel",
        vec![],
        vec![(
            "post",
            op(
                "cancelRuns",
                "Cancels runs by id, thread or status.",
                true,
                "204",
                &none,
            ),
        )],
    );
    add(
        "/store/items",
        vec![],
        vec![
            ("put", op("putItem", "Stores an item.", true, "204", &none)),
            ("get", {
                let mut o = op(
                    "getItem",
                    "An item by namespace (labels joined by `.`) and key.",
                    false,
                    "200",
                    &any,
                );
                o["parameters"] = json!([
                    { "name": "key", "in": "query", "required": true, "schema": { "type": "string" } },
                    { "name": "namespace", "in": "query", "required": false, "schema": { "type": "string" } }
                ]);
                o
            }),
            (
                "delete",
                op("deleteItem", "Deletes an item.", true, "204", &none),
            ),
        ],
    );
    add(
        "/threads/{id}",
        vec![id_param()],
        vec![(
            "patch",
            op(
                "patchThread",
                "Merges metadata into the thread's.",
                true,
                "200",
                &any,
            ),
        )],
    );
    add(
        "/threads/{id}/history",
        vec![id_param()],
        vec![(
            "post",
            op(
                "agentHistory",
                "The thread's states, newest first, LangGraph's shape.",
                true,
                "200",
                &any,
            ),
        )],
    );
    add(
        "/threads/{id}/runs",
        vec![id_param()],
        vec![("get", {
            let mut o = op(
                "listRuns",
                "The thread's runs on this server, newest first.",
                false,
                "200",
                &any,
            );
            o["parameters"] = json!([
                { "name": "limit", "in": "query", "required": false, "schema": { "type": "integer", "minimum": 1, "maximum": 10000 } },
                { "name": "offset", "in": "query", "required": false, "schema": { "type": "integer", "minimum": 0 } },
                { "name": "status", "in": "query", "required": false, "schema": { "type": "string" } }
            ]);
            o
        })],
    );
    add(
        "/store/items/search",
        vec![],
        vec![(
            "post",
            op(
                "searchItems",
                "Items under a namespace prefix.",
                true,
                "200",
                &any,
            ),
        )],
    );
    add(
        "/store/namespaces",
        vec![],
        vec![(
            "post",
            op("listNamespaces", "Namespaces in use.", true, "200", &any),
        )],
    );
    m
}

fn ours(samples: &[(String, Value)], nodes: &[String]) -> Value {
    let workflows: Vec<&String> = samples.iter().map(|(name, _)| name).collect();
    let inputs = input_schemas(samples);
    let run_example = samples
        .first()
        .map_or(Value::Null, |(_, sample)| json!({ "input": sample }));
    let thread_404 = err("No such thread.");
    let busy = err("`thread_busy`: a run is in progress on the thread (a second run, update or delete is refused until it ends), or `workflow_not_loaded`: the thread's workflow is not served here.");
    let bad_path = err("The path or query is malformed.");
    let too_large = err("The request body is larger than the server's limit (`max_body_bytes`).");
    let not_json = err("The Content-Type is not JSON.");
    let goto_schema = json!({
        "description": "A node name or a list of them, run next together with the tasks already planned (on a new thread: where the run starts).",
        "oneOf": [ { "type": "string" }, { "type": "array", "items": { "type": "string" } } ]
    });
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "ferrograph API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Threads and runs of ferrograph workflows. Every error has the body `{\"error\": {\"code\", \"message\"}}`. Bad JSON is 400, JSON of the wrong shape 422, an unknown thread 404, a second run on a busy thread 409, an oversized body 413. When the server has a token, every route except /healthz needs `Authorization: Bearer <token>`."
        },
        "servers": [ { "url": "/" } ],
        "security": [ { "bearerAuth": [] }, {} ],
        "paths": {
            "/healthz": {
                "get": {
                    "operationId": "healthz",
                    "summary": "Liveness probe (never needs a token).",
                    "security": [],
                    "responses": { "200": ok("The server is up.", "Health") }
                }
            },
            "/metrics": {
                "get": {
                    "operationId": "metrics",
                    "summary": "Prometheus metrics in the text exposition format.",
                    "responses": with_common(json!({
                        "200": { "description": "Metrics.", "content": { "application/openmetrics-text": { "schema": { "type": "string" } } } },
                        "500": err("The thread records could not be read.")
                    }))
                }
            },
            "/openapi.json": {
                "get": {
                    "operationId": "openapi",
                    "summary": "This document.",
                    "responses": with_common(json!({
                        "200": { "description": "The OpenAPI document.", "content": { "application/json": { "schema": { "type": "object" } } } }
                    }))
                }
            },
            "/workflows": {
                "get": {
                    "operationId": "listWorkflows",
                    "summary": "The workflows this server runs: names, descriptions, nodes, Mermaid diagrams and sample inputs.",
                    "responses": with_common(json!({ "200": ok("Workflows.", "WorkflowList") }))
                }
            },
            "/threads": {
                "get": {
                    "operationId": "listThreads",
                    "summary": "Thread records, most recently updated first.",
                    "parameters": [
                        { "name": "status", "in": "query", "required": false,
                          "schema": { "type": "string", "enum": ["idle", "running", "orphaned", "interrupted", "done", "failed"] } },
                        { "name": "workflow", "in": "query", "required": false, "schema": { "type": "string" } },
                        { "name": "limit", "in": "query", "required": false,
                          "schema": { "type": "integer", "minimum": 1, "maximum": 100000 } }
                    ],
                    "responses": with_common(json!({
                        "200": ok("Threads.", "ThreadList"),
                        "400": err("Unknown status or bad limit."),
                        "500": err("The thread records could not be read.")
                    }))
                },
                "post": {
                    "operationId": "createThread",
                    "summary": "Creates a thread of a workflow (status `idle` until its first run).",
                    "requestBody": body("CreateThread"),
                    "responses": with_common(json!({
                        "201": {
                            "description": "The new thread.",
                            "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Thread" } } },
                            "links": {
                                "GetThread": { "operationId": "getThread", "parameters": { "id": "$response.body#/thread_id" } },
                                "CreateRun": { "operationId": "createRun", "parameters": { "id": "$response.body#/thread_id" } },
                                "GetState": { "operationId": "getState", "parameters": { "id": "$response.body#/thread_id" } },
                                "UpdateState": { "operationId": "updateState", "parameters": { "id": "$response.body#/thread_id" } },
                                "GetHistory": { "operationId": "getHistory", "parameters": { "id": "$response.body#/thread_id" } },
                                "DeleteThread": { "operationId": "deleteThread", "parameters": { "id": "$response.body#/thread_id" } }
                            }
                        },
                        "400": err("The body is not JSON."),
                        "404": err("No such workflow."),
                        "409": err("A thread with this id exists."),
                        "413": too_large,
                        "415": not_json,
                        "422": err("The body does not have the expected shape, or the thread id has characters outside A-Z a-z 0-9 - _ . :")
                    }))
                }
            },
            "/threads/{id}": {
                "parameters": [ id_param() ],
                "get": {
                    "operationId": "getThread",
                    "summary": "A thread record: status, pending interrupts, last error.",
                    "responses": with_common(json!({
                        "200": ok("The thread.", "Thread"),
                        "400": bad_path,
                        "404": thread_404
                    }))
                },
                "delete": {
                    "operationId": "deleteThread",
                    "summary": "Deletes a thread with its checkpoints.",
                    "responses": with_common(json!({
                        "204": { "description": "Deleted." },
                        "400": bad_path,
                        "404": thread_404,
                        "409": busy
                    }))
                }
            },
            "/threads/{id}/state": {
                "parameters": [ id_param() ],
                "get": {
                    "operationId": "getState",
                    "summary": "The thread's state at its newest (or the given) checkpoint; `values` is null before the first run.",
                    "parameters": [
                        { "name": "checkpoint_id", "in": "query", "required": false, "schema": { "type": "string" } }
                    ],
                    "responses": with_common(json!({
                        "200": ok("The state.", "Snapshot"),
                        "400": bad_path,
                        "404": err("No such thread or checkpoint."),
                        "409": busy,
                        "500": err("Checkpoint storage failed or holds damaged data.")
                    }))
                },
                "post": {
                    "operationId": "updateState",
                    "summary": "Edits the thread's state, as node `as_node` (or as input), writing a new checkpoint.",
                    "requestBody": body("UpdateState"),
                    "responses": with_common(json!({
                        "200": ok("The checkpoint written.", "UpdateStateResult"),
                        "400": err("The body is not JSON."),
                        "404": thread_404,
                        "409": busy,
                        "413": too_large,
                        "415": not_json,
                        "422": err("The values are not a valid update of the workflow's state, or `as_node` is not a node of it."),
                        "500": err("Checkpoint storage failed.")
                    }))
                }
            },
            "/threads/{id}/history": {
                "parameters": [ id_param() ],
                "get": {
                    "operationId": "getHistory",
                    "summary": "The thread's checkpoints, newest first.",
                    "parameters": [
                        { "name": "limit", "in": "query", "required": false,
                          "schema": { "type": "integer", "minimum": 1, "maximum": 100000 } }
                    ],
                    "responses": with_common(json!({
                        "200": ok("History.", "History"),
                        "400": err("Bad limit or malformed path."),
                        "404": thread_404,
                        "409": busy,
                        "500": err("Checkpoint storage failed or holds damaged data.")
                    }))
                }
            },
            "/threads/{id}/runs": {
                "parameters": [ id_param() ],
                "post": {
                    "operationId": "createRun",
                    "summary": "Runs the thread: from `input`, with `command` (resume values, an update, nodes to go to), or (neither) continuing. Without `stream`, waits and answers the outcome; with `stream`, answers Server-Sent Events (`event: <kind>`, `data: <json>`) ending with `end` (the outcome) or `error`. Only one run at a time per thread: a second one is refused with 409.",
                    "requestBody": {
                        "required": false,
                        "content": { "application/json": { "schema": { "$ref": "#/components/schemas/RunRequest" } } }
                    },
                    "responses": with_common(json!({
                        "200": {
                            "description": "The outcome (JSON) or the event stream (`stream: true`).",
                            "content": {
                                "application/json": { "schema": { "$ref": "#/components/schemas/RunOutcome" } },
                                "text/event-stream": { "schema": { "$ref": "#/components/schemas/SseEvent" } }
                            }
                        },
                        "400": err("The body is not JSON."),
                        "404": thread_404,
                        "409": err("`thread_busy`: a run is already in progress on the thread; `no_pending_interrupt`: a resume value was given but nothing waits for one; `nothing_to_continue`: no input and no checkpoint; `workflow_not_loaded`."),
                        "413": too_large,
                        "415": not_json,
                        "422": err("`invalid_input` / `invalid_body`: the input does not fit the workflow's state; `unknown_interrupt`, `ambiguous_resume`, `bad_resume`: the resume value does not fit the pending interrupts; `run_failed`, `step_limit`: the run failed (the thread records the error)."),
                        "500": err("A node crashed or checkpoint storage failed."),
                        "503": err("The server is shutting down.")
                    }))
                }
            },
            "/threads/{id}/events": {
                "parameters": [ id_param() ],
                "get": {
                    "operationId": "threadEvents",
                    "summary": "Live events of the runs on the thread, as Server-Sent Events: a `thread` event with the record, then `run_start`, each run's events, and `end` or `error`; open until the client leaves or the server stops.",
                    "responses": with_common(json!({
                        "200": { "description": "The event stream.", "content": { "text/event-stream": { "schema": { "$ref": "#/components/schemas/SseEvent" } } } },
                        "400": bad_path,
                        "404": thread_404
                    }))
                }
            }
        },
        "components": {
            "securitySchemes": {
                "bearerAuth": { "type": "http", "scheme": "bearer" }
            },
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "error": {
                            "type": "object",
                            "required": ["code", "message"],
                            "properties": {
                                "code": { "type": "string", "description": "Stable code, e.g. thread_not_found, thread_busy, invalid_input, bad_json, payload_too_large, unauthorized." },
                                "message": { "type": "string" }
                            }
                        }
                    }
                },
                "SseEvent": {
                    "type": "object",
                    "description": "One Server-Sent Event: `event` is its kind, `data` its JSON payload as text.",
                    "required": ["data"],
                    "properties": {
                        "event": { "type": "string" },
                        "data": { "type": "string" },
                        "id": { "type": "string" },
                        "retry": { "type": "integer" }
                    }
                },
                "Health": {
                    "type": "object", "required": ["status"],
                    "properties": { "status": { "type": "string", "enum": ["ok"] } }
                },
                "Interrupt": {
                    "type": "object",
                    "required": ["id", "node", "task_id", "value"],
                    "properties": {
                        "id": { "type": "string" },
                        "node": { "type": "string" },
                        "task_id": { "type": "string" },
                        "value": { "description": "What the node showed (any JSON)." },
                        "static_": { "type": "boolean" }
                    }
                },
                "Thread": {
                    "type": "object",
                    "description": "A thread, with the Agent Server API's fields (status, interrupts by task, created_at, updated_at, metadata) and ours (run_status, pending_interrupts, workflow, ...).",
                    "required": ["thread_id", "workflow", "status", "run_status", "active", "created_at", "updated_at", "created_at_ms", "updated_at_ms", "interrupts", "pending_interrupts", "metadata"],
                    "properties": {
                        "thread_id": { "type": "string" },
                        "status": { "type": "string", "enum": ["idle", "busy", "interrupted", "error"], "description": "The Agent Server API's status." },
                        "interrupts": {
                            "type": "object", "description": "Pending interrupts by task id (the Agent Server API's shape).",
                            "additionalProperties": { "type": "array", "items": { "type": "object" } }
                        },
                        "created_at": { "type": "string" },
                        "updated_at": { "type": "string" },
                        "metadata": { "type": "object" },
                        "config": { "type": "object" },
                        "values": { "description": "The state (threads created or searched through the Agent Server API)." },
                        "workflow": { "type": "string", "description": "The graph it runs (empty until its first run for a thread created without one)." },
                        "run_status": { "type": "string", "enum": ["idle", "running", "orphaned", "interrupted", "done", "failed"] },
                        "active": { "type": "boolean", "description": "A run is in progress through this server." },
                        "created_at_ms": { "type": "integer" },
                        "updated_at_ms": { "type": "integer" },
                        "last_checkpoint_id": { "type": "string", "nullable": true },
                        "error": { "type": "string", "nullable": true },
                        "pending_interrupts": { "type": "array", "items": { "$ref": "#/components/schemas/Interrupt" } },
                        "hint": { "type": "string", "nullable": true, "description": "What to do with an orphaned thread (its process ended mid-run)." }
                    }
                },
                "ThreadList": {
                    "type": "object", "required": ["threads", "total"],
                    "properties": {
                        "threads": { "type": "array", "items": { "$ref": "#/components/schemas/Thread" } },
                        "total": { "type": "integer", "description": "Matching threads before the limit." }
                    }
                },
                "CreateThread": {
                    "type": "object",
                    "required": ["workflow"],
                    "additionalProperties": false,
                    "properties": {
                        "workflow": { "type": "string", "enum": workflows },
                        "thread_id": { "type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,128}$" },
                        "metadata": { "type": "object", "additionalProperties": { "type": "string" } }
                    }
                },
                "Snapshot": {
                    "type": "object",
                    "required": ["values", "next", "checkpoint_id", "step", "writers", "interrupts"],
                    "properties": {
                        "values": { "description": "The state ({} before the first run).", "nullable": true },
                        "next": { "type": "array", "items": { "type": "string" } },
                        "checkpoint_id": { "type": "string", "nullable": true },
                        "parent_id": { "type": "string", "nullable": true },
                        "step": { "type": "integer" },
                        "source": { "description": "Why it was written: input, loop, update or fork.", "nullable": true },
                        "writers": { "type": "array", "items": { "type": "string" } },
                        "created_at_ms": { "type": "integer", "nullable": true },
                        "interrupts": { "type": "array", "items": { "$ref": "#/components/schemas/Interrupt" } }
                    }
                },
                "History": {
                    "type": "object", "required": ["history"],
                    "properties": { "history": { "type": "array", "items": { "$ref": "#/components/schemas/Snapshot" } } }
                },
                "UpdateState": {
                    "type": "object",
                    "required": ["values"],
                    "additionalProperties": false,
                    "properties": {
                        "values": { "anyOf": inputs, "description": "An update of the workflow's state (unknown fields are refused)." },
                        "as_node": { "type": "string", "enum": nodes, "description": "Apply it as this node (routing continues from it): a node of the thread's workflow." }
                    }
                },
                "UpdateStateResult": {
                    "type": "object", "required": ["thread_id", "checkpoint_id"],
                    "properties": { "thread_id": { "type": "string" }, "checkpoint_id": { "type": "string" } }
                },
                "RunRequest": {
                    "type": "object",
                    "example": run_example,
                    "additionalProperties": false,
                    "properties": {
                        "input": { "nullable": true, "anyOf": inputs, "description": "An update of the workflow's state to start from (the thread's workflow's input; unknown fields are refused). Not together with `command`." },
                        "command": {
                            "type": "object",
                            "description": "LangGraph's `Command`: any of `resume`, `update` and `goto`. With `update` or `goto` the thread gets a new checkpoint (open interrupts and finished tasks carry over), then the answers apply and the run continues past static breakpoints.",
                            "additionalProperties": false,
                            "properties": {
                                "resume": { "description": "The answer to the single pending interrupt, or an object mapping pending interrupt ids to answers. For `review`: \"approve\", \"reject\" or {\"feedback\": \"...\"}." },
                                "update": { "type": "object", "description": "An update of the workflow's state, merged before the run continues." },
                                "goto": goto_schema
                            }
                        },
                        "stream": { "type": "boolean", "default": false },
                        "stream_mode": {
                            "type": "array",
                            "items": { "type": "string", "enum": ["values", "updates", "custom", "tasks", "debug", "tokens"] },
                            "description": "Modes to stream (default: values). Interrupt events are always sent."
                        }
                    }
                },
                "RunOutcome": {
                    "type": "object",
                    "required": ["status", "state", "interrupts", "checkpoint_id", "next"],
                    "properties": {
                        "status": { "type": "string", "enum": ["done", "interrupted", "drained"] },
                        "state": { "description": "The workflow's state." },
                        "interrupts": { "type": "array", "items": { "$ref": "#/components/schemas/Interrupt" } },
                        "checkpoint_id": { "type": "string" },
                        "next": { "type": "array", "items": { "type": "string" } },
                        "thread_id": { "type": "string", "nullable": true }
                    }
                },
                "WorkflowList": {
                    "type": "object", "required": ["workflows"],
                    "properties": {
                        "workflows": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["name", "graph", "description", "nodes", "mermaid", "sample_input"],
                                "properties": {
                                    "name": { "type": "string" },
                                    "graph": { "type": "string" },
                                    "description": { "type": "string" },
                                    "nodes": { "type": "array", "items": { "type": "string" } },
                                    "mermaid": { "type": "string" },
                                    "sample_input": { "description": "An input that works." }
                                }
                            }
                        }
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_input_schema_types_the_samples_fields_and_refuses_others() {
        let sample = json!({"title": "t", "files": ["a.rs"], "n": 3, "score": 0.5, "ok": true});
        let schemas = input_schemas(&[("review".to_string(), sample.clone())]);
        let s = &schemas[0];
        assert_eq!(s["title"], "review input");
        assert_eq!(s["example"], sample);
        assert_eq!(s["additionalProperties"], false);
        assert_eq!(s["properties"]["title"]["type"], "string");
        assert_eq!(s["properties"]["files"]["items"]["type"], "string");
        assert_eq!(s["properties"]["n"]["type"], "integer");
        assert_eq!(s["properties"]["score"]["type"], "number");
        assert_eq!(s["properties"]["ok"]["type"], "boolean");
        assert!(s.get("required").is_none(), "an input is a partial update");
    }
}
