//! The dataset as the tools see it: rows, per-transaction features, and a nearest-neighbour
//! index over the features of the settled history.

use super::dataset::{Dataset, DatasetError, DEFAULT_SEED};
use super::features::{all_features, TxFeatures};
use super::tools::pattern_rules;
use ferrograph_tools::ToolError;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A similar historical transaction.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Neighbour {
    /// Transaction id.
    pub transaction_id: String,
    /// Similarity, 0..1 (1 = identical behaviour).
    pub similarity: f32,
    /// Confirmed fraud pattern, if it was fraud.
    pub fraud_label: Option<String>,
    /// Amount.
    pub amount: f64,
    /// Category.
    pub mcc: u16,
}

/// Result of back-testing a drafted rule on the labelled history.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Backtest {
    /// Settled transactions evaluated.
    pub evaluated: usize,
    /// Transactions the rule flags.
    pub flagged: usize,
    /// Flagged and confirmed fraud.
    pub true_positives: usize,
    /// Confirmed fraud in the history.
    pub fraud_total: usize,
    /// true_positives / flagged.
    pub precision: f64,
    /// true_positives / fraud_total.
    pub recall: f64,
}

/// Dataset, features and similarity index, loaded once per folder and shared.
pub struct FraudData {
    /// The rows.
    pub dataset: Dataset,
    /// Features, in dataset order.
    pub features: Vec<TxFeatures>,
    /// Where it was loaded from.
    pub dir: PathBuf,
    index: super::similarity::SimilarityIndex,
}

impl std::fmt::Debug for FraudData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FraudData").field("dir", &self.dir).finish()
    }
}

fn cache() -> &'static Mutex<HashMap<PathBuf, Arc<FraudData>>> {
    static CACHE: std::sync::OnceLock<Mutex<HashMap<PathBuf, Arc<FraudData>>>> =
        std::sync::OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

impl FraudData {
    /// Loads (or generates, when the folder holds no dataset) `dir`, once per process.
    pub fn open(dir: &Path) -> Result<Arc<FraudData>, DatasetError> {
        let key = dir.to_path_buf();
        // Held while loading: two workflows opening the same folder at once must not both
        // generate the dataset or build its similarity index in the same place.
        let mut cache = match cache().lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(d) = cache.get(&key) {
            return Ok(d.clone());
        }
        let dataset = Dataset::load_or_generate(dir, DEFAULT_SEED)?;
        let features = all_features(&dataset);
        let index = super::similarity::SimilarityIndex::build(dir, &dataset, &features)?;
        let data = Arc::new(FraudData {
            dataset,
            features,
            dir: key.clone(),
            index,
        });
        cache.insert(key, data.clone());
        Ok(data)
    }

    /// Features of a transaction.
    pub fn features_of(&self, id: &str) -> Option<&TxFeatures> {
        self.dataset.position(id).map(|i| &self.features[i])
    }

    /// The `k` settled transactions before `before_ms` most similar to `vector`; `exact`
    /// scans them all instead of searching the index.
    pub fn similar(
        &self,
        vector: &[f32],
        k: usize,
        before_ms: i64,
        exact: bool,
    ) -> Result<Vec<Neighbour>, ToolError> {
        let hits = if exact {
            self.index.exact(vector, k, before_ms)
        } else {
            self.index.search(&self.dataset, vector, k, before_ms)?
        };
        Ok(hits
            .into_iter()
            .filter_map(|(i, sim)| {
                let t = self.dataset.transactions.get(i)?;
                Some(Neighbour {
                    transaction_id: t.id.clone(),
                    similarity: sim,
                    fraud_label: t.fraud_label.clone(),
                    amount: t.amount,
                    mcc: t.mcc,
                })
            })
            .collect())
    }

    /// Back-tests the conjunction of `rules` (pattern rule names) on the settled history.
    pub fn backtest(&self, rules: &[String]) -> Backtest {
        let mut bt = Backtest {
            evaluated: 0,
            flagged: 0,
            true_positives: 0,
            fraud_total: 0,
            precision: 0.0,
            recall: 0.0,
        };
        for (t, f) in self.dataset.transactions.iter().zip(&self.features) {
            if t.status != "settled" {
                continue;
            }
            bt.evaluated += 1;
            let fraud = t.fraud_label.is_some();
            bt.fraud_total += usize::from(fraud);
            let fired = pattern_rules(f);
            if rules.iter().all(|r| fired.iter().any(|h| &h.rule == r)) {
                bt.flagged += 1;
                bt.true_positives += usize::from(fraud);
            }
        }
        bt.precision = if bt.flagged == 0 {
            0.0
        } else {
            bt.true_positives as f64 / bt.flagged as f64
        };
        bt.recall = if bt.fraud_total == 0 {
            0.0
        } else {
            bt.true_positives as f64 / bt.fraud_total as f64
        };
        bt
    }
}
