//! The HNSW graph: a rebuildable cache of the vectors held in sled.
//!
//! hnsw_rs's sharp edges and what this module does about them:
//! - no delete: deleted ids stay in the graph as tombstones; searches skip them (in the
//!   hnsw filter and again on every result) and the graph is rebuilt when they pile up;
//! - filtered search may return ids failing the filter (hnsw_rs issue #27): the index
//!   re-checks every result;
//! - points may be orphaned on insert (#37): [`Graph::refresh_reachability`] walks layer 0
//!   from the top layer and records the points it cannot reach; searches score those
//!   exactly and merge them in;
//! - dumps are not fsynced: [`save`] dumps into a temporary folder, fsyncs every file and the
//!   folder, writes a header with the lengths and CRC32s of the files, and renames the folder
//!   into place; [`load_latest`] checks the header before handing the files to hnsw_rs;
//! - `DistCosine`/`DistDot` can panic on rounding: the graph uses
//!   [`DistUnitCosine`](crate::distance::DistUnitCosine), which never panics.

use crate::distance::DistUnitCosine;
use crate::error::{IndexError, Result};
use crate::view::{SearchView, ViewPoint};
use hnsw_rs::api::AnnT;
use hnsw_rs::hnsw::Hnsw;
use hnsw_rs::hnswio::HnswIo;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};

/// Layers hnsw_rs may use (its own maximum).
const MAX_LAYERS: usize = 16;
/// Version of the dump folder layout.
const DUMP_FORMAT: u32 = 1;
const BASENAME: &str = "hnsw";
const HEADER: &str = "header.json";

/// The graph and what the index knows about it.
pub(crate) struct Graph {
    pub(crate) hnsw: Hnsw<'static, f32, DistUnitCosine>,
    /// Every id inserted (live or tombstoned).
    pub(crate) ids: HashSet<u64>,
    /// Ids in the graph whose chunk was deleted.
    pub(crate) dead: usize,
    /// Points a search from the top layer cannot reach.
    pub(crate) orphans: Vec<u64>,
    /// The searchable copy, rebuilt with the orphans after every change.
    view: SearchView,
    /// Points in the graph when the view was built.
    view_points: usize,
}

impl Graph {
    pub(crate) fn new(m: usize, ef_construction: usize, capacity: usize) -> Graph {
        let hnsw = Hnsw::new(
            m.clamp(2, 255),
            capacity.max(1024),
            MAX_LAYERS,
            ef_construction.max(m),
            DistUnitCosine,
        );
        Graph {
            hnsw,
            ids: HashSet::new(),
            dead: 0,
            orphans: Vec::new(),
            view: SearchView::default(),
            view_points: usize::MAX,
        }
    }

    /// Inserts points (parallel when there are many).
    pub(crate) fn insert(&mut self, points: &[(&[f32], u64)]) -> Result<()> {
        let mut batch = Vec::with_capacity(points.len());
        for (v, id) in points {
            let did = usize::try_from(*id)
                .map_err(|_| IndexError::Invalid(format!("id {id} does not fit usize")))?;
            if self.ids.insert(*id) {
                batch.push((*v, did));
            }
        }
        if batch.len() >= 64 {
            self.hnsw.parallel_insert_slice(&batch);
        } else {
            for p in batch {
                self.hnsw.insert_slice(p);
            }
        }
        Ok(())
    }

    /// Ids of the `k` nearest points passing `keep` (all when `None`), from the search view
    /// when it is current, else from hnsw_rs.
    pub(crate) fn search(
        &self,
        q: &[f32],
        k: usize,
        ef: usize,
        keep: Option<&dyn Fn(u64) -> bool>,
    ) -> Vec<u64> {
        if self.ids.is_empty() || k == 0 {
            return Vec::new();
        }
        if self.view_points == self.hnsw.get_nb_point() && self.view.len() == self.view_points {
            return self.view.search(q, k, ef.max(k), keep);
        }
        let neigh = match keep {
            Some(f) => {
                let filter = |d: &usize| f(*d as u64);
                self.hnsw.search_filter(q, k, ef.max(k), Some(&filter))
            }
            None => self.hnsw.search(q, k, ef.max(k)),
        };
        neigh.iter().map(|n| n.d_id as u64).collect()
    }

    /// Recomputes the orphans: points not reachable over layer-0 edges from the top layer.
    /// Returns the ids present in the graph.
    pub(crate) fn refresh_reachability(&mut self) -> HashSet<u64> {
        // hnsw_rs's point iterator panics on an empty graph (no entry point).
        if self.hnsw.get_nb_point() == 0 {
            self.orphans.clear();
            return HashSet::new();
        }
        let pi = self.hnsw.get_point_indexation();
        let mut adj: HashMap<usize, Vec<usize>> = HashMap::with_capacity(self.ids.len());
        let mut view_points = Vec::with_capacity(self.ids.len());
        for p in pi {
            let layers = p.get_neighborhood_id();
            let l0 = layers
                .first()
                .map(|l| l.iter().map(|n| n.d_id).collect())
                .unwrap_or_default();
            adj.insert(p.get_origin_id(), l0);
            view_points.push((p.get_origin_id() as u64, p.get_v().to_vec(), layers));
        }
        let top = self.hnsw.get_max_level_observed() as usize;
        let entry = pi
            .get_layer_iterator(top)
            .map(|p| p.get_origin_id() as u64)
            .next();
        let dim = view_points.first().map_or(0, |p| p.1.len());
        let points = view_points
            .iter()
            .map(|(id, v, layers)| ViewPoint {
                id: *id,
                vector: v,
                layers: layers
                    .iter()
                    .map(|l| l.iter().map(|n| n.d_id as u64).collect())
                    .collect(),
            })
            .collect();
        self.view = SearchView::build(dim, points, entry);
        self.view_points = self.hnsw.get_nb_point();
        let mut seen: HashSet<usize> = HashSet::with_capacity(adj.len());
        let mut stack: Vec<usize> = pi
            .get_layer_iterator(top)
            .map(|p| p.get_origin_id())
            .collect();
        for s in &stack {
            seen.insert(*s);
        }
        while let Some(x) = stack.pop() {
            if let Some(ns) = adj.get(&x) {
                for n in ns {
                    if seen.insert(*n) {
                        stack.push(*n);
                    }
                }
            }
        }
        let present: HashSet<u64> = adj.keys().map(|k| *k as u64).collect();
        self.orphans = present
            .iter()
            .filter(|id| !seen.contains(&(**id as usize)))
            .copied()
            .collect();
        self.orphans.sort_unstable();
        present
    }
}

/// What is written beside the hnsw_rs files.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct DumpHeader {
    pub(crate) format: u32,
    /// The store generation the graph reflects.
    pub(crate) generation: u64,
    /// Next id at dump time: every id below it that is live was in the graph.
    pub(crate) next_id: u64,
    pub(crate) points: usize,
    pub(crate) dim: usize,
    pub(crate) graph_len: u64,
    pub(crate) graph_crc: u32,
    pub(crate) data_len: u64,
    pub(crate) data_crc: u32,
}

fn file_crc(path: &Path) -> Result<(u64, u32)> {
    let mut f = std::fs::File::open(path).map_err(|e| IndexError::io(path, e))?;
    let mut h = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut len = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(|e| IndexError::io(path, e))?;
        if n == 0 {
            break;
        }
        len += n as u64;
        h.update(&buf[..n]);
    }
    Ok((len, h.finalize()))
}

fn fsync_path(path: &Path) -> Result<()> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| IndexError::io(path, e))
}

fn dump_dir_name(generation: u64) -> String {
    format!("graph-{generation:020}")
}

/// Writes the graph as `<dir>/graph-<generation>/` (temp folder, fsync, rename) and removes
/// older dumps.
pub(crate) fn save(
    dir: &Path,
    graph: &Graph,
    generation: u64,
    next_id: u64,
    dim: usize,
) -> Result<()> {
    let tmp = dir.join(format!(
        "graph-tmp-{generation}-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| IndexError::io(&tmp, e))?;
    let result = (|| {
        let name = graph
            .hnsw
            .file_dump(&tmp, BASENAME)
            .map_err(|e| IndexError::io(&tmp, std::io::Error::other(e.to_string())))?;
        let gpath = tmp.join(format!("{name}.hnsw.graph"));
        let dpath = tmp.join(format!("{name}.hnsw.data"));
        if name != BASENAME {
            std::fs::rename(&gpath, tmp.join(format!("{BASENAME}.hnsw.graph")))
                .map_err(|e| IndexError::io(&gpath, e))?;
            std::fs::rename(&dpath, tmp.join(format!("{BASENAME}.hnsw.data")))
                .map_err(|e| IndexError::io(&dpath, e))?;
        }
        let gpath = tmp.join(format!("{BASENAME}.hnsw.graph"));
        let dpath = tmp.join(format!("{BASENAME}.hnsw.data"));
        fsync_path(&gpath)?;
        fsync_path(&dpath)?;
        let (graph_len, graph_crc) = file_crc(&gpath)?;
        let (data_len, data_crc) = file_crc(&dpath)?;
        let header = DumpHeader {
            format: DUMP_FORMAT,
            generation,
            next_id,
            points: graph.ids.len(),
            dim,
            graph_len,
            graph_crc,
            data_len,
            data_crc,
        };
        let hpath = tmp.join(HEADER);
        let text = serde_json::to_vec(&header).map_err(|e| IndexError::corrupt(&hpath, e))?;
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&hpath).map_err(|e| IndexError::io(&hpath, e))?;
            f.write_all(&text).map_err(|e| IndexError::io(&hpath, e))?;
            f.sync_all().map_err(|e| IndexError::io(&hpath, e))?;
        }
        fsync_path(&tmp)?;
        let dest = dir.join(dump_dir_name(generation));
        let _ = std::fs::remove_dir_all(&dest);
        std::fs::rename(&tmp, &dest).map_err(|e| IndexError::io(&dest, e))?;
        fsync_path(dir)?;
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
        return result;
    }
    // Older dumps are now useless.
    for (g, path) in list_dumps(dir) {
        if g != generation {
            let _ = std::fs::remove_dir_all(path);
        }
    }
    Ok(())
}

/// Dump folders, newest first; leftover temporary folders are removed.
fn list_dumps(dir: &Path) -> Vec<(u64, PathBuf)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("graph-tmp-") {
            let _ = std::fs::remove_dir_all(e.path());
        } else if let Some(g) = name.strip_prefix("graph-") {
            if let Ok(g) = g.parse::<u64>() {
                out.push((g, e.path()));
            }
        }
    }
    out.sort_by_key(|x| std::cmp::Reverse(x.0));
    out
}

/// Loads the newest valid dump whose generation is at most `max_generation`. Returns why
/// none could be used otherwise.
pub(crate) fn load_latest(
    dir: &Path,
    max_generation: u64,
    dim: usize,
    m: usize,
    ef_construction: usize,
) -> std::result::Result<(DumpHeader, Graph), String> {
    let dumps = list_dumps(dir);
    if dumps.is_empty() {
        return Err("no graph dump".into());
    }
    let mut reasons = Vec::new();
    for (g, path) in dumps {
        if g > max_generation {
            reasons.push(format!("{}: newer than the store", path.display()));
            continue;
        }
        match load_one(&path, dim) {
            Ok((h, hnsw)) => {
                let mut graph = Graph {
                    hnsw,
                    ids: HashSet::new(),
                    dead: 0,
                    orphans: Vec::new(),
                    view: SearchView::default(),
                    view_points: usize::MAX,
                };
                let _ = (m, ef_construction);
                graph.hnsw.set_extend_candidates(false);
                graph.ids = graph.refresh_reachability();
                if graph.ids.len() != h.points {
                    reasons.push(format!(
                        "{}: {} points, header says {}",
                        path.display(),
                        graph.ids.len(),
                        h.points
                    ));
                    continue;
                }
                return Ok((h, graph));
            }
            Err(e) => reasons.push(format!("{}: {e}", path.display())),
        }
    }
    Err(reasons.join("; "))
}

fn load_one(
    path: &Path,
    dim: usize,
) -> std::result::Result<(DumpHeader, Hnsw<'static, f32, DistUnitCosine>), String> {
    let hpath = path.join(HEADER);
    let text = std::fs::read(&hpath).map_err(|e| format!("header: {e}"))?;
    let h: DumpHeader = serde_json::from_slice(&text).map_err(|e| format!("header: {e}"))?;
    if h.format != DUMP_FORMAT {
        return Err(format!("dump format {} (expected {DUMP_FORMAT})", h.format));
    }
    if h.dim != dim {
        return Err(format!("dimension {} (expected {dim})", h.dim));
    }
    let gpath = path.join(format!("{BASENAME}.hnsw.graph"));
    let dpath = path.join(format!("{BASENAME}.hnsw.data"));
    let (gl, gc) = file_crc(&gpath).map_err(|e| e.to_string())?;
    let (dl, dc) = file_crc(&dpath).map_err(|e| e.to_string())?;
    if (gl, gc, dl, dc) != (h.graph_len, h.graph_crc, h.data_len, h.data_crc) {
        return Err("file lengths or checksums differ from the header".into());
    }
    if h.points == 0 {
        return Err("empty graph".into());
    }
    // hnsw_rs ties the graph's lifetime to its loader; the loader holds only paths and
    // options here (no mmap), so it is leaked: a few hundred bytes per load.
    let io: &'static HnswIo = Box::leak(Box::new(HnswIo::new(path, BASENAME)));
    let loaded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        io.load_hnsw_with_dist::<f32, DistUnitCosine>(DistUnitCosine)
    }));
    match loaded {
        Ok(Ok(hnsw)) => {
            if hnsw.get_nb_point() != h.points {
                return Err(format!(
                    "{} points loaded, header says {}",
                    hnsw.get_nb_point(),
                    h.points
                ));
            }
            Ok((h, hnsw))
        }
        Ok(Err(e)) => Err(format!("hnsw_rs could not load it: {e}")),
        Err(_) => Err("hnsw_rs panicked loading it".into()),
    }
}

/// fsyncs a folder (so a rename or a new file in it is durable).
pub(crate) fn fsync_dir(dir: &Path) -> Result<()> {
    fsync_path(dir)
}
