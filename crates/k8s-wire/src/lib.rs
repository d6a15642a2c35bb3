//! Kubernetes wire types shared by every layer above: `metav1.Status` errors ([`ApiError`]),
//! `RequestInfo` and query parsing ([`ParsedRequest`]), label and field selectors
//! ([`LabelSelector`], [`FieldSelector`]), name and label validation ([`is_dns1123_label`] and
//! its siblings), `Accept` negotiation ([`negotiate_headers`]), discovery resource types
//! ([`DiscoveryResource`]), `resource.Quantity` formatting
//! ([`quantity`]) and Go durations ([`duration`]).
//!
//! The bottom layer: it imports nothing else of the crate (`tests/architecture.rs`).

mod discovery;
pub mod duration;
mod negotiate;
pub mod quantity;
mod request_info;
mod selectors;
mod status;
mod validation;

// The modules are private; the crate's API is what the layers above use, re-exported here.
// `duration` and `quantity` stay modules: their functions are called through them
// (`duration::parse`, `quantity::parse`).
pub use discovery::{DiscoveryResource, GroupVersionResources};
pub use negotiate::{Endpoint, MetaVersion, Representation, accepts_json, negotiate_headers, not_acceptable};
pub use request_info::{
    ParsedRequest, QueryParams, RequestInfo, RequestInfoError, lower_case_method, percent_decode, split_path,
};
pub use selectors::{
    FIELD_NAMESPACE, FieldSelector, FieldTerm, InvalidValue, LabelSelector, Requirement, RequirementError,
    SelectorError, UnexpectedToken,
};
pub use status::{ApiError, GroupResource, go_quote};
pub use validation::{is_dns1123_label, is_dns1123_subdomain, is_qualified_name, is_valid_label_value};
