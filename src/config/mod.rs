//! Configuration: command-line flags ([`flags`]) and the query file with its live reload
//! ([`file`]), and how their YAML is read ([`yaml`]). A leaf: it knows the shapes of flags and file, not what the other modules make
//! of them. Every bad flag or file fails at start with a message naming the flag or field.

pub(crate) mod file;
pub(crate) mod flags;
pub use apiserver::yaml;

pub use file::{
    Aggregate, Check, ConfigError, CustomMetricConfig, DEFAULT_WINDOW, DeclaredFieldConfig,
    DeclaredKindConfig, Declares, ExternalMetricConfig, Invalid, LiveConfig, PodsJoinConfig, QueryFile,
    ResourceQueriesConfig, Snapshot,
};
pub use flags::{
    AdapterArgs, Args, AuthArgs, CacheArgs, ClusterArgs, KubeletArgs, MetricApisArgs, PrometheusArgs,
    PrometheusHeader, QueryArgs, ResourceSource, ServingArgs,
};
