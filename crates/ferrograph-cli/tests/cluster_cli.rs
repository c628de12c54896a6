//! Clusters of real `ferrograph node` processes on loopback: the cookie, TLS and version
//! rules; graph tasks placed on workers, one of them SIGKILLed mid-task; model calls failing
//! over between model nodes; a fan-out of 100 tasks spread over two workers; and the real
//! local model on one node answering a workflow on another.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const COOKIE: &str = "FERROGRAPH_TEST_CLUSTER_COOKIE";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn ferro(data: &Path, cookie: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferrograph"));
    c.env("FERROGRAPH_DATA_DIR", data)
        .env(COOKIE, cookie)
        .env("FERROGRAPH_CLUSTER_COOKIE_ENV", COOKIE)
        .env_remove("FERROGRAPH_CONFIG")
        .env_remove("FERROGRAPH_MAX_STEPS")
        .env_remove("FERROGRAPH_REMOTE_BASE_URL")
        .env_remove("FERROGRAPH_DEFAULT_MODEL")
        .env_remove("FERROGRAPH_CLUSTER_JOIN")
        .env_remove("FERROGRAPH_PLACE")
        .env_remove("FERROGRAPH_CLUSTER_MODEL");
    c
}

fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A node process, killed when dropped.
struct Node {
    name: String,
    addr: String,
    child: Child,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Node {
    /// Starts `ferrograph node --name NAME` on a free loopback port with `args`, and waits
    /// for its ready line.
    fn start(root: &Path, name: &str, args: &[&str]) -> Node {
        Self::start_on(root, name, free_port(), args)
    }

    fn start_on(root: &Path, name: &str, port: u16, args: &[&str]) -> Node {
        let addr = format!("127.0.0.1:{port}");
        let data = root.join(format!("data-{name}"));
        let mut child = ferro(&data, "test-secret-4c9e2a71b8d3")
            .args([
                "node",
                "--name",
                name,
                "--listen",
                &addr,
                "--cookie-env",
                COOKIE,
            ])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.contains("listening on") {
                    let _ = tx.send(line);
                }
            }
        });
        let ready = rx.recv_timeout(Duration::from_secs(300));
        assert!(ready.is_ok(), "node {name} did not start");
        Node {
            name: name.to_string(),
            addr,
            child,
        }
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn status(root: &Path, join: &str) -> Value {
    let out = ferro(&root.join("data-status"), "test-secret-4c9e2a71b8d3")
        .args(["cluster", "status", "--json", "--join", join])
        .args(["--cookie-env", COOKIE])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let s = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("{e}: {s}"))
}

/// The names of the nodes in `cluster status --json` output `s`, sorted, without the status
/// commands' own client nodes.
fn node_names(s: &Value) -> Vec<&str> {
    let mut names: Vec<&str> = s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .filter(|n| !n.starts_with("status-"))
        .collect();
    names.sort_unstable();
    names
}

/// The name of the node among `names` with a job running, waiting up to 10 s.
fn busy(root: &Path, join: &str, names: &[&str]) -> String {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        let s = status(root, join);
        if let Some(n) = s["nodes"].as_array().unwrap().iter().find(|n| {
            names.contains(&n["name"].as_str().unwrap()) && n["running"].as_u64().unwrap() > 0
        }) {
            return n["name"].as_str().unwrap().to_string();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("none of {names:?} started a job");
}

fn served(root: &Path, join: &str, name: &str) -> u64 {
    let s = status(root, join);
    s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == name)
        .map_or(0, |n| n["served"].as_u64().unwrap())
}

/// Runs `cmd`, which must fail saying `needle`.
fn refused(cmd: &mut Command, needle: &str) {
    let out = cmd.output().unwrap();
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains(needle), "{t}");
}

fn words(n: usize) -> String {
    (0..n)
        .map(|i| format!("w{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Starts `ferrograph run chatbot` on the cluster (tasks of the chatbot node placed on
/// `worker` nodes when `place`), returning the child.
fn chatbot_run(root: &Path, join: &str, thread: &str, message: &str, place: bool) -> Child {
    let mut c = ferro(&root.join("coordinator"), "test-secret-4c9e2a71b8d3");
    c.env("FERROGRAPH_CLUSTER_JOIN", join);
    if place {
        c.env("FERROGRAPH_PLACE", "chatbot/chatbot=worker");
    }
    c.args([
        "run",
        "chatbot",
        "--thread",
        thread,
        "--message",
        message,
        "--stream",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap()
}

fn thread_messages(root: &Path, thread: &str) -> Vec<Value> {
    let out = ferro(&root.join("coordinator"), "test-secret-4c9e2a71b8d3")
        .args(["threads", "show", thread])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["state"]["values"]["messages"].as_array().unwrap().clone()
}

fn history_writers(root: &Path, thread: &str) -> String {
    let out = ferro(&root.join("coordinator"), "test-secret-4c9e2a71b8d3")
        .args(["threads", "history", thread])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[test]
fn the_cookie_tls_and_version_rules_refuse_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let a = Node::start(root, "a", &["--serve-model", "echo"]);

    // A wrong cookie is refused.
    let join = [
        "cluster",
        "status",
        "--join",
        &a.addr,
        "--cookie-env",
        COOKIE,
    ];
    refused(
        ferro(&root.join("x"), "not-the-secret-7d1f0b3a9e").args(join),
        "cookies differ",
    );

    // An empty cookie never starts.
    let node = |name: &'static str, listen: String| {
        let mut c = ferro(&root.join("x"), "test-secret-4c9e2a71b8d3");
        c.args([
            "node",
            "--name",
            name,
            "--listen",
            &listen,
            "--cookie-env",
            COOKIE,
        ]);
        c
    };
    let mut empty = node("e", "127.0.0.1:0".into());
    refused(empty.env(COOKIE, ""), "cookie is empty");
    // A weak one neither, and the message says how to make a good one.
    let mut weak = node("w", "127.0.0.1:0".into());
    refused(weak.env(COOKIE, "a"), "/dev/urandom");

    // Off loopback without TLS is refused, listening or joining.
    refused(
        &mut node("open", "0.0.0.0:0".into()),
        "not a loopback address",
    );
    let far = [
        "cluster",
        "status",
        "--join",
        "192.0.2.7:7400",
        "--cookie-env",
        COOKIE,
    ];
    refused(
        ferro(&root.join("x"), "test-secret-4c9e2a71b8d3").args(far),
        "only over TLS",
    );

    // Another protocol version is refused by name, both ways.
    let mut future = node("future", format!("127.0.0.1:{}", free_port()));
    refused(
        future.args(["--protocol-version", "99", "--join", &a.addr]),
        "speaks ferrograph cluster protocol 1, this build speaks 99",
    );

    // The right cookie sees the node, and not the refused ones.
    let s = status(root, &a.addr);
    assert_eq!(node_names(&s), vec!["a"]);
    assert_eq!(s["hosts"][0]["name"], "echo");
    assert_eq!(s["hosts"][0]["node"], "a");

    // TLS: nodes whose certificates one authority signed join each other; a node of
    // another authority, and a node without TLS, are refused.
    let pki = root.join("pki");
    write_pki(&pki);
    let tls = |who: &str| -> Vec<String> {
        vec![
            "--tls-cert".into(),
            pki.join(format!("{who}.pem")).display().to_string(),
            "--tls-key".into(),
            pki.join(format!("{who}.key")).display().to_string(),
            "--tls-ca".into(),
            pki.join("ca.pem").display().to_string(),
            "--tls-server-name".into(),
            "localhost".into(),
        ]
    };
    let b_args = tls("b");
    let b_refs: Vec<&str> = b_args.iter().map(String::as_str).collect();
    let b = Node::start(root, "b", &b_refs);
    let mut c_args = tls("c");
    c_args.extend(["--join".to_string(), b.addr.clone()]);
    let c_refs: Vec<&str> = c_args.iter().map(String::as_str).collect();
    let c = Node::start(root, "c", &c_refs);
    // With TLS a node joins each node itself (joining a node's peers for it would open
    // connections whose certificates name nobody).
    let out = ferro(&root.join("x"), "test-secret-4c9e2a71b8d3")
        .args([
            "cluster", "status", "--json", "--join", &b.addr, "--join", &c.addr,
        ])
        .args(["--cookie-env", COOKIE])
        .args(tls("c"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(node_names(&s), vec!["b", "c"], "{s}");
    let join_b = [
        "cluster",
        "status",
        "--join",
        &b.addr,
        "--cookie-env",
        COOKIE,
    ];
    refused(
        ferro(&root.join("x"), "test-secret-4c9e2a71b8d3")
            .args(join_b)
            .args(tls("rogue")),
        &format!("could not join {}", b.addr),
    );
    refused(
        ferro(&root.join("x"), "test-secret-4c9e2a71b8d3").args(join_b),
        &format!("could not join {}", b.addr),
    );
    drop(c);
}

/// A certificate authority, nodes `b` and `c` signed by it, and `rogue` signed by another.
fn write_pki(dir: &Path) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    std::fs::create_dir_all(dir).unwrap();
    let authority = |cn: &str| {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, cn.to_string());
        CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap()
    };
    let ca = authority("ferrograph test CA");
    let other = authority("someone else's CA");
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    for (who, issuer) in [("b", &ca), ("c", &ca), ("rogue", &other)] {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .signed_by(&key, issuer)
            .unwrap();
        std::fs::write(dir.join(format!("{who}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{who}.key")), key.serialize_pem()).unwrap();
    }
}

#[test]
fn a_task_lost_with_a_killed_worker_runs_again_on_another_and_a_lone_one_fails_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // The model node (echo: one word every 100 ms) and two workers that run the chatbot's
    // tasks, calling that model.
    let m = Node::start(root, "m", &["--serve-model", "echo:100"]);
    let w1 = Node::start(
        root,
        "w1",
        &["--labels", "worker", "--serve-tasks", "--join", &m.addr],
    );
    let w2 = Node::start(
        root,
        "w2",
        &["--labels", "worker", "--serve-tasks", "--join", &m.addr],
    );
    let question = words(30);

    let child = chatbot_run(root, &m.addr, "t1", &question, true);
    let victim = busy(root, &m.addr, &["w1", "w2"]);
    let (victim, survivor) = if victim == "w1" { (w1, w2) } else { (w2, w1) };
    let victim_name = victim.name.clone();
    victim.kill();
    let out = child.wait_with_output().unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains(&format!("cluster node {victim_name} was lost")),
        "{t}"
    );
    assert!(t.contains("(will retry)"), "{t}");
    let msgs = thread_messages(root, "t1");
    assert_eq!(msgs.len(), 2, "{msgs:?}");
    assert_eq!(msgs[0]["role"], "human");
    assert_eq!(msgs[1]["content"], format!("node m heard: {question}"));
    // One committed step of the chatbot: the lost attempt left nothing behind.
    let h = history_writers(root, "t1");
    let chatbot_steps = h
        .lines()
        .skip(1)
        .filter(|l| l.split_whitespace().nth(3) == Some("chatbot"))
        .count();
    assert_eq!(chatbot_steps, 1, "{h}");
    assert!(served(root, &m.addr, &survivor.name) >= 1);

    // The survivor alone, killed mid-task: the node's three attempts find no worker left and
    // the run fails with the lost node's name; the question stays committed.
    let survivor_name = survivor.name.clone();
    let survivor_port: u16 = survivor.addr.rsplit(':').next().unwrap().parse().unwrap();
    let child = chatbot_run(root, &m.addr, "t2", &question, true);
    busy(root, &m.addr, &[&survivor_name]);
    survivor.kill();
    let out = child.wait_with_output().unwrap();
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains(&survivor_name) && t.contains("lost"), "{t}");
    let msgs = thread_messages(root, "t2");
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert_eq!(msgs[0]["content"], question);

    // The worker comes back (same name and address): it rejoins, and runs tasks again.
    let back = Node::start_on(
        root,
        &survivor_name,
        survivor_port,
        &["--labels", "worker", "--serve-tasks", "--join", &m.addr],
    );
    let out = chatbot_run(root, &m.addr, "t3", "are you back", true)
        .wait_with_output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let msgs = thread_messages(root, "t3");
    assert_eq!(msgs[1]["content"], "node m heard: are you back");
    drop(back);
}

/// A worker that stops answering without closing its connections (SIGSTOP: what a cut
/// network looks like from here) is noticed within the configured failure timeout, and its
/// task runs again on the other worker.
#[test]
fn a_frozen_worker_is_noticed_within_the_failure_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let m = Node::start(root, "m", &["--serve-model", "echo:50"]);
    let w1 = Node::start(
        root,
        "w1",
        &["--labels", "worker", "--serve-tasks", "--join", &m.addr],
    );
    let w2 = Node::start(
        root,
        "w2",
        &["--labels", "worker", "--serve-tasks", "--join", &m.addr],
    );
    let question = words(40);
    let mut c = ferro(&root.join("coordinator"), "test-secret-4c9e2a71b8d3");
    let child = c
        .env("FERROGRAPH_CLUSTER_JOIN", &m.addr)
        .env("FERROGRAPH_PLACE", "chatbot/chatbot=worker")
        .env("FERROGRAPH_CLUSTER_FAILURE_TIMEOUT", "2")
        .args([
            "run",
            "chatbot",
            "--thread",
            "t",
            "--message",
            &question,
            "--stream",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let victim = busy(root, &m.addr, &["w1", "w2"]);
    let frozen = if victim == "w1" { &w1 } else { &w2 };
    let pid = frozen.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    let t = Instant::now();
    let out = child.wait_with_output().unwrap();
    let waited = t.elapsed();
    let _ = Command::new("kill").args(["-CONT", &pid]).status();
    let t2 = text(&out);
    assert!(out.status.success(), "{t2}");
    assert!(
        t2.contains(&format!("cluster node {victim} was lost")),
        "{t2}"
    );
    assert!(t2.contains("no answer within"), "{t2}");
    // Noticed after the poll's wait (1 s) and the failure timeout (2 s), not the 60 s a
    // forgotten job takes to be swept; then the whole answer again (41 words at 50 ms).
    assert!(waited < Duration::from_secs(20), "{waited:?}");
    let msgs = thread_messages(root, "t");
    assert_eq!(msgs.len(), 2);
    assert_eq!(msgs[1]["content"], format!("node m heard: {question}"));
}

/// A node that joins one node of a chain joins that node's peers before `join` returns, so
/// a client that joined the last node of m1 <- m2 <- m3 sees all three and every model host:
/// m3 reached m1 only through m2's list of peers, and the client reached m1 and m2 only
/// through m3's.
#[test]
fn joining_one_node_joins_its_peers_before_the_join_returns() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let m1 = Node::start(root, "m1", &["--serve-model", "echo"]);
    let m2 = Node::start(root, "m2", &["--join", &m1.addr]);
    let m3 = Node::start(root, "m3", &["--serve-model", "echo", "--join", &m2.addr]);
    let s = status(root, &m3.addr);
    assert_eq!(node_names(&s), ["m1", "m2", "m3"], "{s}");
    let mut hosts: Vec<&str> = s["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["node"].as_str().unwrap())
        .collect();
    hosts.sort_unstable();
    assert_eq!(hosts, ["m1", "m3"], "{s}");
}

#[test]
fn a_model_call_lost_with_its_model_node_moves_to_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let m1 = Node::start(root, "m1", &["--serve-model", "echo:100"]);
    let m2 = Node::start(
        root,
        "m2",
        &["--serve-model", "echo:100", "--join", &m1.addr],
    );
    let question = words(30);
    let child = chatbot_run(root, &m2.addr, "t", &question, false);
    let victim = busy(root, &m2.addr, &["m1", "m2"]);
    let (victim, survivor) = if victim == "m1" { (m1, m2) } else { (m2, m1) };
    victim.kill();
    let out = child.wait_with_output().unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let msgs = thread_messages(root, "t");
    assert_eq!(msgs.len(), 2);
    assert_eq!(
        msgs[1]["content"],
        format!("node {} heard: {question}", survivor.name)
    );
}

#[test]
fn a_fan_out_of_100_tasks_spreads_over_two_workers_with_the_same_result() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let commits: String = (0..100)
        .map(|i| match i % 3 {
            0 => format!("fix: crash {i} in the parser\n"),
            1 => format!("feat: option {i}\n"),
            _ => format!("docs: explain {i}\n"),
        })
        .collect();
    let input = root.join("commits.txt");
    std::fs::write(&input, commits).unwrap();
    let outcome = |cluster: Option<&str>| -> Value {
        let mut c = ferro(
            &root.join(format!("run-{}", cluster.is_some())),
            "test-secret-4c9e2a71b8d3",
        );
        if let Some(join) = cluster {
            c.env("FERROGRAPH_CLUSTER_JOIN", join)
                .env("FERROGRAPH_PLACE", "demo/classify=worker");
        }
        let out = c
            .args(["run", "demo", "--json", "--input"])
            .arg(&input)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let s = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(s.lines().last().unwrap()).unwrap()
    };
    let local = outcome(None);
    let w1 = Node::start(root, "w1", &["--labels", "worker", "--serve-tasks"]);
    let w2 = Node::start(
        root,
        "w2",
        &["--labels", "worker", "--serve-tasks", "--join", &w1.addr],
    );
    let placed = outcome(Some(&w1.addr));
    assert_eq!(placed["state"], local["state"]);
    assert_eq!(placed["status"], "done");
    let (a, b) = (served(root, &w1.addr, "w1"), served(root, &w1.addr, "w2"));
    assert_eq!(a + b, 100, "w1 {a}, w2 {b}");
    assert!(a >= 20 && b >= 20, "w1 {a}, w2 {b}");
    drop(w2);
}

#[test]
fn smollm2_on_one_node_answers_the_chatbot_run_on_another() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let m = Node::start(root, "models", &["--serve-model", "default"]);
    let out = chatbot_run(
        root,
        &m.addr,
        "sky",
        "What color is the sky on a clear day?",
        false,
    )
    .wait_with_output()
    .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let msgs = thread_messages(root, "sky");
    let answer = msgs[1]["content"].as_str().unwrap().to_lowercase();
    assert!(answer.contains("blue"), "{answer}");
    assert!(answer.split_whitespace().count() >= 3, "{answer}");
    assert_eq!(served(root, &m.addr, "models"), 1);
}

/// The smoke version of `ferrograph bench cluster` (the README's figures come from the full
/// one): every part runs and its placements add up.
#[test]
fn bench_cluster_runs_and_spreads_its_fan_out() {
    let dir = tempfile::tempdir().unwrap();
    let out = ferro(dir.path(), "")
        .args([
            "bench",
            "cluster",
            "--quick",
            "--calls",
            "2",
            "--max-tokens",
            "4",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let b: Value = serde_json::from_slice(&out.stdout).unwrap();
    let spread: Vec<u64> = b["spread"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[1].as_u64().unwrap())
        .collect();
    assert_eq!(spread.iter().sum::<u64>(), 100, "{b}");
    assert!(spread.iter().all(|&n| n >= 20), "{b}");
    assert_eq!(b["overhead"].as_array().unwrap().len(), 3);
    assert_eq!(b["task"].as_array().unwrap().len(), 2);
    for f in b["fan_out"].as_array().unwrap() {
        let served: u64 = f["served"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p[1].as_u64().unwrap())
            .sum();
        assert_eq!(served, 2, "{b}");
    }
}
