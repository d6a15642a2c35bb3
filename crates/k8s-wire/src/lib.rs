//! Kubernetes wire types shared by every layer above: `metav1.Status` errors ([`status`]),
//! `RequestInfo` and query parsing ([`request_info`]), label and field selectors
//! ([`selectors`]), name and label validation ([`validation`]), `Accept` negotiation
//! ([`negotiate`]), discovery resource types ([`discovery`]), `resource.Quantity` formatting
//! ([`quantity`]) and Go durations ([`duration`]).
//!
//! The bottom layer: it imports nothing else of the crate (`tests/architecture.rs`).

pub mod discovery;
pub mod duration;
pub mod negotiate;
pub mod quantity;
pub mod request_info;
pub mod selectors;
pub mod status;
pub mod validation;

pub use status::{ApiError, GroupResource};
