//! The opt-in metric APIs for the HorizontalPodAutoscaler, one core and two thin modules of
//! routes and wire types:
//!
//! - [`external`]: `external.metrics.k8s.io/v1beta1` (`--enable-external-metrics`);
//! - [`custom`]: `custom.metrics.k8s.io` `v1beta2` and `v1beta1` (`--enable-custom-metrics`);
//! - [`core`]: errors and their Status wording, the request's checks, selector → matchers (the
//!   adapter's one mapping), the checks of the `--config` file's metrics, discovery entries;
//! - [`provider`]: the [`Provider`] trait and its two implementations, the `--config` file's
//!   metrics and the `--adapter-config` file's rules, and the [`Backend`] both APIs hold (the
//!   providers, Prometheus, the query cache with single flight).
//!
//! `metrics.k8s.io` is not here: it is two served kinds (`kinds::resource_metrics`) that take
//! their Tables, selectors and cache from the kinds machinery, as every other kind does.

pub(crate) mod core;
pub(crate) mod custom;
pub(crate) mod external;
pub(crate) mod provider;

#[cfg(test)]
mod custom_tests;
#[cfg(test)]
mod external_tests;
#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
pub(crate) mod testutil;
