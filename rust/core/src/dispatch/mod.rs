//! The dispatcher's decisions over plain data: the call signature, the cache and its
//! single-compile protocol, and the arrays a function remembers. The bindings read Python
//! objects into these types and act through jaxlib; only the caller compares what Python
//! must compare, so these are generic over such handles.

pub mod bound;
pub mod cache;
pub mod plan;
pub mod seen;
pub mod signature;

pub use bound::{BoundPath, Learning, LEARNING_CALLS};
pub use cache::{CacheEntry, Entry, EntryCache, Miss, MissState, RECENT};
pub use plan::{DonationClash, InputPlan};
pub use seen::{SeenArrays, SEEN_POSITIONS};
pub use signature::{
    ArgSignature, AvalValue, CallSignature, Descr, DtypeKey, HostKind, ScalarKind, ShardingId,
    SignatureHasher,
};
