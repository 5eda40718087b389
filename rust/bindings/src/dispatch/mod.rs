//! The jit dispatcher: a call goes straight into Rust, which keys it by its call signature,
//! finds the cache entry and runs its executable; only a cache miss, or a call that JAX must
//! run, runs Python. The decisions (the route, the cache, the signature's hash) are the core's
//! (`fastpjit_core::dispatch`); these files read Python objects into them and act through
//! jaxlib.
//!
//! - `function`: the jit function, which reads a call, routes it and acts on the route.
//! - `shared`: the cache that the functions of one Python function and options share.
//! - `bound`: a function with resident arguments bound, and its direct path.
//! - `context`: JAX's jit key (trace context, trace state, ...), read on every call.
//! - `tree`, `leaf`: a call flattened in JAX's order, and each leaf as the signature sees it.
//! - `signature`: the call signature, compared by identity first and by value on a miss.
//! - `describe`: a signature in words, item by item, for `explain` and warm starts.
//! - `entry`: a cached executable and how each argument becomes its input.
//! - `miss`: the typed contract with the cache miss that Python runs.

mod bound;
mod context;
mod describe;
mod entry;
mod function;
mod leaf;
mod miss;
mod shared;
mod signature;
mod tree;

pub use bound::BoundFunction;
pub use function::JitFunction;
pub use leaf::{clear_dispatch_memo, dispatch_memo_sizes};
pub use miss::{CacheMiss, FastPath};
pub use shared::DispatchCache;
