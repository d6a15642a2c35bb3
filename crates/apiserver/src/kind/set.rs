//! The kinds a server serves: one [`KindSet`] per generation of what they are built from, and
//! [`LiveKinds`], the set in force, fixed or swapped at runtime by a [`KindSource`] (a server
//! whose kinds follow a reloaded configuration). The router, discovery and OpenAPI read the set
//! in force on every request, so they never lag it.

use std::sync::Arc;

use super::{Kinds, ServedKind};

/// The kinds served under one generation, in discovery order.
#[derive(Default)]
pub struct KindSet {
    /// The generation the set was built for (0 for a fixed set).
    pub generation: u64,
    kinds: Kinds,
}

impl std::fmt::Debug for KindSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let plurals: Vec<&str> = self.kinds.iter().map(|k| k.info().plural.as_ref()).collect();
        f.debug_struct("KindSet").field("generation", &self.generation).field("kinds", &plurals).finish()
    }
}

impl KindSet {
    /// `kinds`, in discovery order, built for `generation`.
    pub fn new(generation: u64, kinds: Kinds) -> Self {
        Self { generation, kinds }
    }

    /// Every kind, in discovery order.
    pub fn kinds(&self) -> &Kinds {
        &self.kinds
    }

    /// The kind served as `plural` under `group`/`version`.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<&Arc<dyn ServedKind>> {
        self.kinds.iter().find(|k| {
            let info = k.info();
            info.plural == plural && info.gv.group == group && info.gv.version == version
        })
    }
}

/// Kinds that change at runtime: [`KindSource::current`] is asked on every request and
/// returns the set in force (cheaply: a new set only when its generation moved).
pub trait KindSource: Send + Sync + std::fmt::Debug {
    /// The set in force. Generations only grow.
    fn current(&self) -> Arc<KindSet>;
}

/// The kinds in force: a fixed set, or the set of a [`KindSource`].
#[derive(Debug, Clone)]
pub enum LiveKinds {
    /// A set no configuration changes.
    Fixed(Arc<KindSet>),
    /// A set that follows its source.
    Live(Arc<dyn KindSource>),
}

impl From<Kinds> for LiveKinds {
    fn from(kinds: Kinds) -> Self {
        Self::fixed(kinds)
    }
}

impl LiveKinds {
    /// A fixed set of kinds (see also the `From<Kinds>` conversion).
    pub fn fixed(kinds: Kinds) -> Self {
        Self::Fixed(Arc::new(KindSet::new(0, kinds)))
    }

    /// The kinds of `source`, followed.
    pub fn live(source: Arc<dyn KindSource>) -> Self {
        Self::Live(source)
    }

    /// The kinds in force.
    pub fn current(&self) -> Arc<KindSet> {
        match self {
            Self::Fixed(set) => set.clone(),
            Self::Live(source) => source.current(),
        }
    }
}
