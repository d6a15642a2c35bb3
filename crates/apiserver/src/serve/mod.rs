//! The connection loop's parts that know no resource: the request [`guard`] (size limits,
//! timeout, in-flight limit), HTTP/2 stream [`fairness`] and the [`batch`]ing of what one turn
//! of a connection writes.

pub mod batch;
pub mod fairness;
pub mod guard;
