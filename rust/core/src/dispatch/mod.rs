//! The dispatcher's decisions over plain data: the call signature, the cache and its
//! single-compile protocol, and the arrays a function remembers. The bindings read Python
//! objects into these types and act through jaxlib; only the caller compares what Python
//! must compare, so these are generic over such handles.

pub mod bound;
pub mod cache;
pub mod describe;
pub mod memo;
pub mod plan;
pub mod route;
pub mod seen;
pub mod signature;
pub mod tree;

/// How deep the dispatcher reads nested containers: it reads trees by recursion, which must
/// not outrun a thread's stack where JAX's own flattening does not; deeper calls go to JAX.
pub const MAX_TREE_DEPTH: usize = 100;

/// How many states JAX's jit key may hold besides the trace context, the post-hook included:
/// the dispatcher keeps them inline.
pub const MAX_STATES: usize = 8;

pub use bound::{can_run, can_teach, BoundPath, Learning, LEARNING_CALLS};
pub use cache::{CacheEntry, Entry, EntryCache, Miss, MissState, RECENT};
pub use plan::{DonationClash, InputPlan};
pub use route::{Found, JaxDispatch, Route, Unkeyable};
pub use seen::{SeenArrays, SEEN_POSITIONS};
pub use signature::{
    has_leaf_shapes, ArgSignature, AvalValue, CallSignature, Descr, DtypeKey, HostKind, ScalarKind,
    ShardingId, SignatureHasher,
};
