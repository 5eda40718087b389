//! XLA's `HloSharding`, read from the text that HLO dumps print (`{devices=[4,2]<=[8]}`) and
//! written back in the same form, and the tile layout that JAX's index maps read from it.

use std::fmt;

use crate::error::ShardingError;
use crate::tile::{row_major_offsets, DeviceOrder, TileLayout};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubgroupType {
    Replicated,
    Manual,
    Maximal,
    Unreduced,
}

impl SubgroupType {
    fn name(self) -> &'static str {
        match self {
            Self::Replicated => "replicated",
            Self::Manual => "manual",
            Self::Maximal => "maximal",
            Self::Unreduced => "unreduced",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HloSharding {
    Replicated,
    Manual,
    Unknown,
    Unreduced,
    /// The whole array on one device of the assignment.
    Maximal {
        device: usize,
    },
    /// A tile grid `dims`; its last `subgroups.len()` dims are subgroups, not array dims.
    Tiled {
        dims: Vec<usize>,
        order: DeviceOrder,
        subgroups: Vec<SubgroupType>,
    },
    Tuple(Vec<HloSharding>),
    /// A sharding in a sharding group (`shard_as N` / `shard_like N`): a hint for XLA's
    /// propagation that does not change where data lives.
    Grouped {
        inner: Box<HloSharding>,
        shard_as: bool,
        group: usize,
    },
}

impl HloSharding {
    /// Parses the attribute text, e.g. `{devices=[2,1,4]<=[8] last_tile_dim_replicate}`, as
    /// XLA's parser does (see `hlo_parser.rs`).
    pub fn parse(text: &str) -> Result<Self, ShardingError> {
        crate::hlo_parser::parse(text)
    }

    /// The number of devices the sharding spans, where it says (tiled, maximal).
    pub fn num_tile_devices(&self) -> Option<usize> {
        match self {
            Self::Tiled { order, .. } => Some(order.len()),
            Self::Grouped { inner, .. } => inner.num_tile_devices(),
            _ => None,
        }
    }

    /// Checks that this is the sharding of one array over `num_devices` devices: not a tuple,
    /// a maximal device that exists, and a tile order that names each device exactly once.
    pub fn check_for_array(&self, num_devices: usize) -> Result<(), ShardingError> {
        if num_devices == 0 {
            return Err(ShardingError::Invalid(
                "a sharding needs at least one device".to_owned(),
            ));
        }
        match self {
            Self::Grouped { inner, .. } => inner.check_for_array(num_devices),
            Self::Tuple(_) => Err(ShardingError::Invalid(format!(
                "{self} is a tuple sharding, which describes several values, not one array"
            ))),
            Self::Maximal { device } if *device >= num_devices => Err(ShardingError::Invalid(
                format!("{self} names device {device}, but the device list has {num_devices}"),
            )),
            Self::Tiled { order, .. } => order.check_permutation(num_devices),
            _ => Ok(()),
        }
    }

    /// The tile layout that JAX derives for index maps of arrays of rank `ndim` over
    /// `num_devices` devices; errors where JAX has none.
    ///
    /// Unreduced subgroups are kept apart from replicated ones: their devices hold partial sums
    /// of a tile, not copies of it.
    pub fn to_layout(&self, ndim: usize, num_devices: usize) -> Result<TileLayout, ShardingError> {
        match self {
            Self::Grouped { inner, .. } => inner.to_layout(ndim, num_devices),
            Self::Replicated | Self::Maximal { .. } => Ok(TileLayout::Replicated),
            Self::Unreduced => Ok(TileLayout::Tiled {
                partitions: vec![1; ndim],
                unreduced: num_devices,
                replicas: 1,
                order: DeviceOrder::in_order(num_devices),
            }),
            Self::Tiled {
                dims,
                order,
                subgroups,
            } => tiled_layout(dims, order, subgroups),
            Self::Manual | Self::Unknown => Err(ShardingError::NoPlacement(format!(
                "the sharding {self} says nothing of where data lies, so it has no index map"
            ))),
            Self::Tuple(_) => Err(ShardingError::Unsupported(format!(
                "index maps of the tuple sharding {self} are not defined; a tuple sharding \
                 describes several values"
            ))),
        }
    }

    /// Whether some devices hold partial sums rather than data (XLA's `unreduced`).
    pub fn is_unreduced(&self) -> bool {
        match self {
            Self::Grouped { inner, .. } => inner.is_unreduced(),
            Self::Unreduced => true,
            Self::Tiled {
                dims, subgroups, ..
            } => subgroups
                .iter()
                .zip(&dims[dims.len() - subgroups.len()..])
                .any(|(&t, &size)| t == SubgroupType::Unreduced && size > 1),
            _ => false,
        }
    }
}

/// The layout of a tiled sharding whose last `subgroups.len()` grid dims are subgroups.
fn tiled_layout(
    dims: &[usize],
    order: &DeviceOrder,
    subgroups: &[SubgroupType],
) -> Result<TileLayout, ShardingError> {
    let (tile_dims, group_dims) = dims.split_at(dims.len() - subgroups.len());
    // A subgroup of one device changes nothing; XLA drops it when it normalizes.
    let groups: Vec<(SubgroupType, usize)> = subgroups
        .iter()
        .copied()
        .zip(group_dims.iter().copied())
        .filter(|&(_, size)| size > 1)
        .collect();
    if let Some((t, _)) = groups
        .iter()
        .find(|(t, _)| !matches!(t, SubgroupType::Replicated | SubgroupType::Unreduced))
    {
        return Err(ShardingError::Unsupported(format!(
            "index maps of a sharding with {} subgroups are not defined",
            t.name()
        )));
    }
    let size_of = |kind| -> usize {
        groups
            .iter()
            .filter(|(t, _)| *t == kind)
            .map(|(_, size)| size)
            .product()
    };
    let unreduced = size_of(SubgroupType::Unreduced);
    let replicas = size_of(SubgroupType::Replicated);
    // The layout's order lists a tile's unreduced members before their copies; where a
    // replicated subgroup comes first, the device order is transposed to match.
    let first_unreduced = groups.iter().position(|g| g.0 == SubgroupType::Unreduced);
    let order = match first_unreduced {
        Some(u) if groups[..u].iter().any(|g| g.0 == SubgroupType::Replicated) => {
            unreduced_first(order, tile_dims.iter().product(), &groups)
        }
        _ => order.clone(),
    };
    Ok(TileLayout::Tiled {
        partitions: tile_dims.to_vec(),
        unreduced,
        replicas,
        order,
    })
}

/// `order` over the grid `[tiles] ++ groups` with the unreduced groups moved ahead of the
/// replicated ones.
fn unreduced_first(
    order: &DeviceOrder,
    tiles: usize,
    groups: &[(SubgroupType, usize)],
) -> DeviceOrder {
    let mut sizes = vec![tiles];
    sizes.extend(groups.iter().map(|g| g.1));
    let mut strides = vec![1usize; sizes.len()];
    for axis in (0..sizes.len() - 1).rev() {
        strides[axis] = strides[axis + 1] * sizes[axis + 1];
    }
    let unreduced = |t: SubgroupType| t == SubgroupType::Unreduced;
    let axes: Vec<(usize, usize)> = std::iter::once(0)
        .chain(
            (0..groups.len())
                .filter(|&g| unreduced(groups[g].0))
                .map(|g| g + 1),
        )
        .chain(
            (0..groups.len())
                .filter(|&g| !unreduced(groups[g].0))
                .map(|g| g + 1),
        )
        .map(|axis| (sizes[axis], strides[axis]))
        .collect();
    let positions = order.positions();
    DeviceOrder::Explicit(
        row_major_offsets(&axes)
            .into_iter()
            .map(|k| positions[k])
            .collect(),
    )
}

fn write_list(f: &mut fmt::Formatter<'_>, values: &[usize]) -> fmt::Result {
    for (i, v) in values.iter().enumerate() {
        if i > 0 {
            f.write_str(",")?;
        }
        write!(f, "{v}")?;
    }
    Ok(())
}

impl fmt::Display for HloSharding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Replicated => f.write_str("{replicated}"),
            Self::Manual => f.write_str("{manual}"),
            Self::Unknown => f.write_str("{unknown}"),
            Self::Unreduced => f.write_str("{unreduced}"),
            Self::Maximal { device } => write!(f, "{{maximal device={device}}}"),
            Self::Grouped {
                inner,
                shard_as,
                group,
            } => {
                let text = inner.to_string();
                let kind = if *shard_as { "shard_as" } else { "shard_like" };
                write!(f, "{} {kind} {group}}}", &text[..text.len() - 1])
            }
            Self::Tuple(elements) => {
                f.write_str("{")?;
                for (i, element) in elements.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{element}")?;
                }
                f.write_str("}")
            }
            Self::Tiled {
                dims,
                order,
                subgroups,
            } => {
                f.write_str("{devices=[")?;
                write_list(f, dims)?;
                f.write_str("]")?;
                match order {
                    DeviceOrder::Explicit(list) => write_list(f, list)?,
                    DeviceOrder::Iota { reshape, perm } => {
                        f.write_str("<=[")?;
                        write_list(f, reshape)?;
                        f.write_str("]")?;
                        if !perm.is_empty() {
                            f.write_str("T(")?;
                            write_list(f, perm)?;
                            f.write_str(")")?;
                        }
                    }
                }
                match subgroups.as_slice() {
                    [] => {}
                    [SubgroupType::Replicated] => f.write_str(" last_tile_dim_replicate")?,
                    types => {
                        f.write_str(" last_tile_dims={")?;
                        for (i, t) in types.iter().enumerate() {
                            if i > 0 {
                                f.write_str(", ")?;
                            }
                            f.write_str(t.name())?;
                        }
                        f.write_str("}")?;
                    }
                }
                f.write_str("}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index_map::IndexMap;
    use crate::tile::tests::Rng;

    fn roundtrip(text: &str) -> HloSharding {
        let parsed = HloSharding::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(
            HloSharding::parse(&parsed.to_string()).unwrap(),
            parsed,
            "{text}"
        );
        parsed
    }

    fn column(text: &str) -> usize {
        match HloSharding::parse(text) {
            Err(ShardingError::Parse { column, .. }) => column,
            other => panic!("{text}: {other:?}"),
        }
    }

    fn layout(text: &str, ndim: usize, devices: usize) -> Result<TileLayout, ShardingError> {
        HloSharding::parse(text).unwrap().to_layout(ndim, devices)
    }

    #[test]
    fn a_device_list_of_another_length_than_the_grid_is_refused() {
        // jaxlib 0.10's XLA filled a short list with device 0s; from 0.11 it refuses one.
        assert_eq!(column("{devices=[2,4]01,2,3,4,5,6,7}"), 15);
        assert_eq!(column("{devices=[4]2,3}"), 13);
        assert_eq!(column("{devices=[2]0,1,2}"), 13);
        assert_eq!(
            roundtrip("{devices=[2,4]01,2,3,4,5,6,7,0}").to_string(),
            "{devices=[2,4]1,2,3,4,5,6,7,0}"
        );
    }

    #[test]
    fn parses_the_forms_hlo_dumps_print() {
        assert_eq!(roundtrip("{replicated}"), HloSharding::Replicated);
        assert_eq!(
            roundtrip("{maximal device=3}"),
            HloSharding::Maximal { device: 3 }
        );
        assert_eq!(roundtrip("{manual}"), HloSharding::Manual);
        assert_eq!(
            roundtrip("{devices=[2,2]0,1,2,3}"),
            HloSharding::Tiled {
                dims: vec![2, 2],
                order: DeviceOrder::Explicit(vec![0, 1, 2, 3]),
                subgroups: vec![]
            }
        );
        for text in [
            "{devices=[8,1]<=[2,4]T(1,0)}",
            "{devices=[2,1,4]<=[8] last_tile_dim_replicate}",
            "{devices=[1,2,2]<=[4] last_tile_dims={unreduced, replicated}}",
            "{devices=[2,2]<=[4] last_tile_dims={maximal}}",
        ] {
            assert_eq!(roundtrip(text).to_string(), text);
        }
        assert_eq!(
            roundtrip("{devices=[2,1,4]<=[8] last_tile_dims={replicated}}")
                .to_layout(2, 8)
                .unwrap(),
            roundtrip("{devices=[2,1,4]<=[8] last_tile_dim_replicate}")
                .to_layout(2, 8)
                .unwrap()
        );
        assert_eq!(
            roundtrip("{ devices=[2,2] <= [4] metadata={op_name=\"a}b\"} }").to_string(),
            "{devices=[2,2]<=[4]}"
        );
        assert_eq!(
            roundtrip("{{replicated}, {maximal device=0}}"),
            HloSharding::Tuple(vec![
                HloSharding::Replicated,
                HloSharding::Maximal { device: 0 }
            ])
        );
        assert_eq!(roundtrip("{}"), HloSharding::Tuple(vec![]));
    }

    #[test]
    fn reads_what_xlas_parser_reads() {
        // Each pair: a text that XLA's parser accepts, and XLA's own print of it.
        for (text, xla) in [
            ("{devices=[02,04]00,1,2,3,4,5,6,7}", "{devices=[2,4]0,1,2,3,4,5,6,7}"),
            ("{last_tile_dim_replicate devices=[2,1,4]<=[8]}", "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"),
            ("{device=3 maximal}", "{maximal device=3}"),
            ("{maximal device=1 device=2}", "{maximal device=2}"),
            ("{maximal devices=[1]0}", "{maximal device=0}"),
            ("{replicated replicated}", "{replicated}"),
            ("{maximal replicated}", "{replicated}"),
            ("{replicated devices=[1]<=[1]}", "{replicated}"),
            ("{devices=[2]0,1 devices=[2]2,3}", "{devices=[2,2]0,1,2,3}"),
            ("{devices=[2,2]<=[2,2] T ( 1 , 0 ) }", "{devices=[2,2]<=[2,2]T(1,0)}"),
            ("{devices=[2,2]<=[2,2]T(1,-0)}", "{devices=[2,2]<=[2,2]T(1,0)}"),
            ("{ /* c */ devices=[2]0,1 // to the end\n}", "{devices=[2]0,1}"),
            ("{devices=[2]0,1shard_as 1}", "{devices=[2]0,1 shard_as 1}"),
            ("{devices=[2]0,1 shard_as 1 shard_like 2}", "{devices=[2]0,1 shard_as 2}"),
            ("{shard_as 1 replicated}", "{replicated shard_as 1}"),
            ("{devices=[2,2]<=[4] last_tile_dims={} last_tile_dim_replicate}", "{devices=[2,2]<=[4] last_tile_dim_replicate}"),
            ("{ {replicated} , {replicated} }", "{{replicated}, {replicated}}"),
            (
                "{devices=[2]0,1 metadata={,op_name=\"a\\101\\\"\" source_line=-5 profile_type={1,2}}}",
                "{devices=[2]0,1}",
            ),
            ("{devices=[2]0,1 metadata={{}, {op_type='x'}} metadata= {}}", "{devices=[2]0,1}"),
        ] {
            assert_eq!(roundtrip(text).to_string(), xla, "{text}");
        }
    }

    #[test]
    fn errors_name_the_column() {
        let cases = [
            ("{garbage}", 2),
            ("{devices=[2,2}", 14),
            ("{devices=[2,2]0,1,2,3,4}", 15),
            ("{devices=[2,2]<=[2,2]T(0,0)}", 15),
            ("{devices=[2,2]<=[4]T(0,0)}", 20),
            ("{replicated", 12),
            ("{replicated} x", 14),
            ("{devices=[2]<=[2] last_tile_dims={foo}}", 35),
            ("", 1),
            ("{devices = [2]0,1}", 2),
            ("{replicatedmetadata={}}", 2),
            ("{devices=[2]0,1x}", 16),
            ("{devices=[2]0,1.5}", 15),
            ("{devices=[2]0,1 metadata={foo=\"x\"}}", 27),
            ("{devices=[2]0,1 metadata={op_name=\"a\\qb\"}}", 35),
            (
                "{devices=[2]0,1 metadata={op_name=\"a\" op_name=\"b\"}}",
                39,
            ),
            ("{devices=[2]0,1 metadata={source_line=2147483648}}", 39),
            ("{devices=[2]0,1 metadata={profile_type={3,4}}}", 43),
            ("{devices=[2]0,1 metadata={op_name=\"x\"} x}", 40),
            ("{{replicated},}", 15),
            ("{{{replicated}}}", 3),
            ("{mesh['x'=2], [{'x'}]}", 2),
        ];
        for (text, expected) in cases {
            assert_eq!(column(text), expected, "{text}");
        }
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        // XLA's grammar nests a tuple of single shardings and no deeper, so nothing recurses.
        assert_eq!(column(&"{".repeat(20_000)), 3);
        assert_eq!(column(&"{{".repeat(10_000)), 3);
        let deep_metadata = format!("{{replicated metadata={}}}", "{".repeat(20_000));
        assert_eq!(column(&deep_metadata), 24);
    }

    #[test]
    fn numbers_that_overflow_or_are_negative_are_errors() {
        for text in [
            "{maximal device=9223372036854775808}",
            "{maximal device=18446744073709551616}",
            "{maximal device=-1}",
            "{devices=[-2,-2]<=[4]}",
            "{devices=[2]0,1 shard_as -1}",
            "{devices=[99999999999999999999]<=[4]}",
            "{devices=[4294967296,4294967296,2]<=[4294967296,4294967296,2]T(2,1,0)}",
        ] {
            column(text);
        }
        roundtrip("{maximal device=9223372036854775807}");
    }

    #[test]
    fn texts_on_which_xlas_parser_crashes_are_errors() {
        // XLA aborts, divides by zero, fails an allocation or copies past its array on each.
        for text in [
            "{devices=[2,14]<=[8] last_tile_dim_replicate}",
            "{device=1 devices=[2]<=[2]}",
            "{devices=[2]0,1 devices=[2]<=[2]}",
            "{devices=[2,2]<=[4] last_tile_dims={replicated} last_tile_dim_replicate}",
            "{devices=[2]0,1 last_tile_dim_replicate last_tile_dims={replicated}}",
            "{devices=[0,2]<=[0] last_tile_dim_replicate}",
            "{devices=[2]0,1 last_tile_dims={manual, manual}}",
            "{devices=[2,2]0,1,2,3 last_tile_dims={replicated, manual, unreduced}}",
            "{devices=[1,1]0,0}",
            "{device=1 devices=[2]0,1}",
            "{devices=[2,2]<=[2,2]T(0,0)}",
            "{devices=[2,-1]0,1}",
        ] {
            column(text);
        }
    }

    #[test]
    fn manual_and_tuples_have_no_index_map() {
        for text in [
            "{devices=[2,2,2]<=[8] last_tile_dims={manual}}",
            "{devices=[2,2,2]<=[8] last_tile_dims={maximal}}",
            "{{replicated}}",
        ] {
            assert!(matches!(
                layout(text, 2, 8),
                Err(ShardingError::Unsupported(_))
            ));
        }
        for text in ["{manual}", "{unknown}"] {
            assert!(matches!(
                layout(text, 2, 8),
                Err(ShardingError::NoPlacement(_))
            ));
        }
        // A subgroup of one device is no subgroup.
        assert_eq!(
            layout("{devices=[2,4,1]<=[8] last_tile_dims={manual}}", 2, 8).unwrap(),
            layout("{devices=[2,4]<=[8]}", 2, 8).unwrap()
        );
    }

    /// (tile, partial sum) of each device position.
    fn placement(text: &str, shape: &[usize], devices: usize) -> Vec<(usize, usize)> {
        let layout = layout(text, shape.len(), devices).unwrap();
        let map = IndexMap::new(&layout, shape, devices).unwrap();
        (0..devices)
            .map(|d| (map.tile_of_device()[d], map.member_of_device(d)))
            .collect()
    }

    #[test]
    fn unreduced_subgroups_hold_partial_sums_of_a_tile() {
        // Tile t, partial sum u, copy r at position (t * 2 + u) * 2 + r.
        let text = "{devices=[2,1,2,2]<=[8] last_tile_dims={unreduced, replicated}}";
        assert_eq!(
            placement(text, &[4, 6], 8),
            vec![
                (0, 0),
                (0, 0),
                (0, 1),
                (0, 1),
                (1, 0),
                (1, 0),
                (1, 1),
                (1, 1)
            ]
        );
        let sharding = HloSharding::parse(text).unwrap();
        assert!(sharding.is_unreduced());
        let map = IndexMap::new(&sharding.to_layout(2, 8).unwrap(), &[4, 6], 8).unwrap();
        assert_eq!((map.shard_shape(), map.unreduced()), (&[2, 6][..], 2));
        // The same sharding with its subgroups the other way round, as JAX writes it.
        assert_eq!(
            placement(
                "{devices=[2,1,2,2]<=[2,2,2]T(0,2,1) last_tile_dims={replicated, unreduced}}",
                &[4, 6],
                8
            ),
            placement(text, &[4, 6], 8)
        );
        // Fully unreduced: every device holds a partial sum of the whole array.
        assert_eq!(
            placement("{unreduced}", &[3], 4),
            vec![(0, 0), (0, 1), (0, 2), (0, 3)]
        );
        // Unreduced over one device is no partial sum.
        let one = HloSharding::parse("{devices=[2,1]<=[2] last_tile_dims={unreduced}}").unwrap();
        assert!(!one.is_unreduced());
        assert_eq!(
            placement("{devices=[2,1]<=[2] last_tile_dims={unreduced}}", &[4], 2),
            vec![(0, 0), (1, 0)]
        );
    }

    #[test]
    fn tiled_index_map_follows_the_tile_order() {
        let layout = layout("{devices=[8,1]<=[2,4]T(1,0)}", 2, 8).unwrap();
        let map = IndexMap::new(&layout, &[8, 4], 8).unwrap();
        let rows: Vec<usize> = (0..8)
            .map(|d| map.device_bounds(d).next().unwrap().0)
            .collect();
        // Device position 4 holds tile 1, as JAX's devices_indices_map says.
        assert_eq!(rows, vec![0, 2, 4, 6, 1, 3, 5, 7]);
        assert_eq!(map.partitions(), &[8, 1]);
    }

    #[test]
    fn sharding_groups_and_empty_subgroups_parse() {
        let grouped = roundtrip("{devices=[2,4]<=[8] shard_as 1 metadata={op_name=\"x\"}}");
        assert_eq!(grouped.to_string(), "{devices=[2,4]<=[8] shard_as 1}");
        assert_eq!(
            grouped.to_layout(2, 8).unwrap(),
            roundtrip("{devices=[2,4]<=[8]}").to_layout(2, 8).unwrap()
        );
        assert_eq!(
            roundtrip("{replicated shard_like 0}").to_string(),
            "{replicated shard_like 0}"
        );
        assert_eq!(
            roundtrip("{devices=[2,4]<=[8] last_tile_dims={}}").to_string(),
            "{devices=[2,4]<=[8]}"
        );
    }

    #[test]
    fn identity_transposes_are_written_flat_and_missing_ones_rejected() {
        assert_eq!(
            roundtrip("{devices=[4,2]<=[2,4]T(0,1)}").to_string(),
            "{devices=[4,2]<=[8]}"
        );
        assert!(HloSharding::parse("{devices=[4,2]<=[2,4]}").is_err());
        assert!(HloSharding::parse("{devices=[4,2]<=[8]T(0)}").is_err());
    }

    #[test]
    fn array_checks_reject_what_xla_or_jax_would() {
        let parse = |t: &str| HloSharding::parse(t).unwrap();
        assert!(parse("{devices=[8]0,1,2,3,4,5,6,8}")
            .check_for_array(8)
            .is_err());
        assert!(parse("{devices=[8]0,1,2,3,4,5,6,6}")
            .check_for_array(8)
            .is_err());
        assert!(parse("{devices=[8]7,6,5,4,3,2,1,0}")
            .check_for_array(8)
            .is_ok());
        assert!(parse("{maximal device=8}").check_for_array(8).is_err());
        assert!(parse("{replicated}").check_for_array(0).is_err());
        assert!(parse("{{replicated}, {manual}}")
            .check_for_array(8)
            .is_err());
        assert!(matches!(
            HloSharding::parse("{devices=[8]<=[3,6148914691236517208]T(1,0)}"),
            Err(ShardingError::Parse { .. })
        ));
    }

    /// Valid texts for the mutation test below.
    const SEEDS: [&str; 10] = [
        "{replicated}",
        "{maximal device=3}",
        "{devices=[2,1,4]<=[8] last_tile_dim_replicate}",
        "{devices=[4,2]<=[2,4]T(1,0) shard_as 2}",
        "{devices=[2,2]3,1,0,2 metadata={op_name=\"a}b\" source_line=3}}",
        "{devices=[1,2,2]<=[2,2]T(1,0) last_tile_dims={unreduced, replicated}}",
        "{{replicated}, {devices=[2]0,1}}",
        "{unreduced}",
        "{devices=[2,2,2]<=[8] last_tile_dims={manual, replicated}}",
        "{devices=[2]0,1 metadata={{op_type='x'}, {}}}",
    ];
    const PIECES: [&str; 24] = [
        "{",
        "}",
        "[",
        "]",
        "(",
        ")",
        ",",
        "=",
        "<=",
        "T",
        " ",
        "0",
        "7",
        "-",
        "\"",
        "'",
        "\\",
        "/*",
        "*/",
        "//",
        "99999999999999999999",
        "devices=",
        "last_tile_dims={",
        "é",
    ];

    /// A seed with a few random edits, as the Python fuzz test makes them.
    fn mutated(rng: &mut Rng) -> String {
        let mut text: Vec<char> = SEEDS[rng.below(SEEDS.len())].chars().collect();
        for _ in 0..=rng.below(2) {
            let i = rng.below(text.len() + 1);
            let j = i + rng.below((text.len() - i).min(4) + 1);
            match rng.below(7) {
                0 => {
                    let piece = PIECES[rng.below(PIECES.len())];
                    text.splice(i..i, piece.chars());
                }
                1 => {
                    text.drain(i..j);
                }
                2 | 3 => {
                    let copy: Vec<char> = text[i..j].to_vec();
                    text.splice(j..j, copy);
                }
                4 => text.truncate(i),
                _ => {
                    let piece = PIECES[rng.below(PIECES.len())];
                    text.splice(i..j, piece.chars());
                }
            }
        }
        text.into_iter().collect()
    }

    #[test]
    fn mutated_texts_parse_or_fail_and_what_parses_round_trips() {
        let mut rng = Rng::new(7);
        let mut parsed = 0;
        for _ in 0..20_000 {
            let text = mutated(&mut rng);
            let Ok(sharding) = HloSharding::parse(&text) else {
                continue;
            };
            parsed += 1;
            let again = HloSharding::parse(&sharding.to_string())
                .unwrap_or_else(|e| panic!("{text:?} printed as {sharding}: {e}"));
            assert_eq!(again, sharding, "{text:?}");
            for devices in [1, 2, 4, 8] {
                if sharding.check_for_array(devices).is_ok() {
                    let _ = sharding.to_layout(2, devices);
                }
            }
        }
        // The edits leave a good share valid, so both paths are exercised.
        assert!(parsed > 1_000, "{parsed} parsed");
    }
}
