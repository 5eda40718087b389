//! Host↔device transfer plans as plain data: the distinct tiles that a set of devices holds,
//! how a put hands a host array's tiles to the runtime, and which holder a get reads each from.

use rustc_hash::FxHashMap;

use crate::strided::{scatter, CopyError, StridedView};

/// Bytes from which a put to host-memory devices is staged (see [`PutMethod::Stage`]).
pub const STAGE_BYTES: usize = 1 << 20;

/// The alignment at which the runtime adopts a host buffer instead of copying it.
pub const ADOPT_ALIGN: usize = 64;

/// The distinct tiles that a list of devices holds: devices that hold one tile hold equal data,
/// which a put copies and a get reads once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistinctTiles {
    /// The bounds (`[start, stop)` per dimension) of each distinct tile, in the order of their
    /// first holders.
    pub bounds: Vec<Vec<(usize, usize)>>,
    /// The position, in the device list, of each tile's first holder.
    pub first_holder: Vec<usize>,
    /// The distinct tile that each device holds.
    pub tile_of_device: Vec<usize>,
}

impl DistinctTiles {
    /// The tiles of `devices`, each given as its tile's id (equal ids, equal data) and bounds.
    pub fn new<'a>(devices: impl IntoIterator<Item = (usize, &'a [(usize, usize)])>) -> Self {
        let mut tiles = Self {
            bounds: Vec::new(),
            first_holder: Vec::new(),
            tile_of_device: Vec::new(),
        };
        let mut seen: FxHashMap<usize, usize> = FxHashMap::default();
        for (position, (id, bounds)) in devices.into_iter().enumerate() {
            let distinct = *seen.entry(id).or_insert_with(|| {
                tiles.bounds.push(bounds.to_vec());
                tiles.first_holder.push(position);
                tiles.bounds.len() - 1
            });
            tiles.tile_of_device.push(distinct);
        }
        tiles
    }

    /// The number of distinct tiles.
    pub fn len(&self) -> usize {
        self.bounds.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bounds.is_empty()
    }

    /// Whether some devices hold the same tile.
    pub fn shared(&self) -> bool {
        self.len() < self.tile_of_device.len()
    }

    /// The shape of tile `tile`.
    pub fn shape(&self, tile: usize) -> Vec<usize> {
        self.bounds[tile]
            .iter()
            .map(|&(start, stop)| stop - start)
            .collect()
    }
}

/// A host array's memory as numpy describes it: where its first element lies, its shape, its
/// byte strides and its item size.
#[derive(Debug, Clone, Copy)]
pub struct HostLayout<'a> {
    pub address: usize,
    pub shape: &'a [usize],
    pub strides: &'a [isize],
    pub itemsize: usize,
}

impl HostLayout<'_> {
    pub fn nbytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.itemsize
    }

    /// Whether the array is C-ordered and dense, by numpy's rule: dimensions of one element
    /// have any stride, and an empty array is contiguous.
    pub fn is_c_contiguous(&self) -> bool {
        if self.shape.contains(&0) {
            return true;
        }
        let mut step = self.itemsize as isize;
        for (&size, &stride) in self.shape.iter().zip(self.strides).rev() {
            if size != 1 {
                if stride != step {
                    return false;
                }
                step *= size as isize;
            }
        }
        true
    }

    /// Where the block of `bounds` starts, in bytes from the array's first element.
    fn block_offset(&self, bounds: &[(usize, usize)]) -> isize {
        bounds
            .iter()
            .zip(self.strides)
            .map(|(&(start, _), &stride)| start as isize * stride)
            .sum()
    }
}

/// How a put hands a host array to the runtime's host-memory (CPU) devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutMethod {
    /// Copy each distinct tile once into buffers of our own, which the runtime adopts.
    Stage,
    /// Hand over each device's view of the array with zero-copy semantics: the runtime adopts
    /// aligned dense views and copies the rest.
    ZeroCopy,
    /// Hand over each device's view with copy semantics, which the runtime copies sooner.
    Copy,
}

/// The tiles of a put to host-memory devices, which decide how values are handed over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Staging {
    pub tiles: DistinctTiles,
    /// The shape of every device's shard.
    pub shard_shape: Vec<usize>,
}

impl Staging {
    /// How to put `array`, whose tiles from `pooled_bytes` up are staged in memory that earlier
    /// transfers have already faulted in.
    ///
    /// The runtime copies a tile once for every device that holds it, on one thread, into new
    /// memory; staging copies it once, with several threads. Where the runtime can adopt every
    /// tile as it is, it shares the array's memory, as `jax.device_put` does, and staging would
    /// only add a copy.
    pub fn method(&self, array: &HostLayout<'_>, pooled_bytes: usize) -> PutMethod {
        let adoptable = self.adoptable(array);
        let nbytes = array.nbytes();
        let tiles = self.tiles.len().max(1);
        let pays_off =
            nbytes >= STAGE_BYTES && (self.tiles.shared() || nbytes / tiles >= pooled_bytes);
        if pays_off && !adoptable {
            PutMethod::Stage
        } else if adoptable || !self.copyable(array) {
            PutMethod::ZeroCopy
        } else {
            PutMethod::Copy
        }
    }

    /// Whether the runtime can adopt every tile of `array` as it is: each one contiguous run
    /// of a C-ordered array, starting on an `ADOPT_ALIGN` boundary.
    pub fn adoptable(&self, array: &HostLayout<'_>) -> bool {
        if !array.is_c_contiguous() {
            return false;
        }
        self.tiles.bounds.iter().all(|bounds| {
            // Outside the innermost split dimension, a contiguous block spans one index.
            let mut split_seen = false;
            let contiguous = bounds
                .iter()
                .zip(array.shape)
                .rev()
                .all(|(&(start, stop), &size)| {
                    let ok = !split_seen || stop - start == 1;
                    split_seen |= stop - start != size;
                    ok
                });
            let start = array.address as isize + array.block_offset(bounds);
            contiguous && start.rem_euclid(ADOPT_ALIGN as isize) == 0
        })
    }

    /// Whether jaxlib 0.10.2 can be told to copy each device's view of `array`: it fails
    /// (`bad_function_call`) where two views start at one address, as the views of a tile that
    /// several devices hold do, or those of a broadcast array.
    pub fn copyable(&self, array: &HostLayout<'_>) -> bool {
        if self.tiles.shared() {
            return false;
        }
        let mut starts: Vec<isize> = self
            .tiles
            .bounds
            .iter()
            .map(|bounds| array.block_offset(bounds))
            .collect();
        starts.sort_unstable();
        starts.windows(2).all(|pair| pair[0] != pair[1])
    }

    /// Copies each distinct tile of the array that `view` describes over `src` into its
    /// buffer in `buffers` (C-ordered, of the shard's shape).
    pub fn stage(
        &self,
        src: &[u8],
        view: &StridedView,
        itemsize: usize,
        buffers: &mut [&mut [u8]],
        max_threads: usize,
    ) -> Result<(), CopyError> {
        scatter(
            src,
            view,
            itemsize,
            &self.tiles.bounds,
            buffers,
            max_threads,
        )
    }
}

/// Whether a Python int of value `value` (None: beyond 64 bits) fits a JAX integer dtype of
/// `bits` bits (int32, or int64 with x64), as JAX checks before it places one.
pub fn int_fits(value: Option<i64>, bits: usize) -> bool {
    value.is_some_and(|v| bits >= 64 || i32::try_from(v).is_ok())
}

/// Threads for large host copies: the machine's parallelism, read once (reading it costs
/// system calls).
pub fn copy_threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS
        .get_or_init(|| std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::index_map::IndexMap;
    use crate::tile::{DeviceOrder, TileLayout};

    const POOLED: usize = 1 << 20;

    fn tiles_of(map: &IndexMap) -> DistinctTiles {
        let bounds: Vec<Vec<(usize, usize)>> = (0..map.num_devices())
            .map(|d| map.device_bounds(d).collect())
            .collect();
        DistinctTiles::new(
            map.tile_of_device()
                .iter()
                .zip(&bounds)
                .map(|(&t, b)| (t, b.as_slice())),
        )
    }

    fn rows_map(rows: usize, cols: usize, parts: usize, replicas: usize) -> IndexMap {
        let layout = TileLayout::Tiled {
            partitions: vec![parts, 1],
            unreduced: 1,
            replicas,
            order: DeviceOrder::in_order(parts * replicas),
        };
        IndexMap::new(&layout, &[rows, cols], parts * replicas).unwrap()
    }

    fn c_layout<'a>(address: usize, shape: &'a [usize], strides: &'a [isize]) -> HostLayout<'a> {
        HostLayout {
            address,
            shape,
            strides,
            itemsize: 4,
        }
    }

    #[test]
    fn distinct_tiles_name_their_first_holder() {
        let b = |start| vec![(start, start + 1)];
        let tiles = DistinctTiles::new([
            (7, &b(0)[..]),
            (3, &b(1)[..]),
            (7, &b(0)[..]),
            (3, &b(1)[..]),
        ]);
        assert_eq!(tiles.first_holder, vec![0, 1]);
        assert_eq!(tiles.tile_of_device, vec![0, 1, 0, 1]);
        assert_eq!(tiles.bounds, vec![b(0), b(1)]);
        assert!(tiles.shared());
        assert_eq!(tiles.shape(1), vec![1]);
    }

    #[test]
    fn contiguity_follows_numpy() {
        assert!(c_layout(0, &[4, 3], &[12, 4]).is_c_contiguous());
        assert!(!c_layout(0, &[4, 3], &[4, 16]).is_c_contiguous());
        // A dimension of one element may have any stride; an empty array is contiguous.
        assert!(c_layout(0, &[1, 3], &[999, 4]).is_c_contiguous());
        assert!(c_layout(0, &[0, 3], &[4, 16]).is_c_contiguous());
    }

    #[test]
    fn aligned_row_blocks_are_adopted() {
        let map = rows_map(8192, 1024, 8, 1);
        let staging = Staging {
            tiles: tiles_of(&map),
            shard_shape: map.shard_shape().to_vec(),
        };
        let (shape, strides) = ([8192, 1024], [4096, 4]);
        assert_eq!(
            staging.method(&c_layout(1 << 12, &shape, &strides), POOLED),
            PutMethod::ZeroCopy
        );
        // 16 bytes past alignment, where malloc puts large arrays: 4 MiB tiles are staged.
        assert_eq!(
            staging.method(&c_layout((1 << 12) + 16, &shape, &strides), POOLED),
            PutMethod::Stage
        );
    }

    #[test]
    fn small_unaligned_puts_are_copied_unless_tiles_are_shared() {
        let map = rows_map(64, 4, 8, 1);
        let staging = Staging {
            tiles: tiles_of(&map),
            shard_shape: map.shard_shape().to_vec(),
        };
        let layout = c_layout(16, &[64, 4], &[16, 4]);
        assert_eq!(staging.method(&layout, POOLED), PutMethod::Copy);
        let replicated = rows_map(64, 4, 4, 2);
        let staging = Staging {
            tiles: tiles_of(&replicated),
            shard_shape: replicated.shard_shape().to_vec(),
        };
        assert_eq!(staging.method(&layout, POOLED), PutMethod::ZeroCopy);
    }

    #[test]
    fn a_broadcast_array_is_not_copyable() {
        let map = rows_map(8, 4, 8, 1);
        let staging = Staging {
            tiles: tiles_of(&map),
            shard_shape: map.shard_shape().to_vec(),
        };
        // Every row at one address (stride 0).
        assert!(!staging.copyable(&c_layout(16, &[8, 4], &[0, 4])));
        assert!(staging.copyable(&c_layout(16, &[8, 4], &[16, 4])));
    }

    #[test]
    fn column_blocks_are_not_adoptable() {
        let layout = TileLayout::Tiled {
            partitions: vec![1, 2],
            unreduced: 1,
            replicas: 1,
            order: DeviceOrder::in_order(2),
        };
        let map = IndexMap::new(&layout, &[4, 32], 2).unwrap();
        let staging = Staging {
            tiles: tiles_of(&map),
            shard_shape: map.shard_shape().to_vec(),
        };
        assert!(!staging.adoptable(&c_layout(0, &[4, 32], &[128, 4])));
    }

    #[test]
    fn staging_copies_each_tile() {
        let map = rows_map(4, 3, 2, 2);
        let staging = Staging {
            tiles: tiles_of(&map),
            shard_shape: map.shard_shape().to_vec(),
        };
        let src: Vec<u8> = (0..12u8).collect();
        let view = StridedView::contiguous(&[4, 3], 1);
        let mut a = [0u8; 6];
        let mut b = [0u8; 6];
        staging
            .stage(&src, &view, 1, &mut [&mut a, &mut b], 2)
            .unwrap();
        assert_eq!(a, [0, 1, 2, 3, 4, 5]);
        assert_eq!(b, [6, 7, 8, 9, 10, 11]);
    }

    /// A random tiled layout of 1 to 3 dimensions with replicas, and a shape it divides.
    fn layout_and_shape() -> impl Strategy<Value = (TileLayout, Vec<usize>, usize)> {
        (
            prop::collection::vec((1usize..4, 0usize..3), 1..4),
            1usize..4,
            any::<bool>(),
        )
            .prop_map(|(dims, replicas, reversed)| {
                let partitions: Vec<usize> = dims.iter().map(|&(p, _)| p).collect();
                let shape = dims.iter().map(|&(p, per)| p * per).collect();
                let total = partitions.iter().product::<usize>() * replicas;
                let mut list: Vec<usize> = (0..total).collect();
                if reversed {
                    list.reverse();
                }
                let layout = TileLayout::Tiled {
                    partitions,
                    unreduced: 1,
                    replicas,
                    order: DeviceOrder::Explicit(list),
                };
                (layout, shape, total)
            })
    }

    proptest! {
        /// Devices cover every element as often as there are replicas, and the distinct tiles,
        /// read from their first holders, cover it exactly once.
        #[test]
        fn tiles_cover_every_element_once_per_replica((layout, shape, devices) in layout_and_shape()) {
            let map = IndexMap::new(&layout, &shape, devices).unwrap();
            let tiles = tiles_of(&map);
            let replicas = devices / tiles.len();
            let size: usize = shape.iter().product();
            let index = |coords: &[usize]| coords.iter().zip(&shape).fold(0, |i, (&c, &n)| i * n + c);
            let count = |blocks: &mut dyn Iterator<Item = Vec<(usize, usize)>>| {
                let mut counts = vec![0usize; size];
                for bounds in blocks {
                    let mut coords: Vec<usize> = bounds.iter().map(|&(start, _)| start).collect();
                    if bounds.iter().any(|&(start, stop)| start == stop) {
                        continue;
                    }
                    'elements: loop {
                        counts[index(&coords)] += 1;
                        for axis in (0..coords.len()).rev() {
                            coords[axis] += 1;
                            if coords[axis] < bounds[axis].1 {
                                continue 'elements;
                            }
                            coords[axis] = bounds[axis].0;
                        }
                        break;
                    }
                }
                counts
            };
            let per_device = count(&mut (0..devices).map(|d| map.device_bounds(d).collect()));
            prop_assert!(per_device.iter().all(|&c| c == replicas));
            let distinct = count(&mut tiles.bounds.iter().cloned());
            prop_assert!(distinct.iter().all(|&c| c == 1));
            for (device, &tile) in tiles.tile_of_device.iter().enumerate() {
                prop_assert_eq!(&map.device_bounds(device).collect::<Vec<_>>(), &tiles.bounds[tile]);
                prop_assert_eq!(tiles.tile_of_device[tiles.first_holder[tile]], tile);
            }
        }

        /// Staged tiles hold the elements of their blocks, whatever the source's strides.
        #[test]
        fn staged_tiles_equal_their_blocks((layout, shape, devices) in layout_and_shape(), transposed in any::<bool>()) {
            let map = IndexMap::new(&layout, &shape, devices).unwrap();
            let staging = Staging { tiles: tiles_of(&map), shard_shape: map.shard_shape().to_vec() };
            let size: usize = shape.iter().product();
            let src: Vec<u8> = (0..size).map(|i| i as u8).collect();
            // The values laid out C-ordered, read through a view (reversed strides where
            // `transposed`, over the same bytes laid out in the opposite order).
            let mut view = StridedView::contiguous(&shape, 1);
            let mut data = src.clone();
            if transposed && size > 0 {
                view.strides.iter_mut().for_each(|s| *s = -*s);
                view.offset = size.saturating_sub(1);
                data.reverse();
            }
            let shard: usize = staging.shard_shape.iter().product();
            let mut buffers = vec![vec![0u8; shard]; staging.tiles.len()];
            let mut slices: Vec<&mut [u8]> = buffers.iter_mut().map(Vec::as_mut_slice).collect();
            staging.stage(&data, &view, 1, &mut slices, 2).unwrap();
            for (bounds, buffer) in staging.tiles.bounds.iter().zip(&buffers) {
                let block = StridedView::contiguous(&shape, 1).block(bounds).unwrap();
                let mut expected = vec![0u8; shard];
                crate::strided::copy(&src, &block, &mut expected, &StridedView::contiguous(&block.shape, 1), 1, 1).unwrap();
                prop_assert_eq!(buffer, &expected);
            }
        }
    }

    #[test]
    fn ints_fit_their_dtype_as_jax_checks() {
        assert!(int_fits(Some(i64::from(i32::MAX)), 32));
        assert!(!int_fits(Some(i64::from(i32::MAX) + 1), 32));
        assert!(int_fits(Some(i64::from(i32::MIN)), 32));
        assert!(!int_fits(Some(i64::from(i32::MIN) - 1), 32));
        assert!(int_fits(Some(i64::MAX), 64));
        // Beyond 64 bits, nothing holds it.
        assert!(!int_fits(None, 64));
    }

    #[test]
    fn there_is_at_least_one_copy_thread() {
        assert!(copy_threads() >= 1);
        assert_eq!(copy_threads(), copy_threads());
    }
}
