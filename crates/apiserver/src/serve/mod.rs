//! The serving loop and its parts, which know no resource: the [`listener`] (accept, bounds on
//! connections, TLS, HTTP/1.1 and HTTP/2, idle and write timeouts, graceful shutdown), the
//! request [`guard`] (size limits, timeout, in-flight limit), HTTP/2 stream [`fairness`], the
//! [`batch`]ing of what one turn of a connection writes and the bound on a peer that stops
//! reading ([`stall`]).

pub mod batch;
pub mod fairness;
pub mod guard;
pub mod listener;
pub mod stall;
