//! Pictures of a compiled graph: its nodes and edges as data ([`GraphDrawing`]), drawn as a
//! Mermaid flowchart, as LangGraph's graph JSON (what `/assistants/{id}/graph` answers) and
//! as an SVG laid out in layers, each with the node that runs now and the path taken so far
//! highlighted ([`Highlight`]). Pure computation: no IO.

use serde::Serialize;
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;

/// Name of the entry pseudo-node.
pub const START_NODE: &str = "__start__";
/// Name of the exit pseudo-node.
pub const END_NODE: &str = "__end__";

/// How an edge is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EdgeKind {
    /// Always, when the source finishes.
    Direct,
    /// When the source's router picks the edge's label.
    Conditional,
    /// When every source of a join has finished.
    Join,
}

/// One edge of the picture.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DrawEdge {
    /// Source node (or [`START_NODE`]).
    pub source: String,
    /// Target node (or [`END_NODE`]).
    pub target: String,
    /// The router's label for a conditional edge.
    pub label: Option<String>,
    /// How it is taken.
    pub kind: EdgeKind,
}

/// A graph's nodes and edges, ready to draw.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GraphDrawing {
    /// Graph name.
    pub name: String,
    /// The graph's nodes, in declaration order (without the pseudo-nodes).
    pub nodes: Vec<String>,
    /// Every edge.
    pub edges: Vec<DrawEdge>,
}

/// What to highlight: the nodes running now, the nodes that ran, the edges taken.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Highlight {
    /// Nodes running now or waiting (an interrupt).
    pub current: BTreeSet<String>,
    /// Nodes that ran.
    pub visited: BTreeSet<String>,
    /// Edges taken, as (source, target).
    pub taken: BTreeSet<(String, String)>,
}

impl Highlight {
    /// The highlight of a path: `steps` are the nodes of each superstep in order (the nodes
    /// that wrote each checkpoint); the edges taken join consecutive steps where the graph has
    /// an edge; `current` are the nodes planned next.
    pub fn from_steps(drawing: &GraphDrawing, steps: &[Vec<String>], current: &[String]) -> Self {
        let mut h = Highlight::default();
        let mut prev: Vec<String> = vec![START_NODE.to_string()];
        let mut walked: Vec<&Vec<String>> = steps.iter().filter(|s| !s.is_empty()).collect();
        let next = current.to_vec();
        if !next.is_empty() {
            walked.push(&next);
        }
        for step in walked {
            for to in step {
                if to != START_NODE {
                    h.visited.insert(to.clone());
                }
                for from in &prev {
                    if drawing.has_edge(from, to) {
                        h.taken.insert((from.clone(), to.clone()));
                    }
                }
            }
            prev = step.clone();
        }
        if current.is_empty() {
            let ended = prev.iter().any(|p| drawing.has_edge(p, END_NODE));
            if ended && !steps.is_empty() {
                for p in &prev {
                    if drawing.has_edge(p, END_NODE) {
                        h.taken.insert((p.clone(), END_NODE.to_string()));
                    }
                }
                h.visited.insert(END_NODE.to_string());
            }
        }
        for c in current {
            h.visited.remove(c);
            h.current.insert(c.clone());
        }
        h
    }
}

fn mermaid_id(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Node boxes and their places.
struct Layout {
    /// Every drawn node: start, the graph's nodes, end (when reached).
    names: Vec<String>,
    layer: Vec<usize>,
    x: Vec<f64>,
    y: Vec<f64>,
    w: Vec<f64>,
    width: f64,
    height: f64,
}

const BOX_H: f64 = 34.0;
const LAYER_GAP: f64 = 78.0;
const NODE_GAP: f64 = 36.0;
const MARGIN: f64 = 24.0;
/// Room on the right for edges that go back up.
const BACK_LANE: f64 = 70.0;

impl GraphDrawing {
    /// Whether the picture has an edge from `source` to `target`.
    pub fn has_edge(&self, source: &str, target: &str) -> bool {
        self.edges
            .iter()
            .any(|e| e.source == source && e.target == target)
    }

    fn drawn_names(&self) -> Vec<String> {
        let mut names = vec![START_NODE.to_string()];
        names.extend(self.nodes.iter().cloned());
        if self.edges.iter().any(|e| e.target == END_NODE) {
            names.push(END_NODE.to_string());
        }
        names
    }

    /// A Mermaid flowchart; with `highlight`, the current node and the path taken get
    /// classes of their own.
    pub fn to_mermaid(&self, highlight: Option<&Highlight>) -> String {
        let mut out = String::from("flowchart TD\n");
        for name in self.drawn_names() {
            let id = mermaid_id(&name);
            let shape = if name == START_NODE || name == END_NODE {
                format!("{id}([{name}])")
            } else {
                format!("{id}[\"{name}\"]")
            };
            let _ = writeln!(out, "  {shape}");
        }
        for (i, e) in self.edges.iter().enumerate() {
            let (s, t) = (mermaid_id(&e.source), mermaid_id(&e.target));
            let line = match (&e.kind, &e.label) {
                (EdgeKind::Conditional, Some(l)) if l != &e.target => {
                    format!("  {s} -. {} .-> {t}", l.replace(['|', '"'], "'"))
                }
                (EdgeKind::Conditional, _) => format!("  {s} -.-> {t}"),
                (EdgeKind::Join, _) => format!("  {s} ==> {t}"),
                _ => format!("  {s} --> {t}"),
            };
            out.push_str(&line);
            out.push('\n');
            if let Some(h) = highlight {
                if h.taken.contains(&(e.source.clone(), e.target.clone())) {
                    let _ = writeln!(out, "  linkStyle {i} stroke:#2563eb,stroke-width:3px");
                }
            }
        }
        if let Some(h) = highlight {
            out.push_str("  classDef visited fill:#dbeafe,stroke:#2563eb\n");
            out.push_str("  classDef current fill:#fde68a,stroke:#b45309,stroke-width:3px\n");
            for v in &h.visited {
                let _ = writeln!(out, "  class {} visited", mermaid_id(v));
            }
            for c in &h.current {
                let _ = writeln!(out, "  class {} current", mermaid_id(c));
            }
        }
        out
    }

    /// LangGraph's graph JSON: `nodes` (`id`, `type`, `data`) and `edges` (`source`, `target`,
    /// `conditional`, and the label as `data` where there is one).
    pub fn to_langgraph_json(&self) -> Value {
        let nodes: Vec<Value> = self
            .drawn_names()
            .into_iter()
            .map(|n| {
                if n == START_NODE || n == END_NODE {
                    json!({ "id": n, "type": "schema", "data": n })
                } else {
                    json!({
                        "id": n, "type": "runnable",
                        "data": { "id": ["ferrograph", "node", n], "name": n },
                    })
                }
            })
            .collect();
        let edges: Vec<Value> = self
            .edges
            .iter()
            .map(|e| {
                let mut v = json!({
                    "source": e.source, "target": e.target,
                    "conditional": e.kind == EdgeKind::Conditional,
                });
                if let Some(l) = &e.label {
                    if l != &e.target {
                        v["data"] = json!(l);
                    }
                }
                v
            })
            .collect();
        json!({ "nodes": nodes, "edges": edges })
    }

    fn layout(&self) -> Layout {
        let names = self.drawn_names();
        let n = names.len();
        let index: HashMap<&str, usize> = names
            .iter()
            .enumerate()
            .map(|(i, s)| (s.as_str(), i))
            .collect();
        let mut succ: Vec<Vec<usize>> = vec![Vec::new(); n];
        for e in &self.edges {
            if let (Some(&a), Some(&b)) =
                (index.get(e.source.as_str()), index.get(e.target.as_str()))
            {
                if !succ[a].contains(&b) {
                    succ[a].push(b);
                }
            }
        }
        // Back edges: those that close a cycle in a depth-first walk from the start.
        let mut state = vec![0u8; n];
        let mut back: BTreeSet<(usize, usize)> = BTreeSet::new();
        let mut order: Vec<usize> = Vec::new();
        for root in 0..n {
            if state[root] != 0 {
                continue;
            }
            let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
            state[root] = 1;
            while let Some(&mut (v, ref mut i)) = stack.last_mut() {
                if *i < succ[v].len() {
                    let w = succ[v][*i];
                    *i += 1;
                    match state[w] {
                        0 => {
                            state[w] = 1;
                            stack.push((w, 0));
                        }
                        1 => {
                            back.insert((v, w));
                        }
                        _ => {}
                    }
                } else {
                    state[v] = 2;
                    order.push(v);
                    stack.pop();
                }
            }
        }
        order.reverse();
        // Longest path over the forward edges, in topological order.
        let mut layer = vec![0usize; n];
        for &v in &order {
            for &w in &succ[v] {
                if !back.contains(&(v, w)) && w != v {
                    layer[w] = layer[w].max(layer[v] + 1);
                }
            }
        }
        if let Some(&end) = index.get(END_NODE) {
            let deepest = (0..n)
                .filter(|&i| i != end)
                .map(|i| layer[i])
                .max()
                .unwrap_or(0);
            layer[end] = layer[end].max(deepest + 1);
        }
        let depth = layer.iter().copied().max().unwrap_or(0) + 1;
        let mut rows: Vec<Vec<usize>> = vec![Vec::new(); depth];
        for (i, &l) in layer.iter().enumerate() {
            rows[l].push(i);
        }
        // A few barycenter sweeps to keep edges from crossing.
        let mut pos = vec![0f64; n];
        let place = |rows: &Vec<Vec<usize>>, pos: &mut Vec<f64>| {
            for row in rows {
                for (k, &v) in row.iter().enumerate() {
                    pos[v] = k as f64;
                }
            }
        };
        place(&rows, &mut pos);
        let mut pred: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (v, ws) in succ.iter().enumerate() {
            for &w in ws {
                if !back.contains(&(v, w)) && v != w {
                    pred[w].push(v);
                }
            }
        }
        for sweep in 0..4 {
            let down = sweep % 2 == 0;
            let range: Vec<usize> = if down {
                (1..depth).collect()
            } else {
                (0..depth.saturating_sub(1)).rev().collect()
            };
            for l in range {
                let mut keyed: Vec<(f64, usize)> = rows[l]
                    .iter()
                    .map(|&v| {
                        let nb = if down { &pred[v] } else { &succ[v] };
                        let nb: Vec<usize> = nb
                            .iter()
                            .copied()
                            .filter(|&u| !back.contains(&(v, u)))
                            .collect();
                        let key = if nb.is_empty() {
                            pos[v]
                        } else {
                            nb.iter().map(|&u| pos[u]).sum::<f64>() / nb.len() as f64
                        };
                        (key, v)
                    })
                    .collect();
                keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                rows[l] = keyed.into_iter().map(|(_, v)| v).collect();
                for (k, &v) in rows[l].iter().enumerate() {
                    pos[v] = k as f64;
                }
            }
        }
        let w: Vec<f64> = names
            .iter()
            .map(|s| (s.chars().count() as f64 * 7.4 + 28.0).max(84.0))
            .collect();
        let row_width = |row: &Vec<usize>| -> f64 {
            row.iter().map(|&v| w[v]).sum::<f64>() + NODE_GAP * row.len().saturating_sub(1) as f64
        };
        let widest = rows.iter().map(row_width).fold(0.0, f64::max);
        let width = widest + 2.0 * MARGIN + if back.is_empty() { 0.0 } else { BACK_LANE };
        let mut x = vec![0f64; n];
        let mut y = vec![0f64; n];
        for (l, row) in rows.iter().enumerate() {
            let mut cx = MARGIN + (widest - row_width(row)) / 2.0;
            for &v in row {
                x[v] = cx;
                y[v] = MARGIN + l as f64 * LAYER_GAP;
                cx += w[v] + NODE_GAP;
            }
        }
        let height = MARGIN * 2.0 + (depth as f64 - 1.0) * LAYER_GAP + BOX_H;
        Layout {
            names,
            layer,
            x,
            y,
            w,
            width,
            height,
        }
    }

    /// An SVG picture laid out top to bottom in layers. Every node is a `<g class="node …"
    /// data-node="NAME">`; with `highlight`, the current node has the class `current`, the
    /// nodes that ran `visited`, and the edges taken `taken`.
    pub fn to_svg(&self, highlight: Option<&Highlight>) -> String {
        let lay = self.layout();
        let empty = Highlight::default();
        let h = highlight.unwrap_or(&empty);
        let index: HashMap<&str, usize> = lay
            .names
            .iter()
            .enumerate()
            .map(|(i, s)| (s.as_str(), i))
            .collect();
        let mut out = String::new();
        let _ = write!(
            out,
            r##"<svg xmlns="http://www.w3.org/2000/svg" class="graph" viewBox="0 0 {w:.0} {h:.0}" width="{w:.0}" height="{h:.0}" role="img" aria-label="graph {name}">"##,
            w = lay.width,
            h = lay.height,
            name = xml(&self.name),
        );
        out.push_str(concat!(
            "<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\">",
            "<path d=\"M0,0 L10,5 L0,10 z\" fill=\"#64748b\"/></marker>",
            "<marker id=\"arrow-taken\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\">",
            "<path d=\"M0,0 L10,5 L0,10 z\" fill=\"#2563eb\"/></marker></defs>",
            "<style>.graph text{font:13px system-ui,sans-serif;fill:#0f172a}",
            ".graph .edge{fill:none;stroke:#64748b;stroke-width:1.4}",
            ".graph .edge.conditional{stroke-dasharray:5 4}",
            ".graph .edge.join{stroke-width:2.6}",
            ".graph .edge.taken{stroke:#2563eb;stroke-width:2.8}",
            ".graph .label{font-size:11px;fill:#475569}",
            ".graph .node rect{fill:#f8fafc;stroke:#64748b;stroke-width:1.2}",
            ".graph .node.pseudo rect{fill:#e2e8f0}",
            ".graph .node.visited rect{fill:#dbeafe;stroke:#2563eb}",
            ".graph .node.current rect{fill:#fde68a;stroke:#b45309;stroke-width:3}</style>",
        ));
        for e in &self.edges {
            let (Some(&a), Some(&b)) = (index.get(e.source.as_str()), index.get(e.target.as_str()))
            else {
                continue;
            };
            let taken = h.taken.contains(&(e.source.clone(), e.target.clone()));
            let class = match e.kind {
                EdgeKind::Direct => "edge",
                EdgeKind::Conditional => "edge conditional",
                EdgeKind::Join => "edge join",
            };
            let (ax, ay, aw) = (lay.x[a], lay.y[a], lay.w[a]);
            let (bx, by, bw) = (lay.x[b], lay.y[b], lay.w[b]);
            let (d, lx, ly) = if a == b {
                let rx = ax + aw;
                let cy = ay + BOX_H / 2.0;
                (
                    format!(
                        "M{:.1},{:.1} C{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}",
                        rx,
                        cy - 8.0,
                        rx + 40.0,
                        cy - 30.0,
                        rx + 40.0,
                        cy + 30.0,
                        rx,
                        cy + 8.0
                    ),
                    rx + 44.0,
                    cy,
                )
            } else if lay.layer[b] > lay.layer[a] {
                let (sx, sy) = (ax + aw / 2.0, ay + BOX_H);
                let (tx, ty) = (bx + bw / 2.0, by);
                let mid = (sy + ty) / 2.0;
                (
                    format!("M{sx:.1},{sy:.1} C{sx:.1},{mid:.1} {tx:.1},{mid:.1} {tx:.1},{ty:.1}"),
                    (sx + tx) / 2.0 + 4.0,
                    mid,
                )
            } else {
                // Back up (or sideways): around the right of both boxes.
                let (sx, sy) = (ax + aw, ay + BOX_H / 2.0);
                let (tx, ty) = (bx + bw, by + BOX_H / 2.0);
                let lane = lay.width - BACK_LANE / 2.0;
                (
                    format!(
                        "M{sx:.1},{sy:.1} C{lane:.1},{sy:.1} {lane:.1},{ty:.1} {tx:.1},{ty:.1}"
                    ),
                    lane - 30.0,
                    (sy + ty) / 2.0,
                )
            };
            let _ = write!(
                out,
                r#"<path class="{class}{t}" data-source="{s}" data-target="{g}" d="{d}" marker-end="url(#{m})"/>"#,
                t = if taken { " taken" } else { "" },
                s = xml(&e.source),
                g = xml(&e.target),
                m = if taken { "arrow-taken" } else { "arrow" },
            );
            if let Some(l) = &e.label {
                if l != &e.target {
                    let _ = write!(
                        out,
                        r#"<text class="label" x="{lx:.1}" y="{ly:.1}">{}</text>"#,
                        xml(l)
                    );
                }
            }
        }
        for (i, name) in lay.names.iter().enumerate() {
            let pseudo = name == START_NODE || name == END_NODE;
            let mut class = String::from("node");
            if pseudo {
                class.push_str(" pseudo");
            }
            if h.current.contains(name) {
                class.push_str(" current");
            } else if h.visited.contains(name) {
                class.push_str(" visited");
            }
            let rx = if pseudo { BOX_H / 2.0 } else { 6.0 };
            let _ = write!(
                out,
                r#"<g class="{class}" data-node="{n}"><rect x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{bh:.1}" rx="{rx:.1}"/><text x="{tx:.1}" y="{ty:.1}" text-anchor="middle">{n}</text></g>"#,
                n = xml(name),
                x = lay.x[i],
                y = lay.y[i],
                w = lay.w[i],
                bh = BOX_H,
                tx = lay.x[i] + lay.w[i] / 2.0,
                ty = lay.y[i] + BOX_H / 2.0 + 4.5,
            );
        }
        out.push_str("</svg>\n");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edge(s: &str, t: &str, kind: EdgeKind, label: Option<&str>) -> DrawEdge {
        DrawEdge {
            source: s.into(),
            target: t.into(),
            label: label.map(str::to_string),
            kind,
        }
    }

    fn review() -> GraphDrawing {
        GraphDrawing {
            name: "review".into(),
            nodes: vec!["draft".into(), "check".into(), "publish".into()],
            edges: vec![
                edge(START_NODE, "draft", EdgeKind::Direct, None),
                edge("draft", "check", EdgeKind::Direct, None),
                edge("check", "draft", EdgeKind::Conditional, Some("revise")),
                edge("check", "publish", EdgeKind::Conditional, Some("ok")),
                edge("publish", END_NODE, EdgeKind::Direct, None),
            ],
        }
    }

    #[test]
    fn layers_follow_forward_edges_and_loops_go_back() {
        let lay = review().layout();
        let at = |n: &str| lay.names.iter().position(|x| x == n).unwrap();
        assert_eq!(lay.layer[at(START_NODE)], 0);
        assert_eq!(lay.layer[at("draft")], 1);
        assert_eq!(lay.layer[at("check")], 2);
        assert_eq!(lay.layer[at("publish")], 3);
        assert_eq!(lay.layer[at(END_NODE)], 4);
        assert!(lay.y[at("check")] > lay.y[at("draft")]);
    }

    #[test]
    fn svg_marks_current_visited_and_taken() {
        let d = review();
        let h = Highlight::from_steps(
            &d,
            &[vec!["draft".into()], vec!["check".into()]],
            &["publish".into()],
        );
        assert!(h.current.contains("publish"));
        assert!(h.visited.contains("draft") && h.visited.contains("check"));
        assert!(h.taken.contains(&("check".into(), "publish".into())));
        assert!(h.taken.contains(&(START_NODE.into(), "draft".into())));
        let svg = d.to_svg(Some(&h));
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.contains(r#"class="node current" data-node="publish""#));
        assert!(svg.contains(r#"class="node visited" data-node="check""#));
        assert!(svg.contains(
            r#"class="edge conditional taken" data-source="check" data-target="publish""#
        ));
        assert!(svg.contains(">revise</text>"));
    }

    #[test]
    fn names_are_escaped() {
        let d = GraphDrawing {
            name: "x".into(),
            nodes: vec!["a<b>&\"".into()],
            edges: vec![edge(START_NODE, "a<b>&\"", EdgeKind::Direct, None)],
        };
        let svg = d.to_svg(None);
        assert!(svg.contains("a&lt;b&gt;&amp;&quot;"));
        assert!(!svg.contains("a<b>"));
    }

    #[test]
    fn mermaid_and_json_have_every_edge() {
        let d = review();
        let m = d.to_mermaid(None);
        assert!(m.contains("check -. revise .-> draft"), "{m}");
        assert!(m.contains("publish --> __end__"));
        let j = d.to_langgraph_json();
        assert_eq!(j["nodes"].as_array().unwrap().len(), 5);
        assert_eq!(j["edges"].as_array().unwrap().len(), 5);
        assert_eq!(j["edges"][2]["conditional"], true);
        assert_eq!(j["edges"][2]["data"], "revise");
        let h = Highlight::from_steps(&d, &[vec!["draft".into()]], &["check".into()]);
        assert!(d.to_mermaid(Some(&h)).contains("class check current"));
    }
}
