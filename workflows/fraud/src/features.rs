//! Per-transaction behavioural features, computed from the account's history before it.
//!
//! The same features drive the pattern rules (for the transaction under investigation), the
//! similarity search (as vectors, for every historical transaction) and the back-test of a
//! drafted rule (over the labelled history), so a rule is judged on exactly what it reads.

use super::dataset::{category, city_coords, distance_km, Dataset, Transaction, HIGH_RISK_MCCS};
use serde::{Deserialize, Serialize};

/// What is known about one transaction in the light of its account's history.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TxFeatures {
    /// Amount divided by the median of the account's previous 30 days (1 with no history).
    pub amount_ratio: f64,
    /// Median of the previous 30 days' amounts.
    pub median_amount: f64,
    /// Purchases by the account in the hour before.
    pub tx_last_1h: u32,
    /// Purchases in the 24 hours before.
    pub tx_last_24h: u32,
    /// Purchases under 5 EUR online in the hour before (card testing probes).
    pub small_online_last_1h: u32,
    /// Used outside the holder's home country.
    pub foreign: bool,
    /// Country not seen on the account in the previous 30 days.
    pub new_country: bool,
    /// Speed needed to get here from the previous card-present purchase, km/h (0 if none).
    pub travel_speed_kmh: f64,
    /// Distance from the previous card-present purchase, km.
    pub travel_km: f64,
    /// High-risk category the holder does not usually buy from.
    pub high_risk_category: bool,
    /// Acquirer's risk score of the merchant.
    pub merchant_risk: f64,
    /// Between midnight and 5 am.
    pub night: bool,
    /// Card not present.
    pub online: bool,
    /// A round amount of 500 or more.
    pub round_amount: bool,
    /// A merchant the account never used before.
    pub new_merchant: bool,
}

impl TxFeatures {
    /// The features as a vector for nearest-neighbour search (each dimension scaled to about
    /// 0..1, so no single one dominates the distance).
    pub fn vector(&self) -> Vec<f32> {
        let b = |x: bool| if x { 1.0 } else { 0.0 };
        vec![
            (self.amount_ratio.max(1e-3).ln() / 3.0).clamp(-1.0, 1.5) as f32,
            (f64::from(self.tx_last_1h) / 5.0).min(1.5) as f32,
            (f64::from(self.small_online_last_1h) / 4.0).min(1.5) as f32,
            b(self.foreign),
            b(self.new_country),
            (self.travel_speed_kmh / 1000.0).min(1.5) as f32,
            b(self.high_risk_category),
            self.merchant_risk as f32,
            b(self.night),
            b(self.online),
            b(self.round_amount),
            b(self.new_merchant),
            (f64::from(self.tx_last_24h) / 10.0).min(1.5) as f32,
        ]
    }
}

/// Number of dimensions of [`TxFeatures::vector`].
pub const FEATURE_DIM: usize = 13;

/// Features of `t` from its account's earlier transactions.
pub fn features(ds: &Dataset, t: &Transaction) -> TxFeatures {
    let hist = ds.history_before(&t.account_id, t.ts_ms);
    let account = ds.account(&t.account_id);
    let merchant = ds.merchant(&t.merchant_id);
    let day = 86_400_000;
    let recent: Vec<&&Transaction> = hist
        .iter()
        .filter(|h| t.ts_ms - h.ts_ms <= 30 * day)
        .collect();
    let mut amounts: Vec<f64> = recent.iter().map(|h| h.amount).collect();
    amounts.sort_by(f64::total_cmp);
    let median = if amounts.is_empty() {
        account.map_or(t.amount, |a| a.typical_amount)
    } else {
        amounts[amounts.len() / 2]
    };
    let last_1h: Vec<&&Transaction> = hist
        .iter()
        .filter(|h| t.ts_ms - h.ts_ms <= 3_600_000)
        .collect();
    let tx_last_24h = hist.iter().filter(|h| t.ts_ms - h.ts_ms <= day).count() as u32;
    let small_online = last_1h
        .iter()
        .filter(|h| h.amount < 5.0 && h.channel == "online")
        .count() as u32;
    let home = account.map(|a| a.home_country.as_str()).unwrap_or("");
    let foreign = !home.is_empty() && t.country != home;
    let new_country = foreign && !recent.iter().any(|h| h.country == t.country);
    let (mut speed, mut km) = (0.0, 0.0);
    if t.channel != "online" {
        if let Some(prev) = hist.iter().rev().find(|h| h.channel != "online") {
            if let (Some(a), Some(b)) = (city_coords(&prev.city), city_coords(&t.city)) {
                km = distance_km(a, b);
                let hours = ((t.ts_ms - prev.ts_ms) as f64 / 3_600_000.0).max(0.05);
                speed = km / hours;
            }
        }
    }
    let usual = account
        .map(|a| a.usual_mccs.contains(&t.mcc))
        .unwrap_or(false);
    let high_risk_category = HIGH_RISK_MCCS.contains(&t.mcc) && !usual;
    let hour = (t.ts_ms.rem_euclid(day)) / 3_600_000;
    TxFeatures {
        amount_ratio: t.amount / median.max(0.01),
        median_amount: median,
        tx_last_1h: last_1h.len() as u32,
        tx_last_24h,
        small_online_last_1h: small_online,
        foreign,
        new_country,
        travel_speed_kmh: speed,
        travel_km: km,
        high_risk_category,
        merchant_risk: merchant.map_or_else(|| category(t.mcc).map_or(0.1, |c| c.2), |m| m.risk),
        night: hour < 5,
        online: t.channel == "online",
        round_amount: t.amount >= 500.0 && (t.amount % 100.0).abs() < 1e-9,
        new_merchant: !hist.iter().any(|h| h.merchant_id == t.merchant_id),
    }
}

/// Features of every transaction of the dataset, in dataset order.
pub fn all_features(ds: &Dataset) -> Vec<TxFeatures> {
    ds.transactions.iter().map(|t| features(ds, t)).collect()
}
