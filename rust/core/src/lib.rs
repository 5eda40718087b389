//! The interpreter-free core of fastpjit: which slice of a global array each device holds.
//!
//! Every sharding that JAX knows (a `NamedSharding` over a mesh, a GSPMD `HloSharding`, a
//! single device) reduces to a [`TileLayout`]; [`IndexMap`] turns a layout and a global shape
//! into per-device bounds. Nothing here touches Python, so all of it is tested with `cargo test`.

pub mod bounded;
pub mod delegation;
pub mod dispatch;
pub mod error;
pub mod fallback;
mod hlo_lexer;
mod hlo_parser;
pub mod hlo_sharding;
pub mod host_pool;
pub mod index_map;
pub mod kept_values;
pub mod mesh;
pub mod module_precheck;
pub mod process_local;
pub mod stats;
pub mod strided;
pub mod tile;
pub mod timing;
pub mod transfer;

pub use bounded::{BoundedMap, ForgetAll, Forgotten, LeastRecent, Recency, UseStamp};
pub use delegation::{Copied, Delegation, Handover, HitInputs};
pub use error::ShardingError;
pub use fallback::{Fallback, Whole, Why};
pub use hlo_sharding::HloSharding;
pub use index_map::IndexMap;
pub use kept_values::{KeptValues, LatestCopy};
pub use mesh::{MeshAxes, NamedSpec};
pub use process_local::{local_blocks, process_block_counts, LocalDataError};
pub use tile::{DeviceOrder, TileLayout};
