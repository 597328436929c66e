//! The Prometheus registry each process registers its metrics into:
//! prometheus's own, which also keeps the name of every family registered.
//!
//! An exposition (`gather`) lists only the families that have a series, so
//! a labelled family whose labels were never used is seen by no scrape;
//! [`Registry::family_names`] lists them all, for the test that keeps the
//! names of both processes apart under OpenMetrics (where a counter's
//! family drops `_total`, and `_count`, `_sum`, `_bucket` and `_created`
//! name the series of a family).

use std::sync::{Arc, Mutex, PoisonError};

use prometheus::core::Collector;
use prometheus::proto::MetricFamily;

/// A [`prometheus::Registry`] that remembers its families' names.
#[derive(Clone, Debug)]
pub struct Registry {
    inner: prometheus::Registry,
    /// Prepended (with `_`) to every family name by `gather`.
    prefix: String,
    /// Every family registered, as scraped (prefix included).
    names: Arc<Mutex<Vec<String>>>,
}

impl Registry {
    /// An empty registry whose families are named `<prefix>_<name>`.
    ///
    /// # Errors
    /// An empty prefix.
    pub fn with_prefix(prefix: &str) -> prometheus::Result<Self> {
        let inner = prometheus::Registry::new_custom(Some(prefix.to_owned()), None)?;
        Ok(Self {
            inner,
            prefix: prefix.to_owned(),
            names: Arc::default(),
        })
    }

    /// Registers a collector, as [`prometheus::Registry::register`].
    ///
    /// # Errors
    /// A name registered already, or registered with other labels or help.
    pub fn register(&self, collector: Box<dyn Collector>) -> prometheus::Result<()> {
        let names: Vec<String> = collector
            .desc()
            .iter()
            .map(|d| format!("{}_{}", self.prefix, d.fq_name))
            .collect();
        self.inner.register(collector)?;
        self.names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(names);
        Ok(())
    }

    /// Every family with a series, as a scrape shows them.
    pub fn gather(&self) -> Vec<MetricFamily> {
        self.inner.gather()
    }

    /// The names of every family registered, with or without a series,
    /// sorted.
    pub fn family_names(&self) -> Vec<String> {
        let mut names = self
            .names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        names.sort();
        names
    }
}

#[cfg(test)]
mod tests {
    use prometheus::{IntCounter, IntCounterVec, Opts};

    use super::*;

    #[test]
    fn family_names_include_families_no_scrape_shows_yet() {
        let registry = Registry::with_prefix("fg").unwrap();
        registry
            .register(Box::new(IntCounter::new("a_total", "a").unwrap()))
            .unwrap();
        let unused = IntCounterVec::new(Opts::new("b_total", "b"), &["kind"]).unwrap();
        registry.register(Box::new(unused)).unwrap();
        assert_eq!(
            registry
                .gather()
                .iter()
                .map(|f| f.name().to_owned())
                .collect::<Vec<_>>(),
            ["fg_a_total"]
        );
        assert_eq!(registry.family_names(), ["fg_a_total", "fg_b_total"]);
        assert!(
            registry
                .register(Box::new(IntCounter::new("a_total", "a").unwrap()))
                .is_err(),
            "a name is taken once"
        );
        assert_eq!(registry.family_names().len(), 2);
    }
}
