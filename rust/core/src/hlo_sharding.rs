//! XLA's `HloSharding`, read from the text that HLO dumps print (`{devices=[4,2]<=[8]}`) and
//! written back in the same form.

use std::fmt;

use crate::error::ShardingError;
use crate::tile::{DeviceOrder, TileLayout};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubgroupType {
    Replicated,
    Manual,
    Unreduced,
}

impl SubgroupType {
    fn name(self) -> &'static str {
        match self {
            Self::Replicated => "replicated",
            Self::Manual => "manual",
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
    /// Parses the attribute text, e.g. `{devices=[2,1,4]<=[8] last_tile_dim_replicate}`.
    pub fn parse(text: &str) -> Result<Self, ShardingError> {
        let mut parser = Parser { text, pos: 0 };
        let sharding = parser.sharding()?;
        parser.skip_space();
        if parser.pos != text.len() {
            return Err(parser.error("the end of the text"));
        }
        Ok(sharding)
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

    /// The tile layout that JAX derives for index maps; errors where JAX has none.
    pub fn to_layout(&self) -> Result<TileLayout, ShardingError> {
        match self {
            Self::Grouped { inner, .. } => inner.to_layout(),
            Self::Replicated | Self::Maximal { .. } => Ok(TileLayout::Replicated),
            Self::Tiled {
                dims,
                order,
                subgroups,
            } => {
                if let Some(other) = subgroups.iter().find(|&&t| t != SubgroupType::Replicated) {
                    return Err(ShardingError::Unsupported(format!(
                        "index maps of a sharding with {} subgroups are not defined: {self}",
                        other.name()
                    )));
                }
                let split = dims.len() - subgroups.len();
                Ok(TileLayout::Tiled {
                    partitions: dims[..split].to_vec(),
                    replicas: dims[split..].iter().product(),
                    order: order.clone(),
                })
            }
            Self::Manual | Self::Unknown | Self::Unreduced | Self::Tuple(_) => {
                Err(ShardingError::Unsupported(format!(
                    "index maps of the sharding {self} are not defined; only replicated, maximal \
                     and tiled shardings have them"
                )))
            }
        }
    }
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

/// A recursive-descent reader over the attribute text; positions are byte offsets.
struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn error(&self, expected: &str) -> ShardingError {
        ShardingError::Parse {
            column: self.text[..self.pos].chars().count() + 1,
            expected: expected.to_owned(),
            text: self.text.to_owned(),
        }
    }

    fn rest(&self) -> &str {
        &self.text[self.pos..]
    }

    fn skip_space(&mut self) {
        let trimmed = self.rest().trim_start();
        self.pos = self.text.len() - trimmed.len();
    }

    /// Consumes `token` (after optional space) if it comes next.
    fn eat(&mut self, token: &str) -> bool {
        self.skip_space();
        if self.rest().starts_with(token) {
            self.pos += token.len();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, token: &str) -> Result<(), ShardingError> {
        if self.eat(token) {
            Ok(())
        } else {
            Err(self.error(&format!("'{token}'")))
        }
    }

    fn number(&mut self) -> Result<usize, ShardingError> {
        self.skip_space();
        let digits = self.rest().bytes().take_while(u8::is_ascii_digit).count();
        let value = self.rest()[..digits]
            .parse()
            .map_err(|_| self.error("a non-negative integer"))?;
        self.pos += digits;
        Ok(value)
    }

    /// `a,b,c` (at least one number).
    fn numbers(&mut self) -> Result<Vec<usize>, ShardingError> {
        let mut out = vec![self.number()?];
        while self.eat(",") {
            out.push(self.number()?);
        }
        Ok(out)
    }

    fn bracketed_numbers(&mut self) -> Result<Vec<usize>, ShardingError> {
        self.expect("[")?;
        let out = self.numbers()?;
        self.expect("]")?;
        Ok(out)
    }

    fn sharding(&mut self) -> Result<HloSharding, ShardingError> {
        self.expect("{")?;
        self.skip_space();
        if self.rest().starts_with('{') || self.rest().starts_with('}') {
            return self.tuple();
        }
        let sharding = if self.eat("replicated") {
            HloSharding::Replicated
        } else if self.eat("manual") {
            HloSharding::Manual
        } else if self.eat("unknown") {
            HloSharding::Unknown
        } else if self.eat("unreduced") {
            HloSharding::Unreduced
        } else if self.eat("maximal") {
            self.expect("device")?;
            self.expect("=")?;
            HloSharding::Maximal {
                device: self.number()?,
            }
        } else if self.eat("devices") {
            self.expect("=")?;
            self.tiled()?
        } else {
            return Err(self
                .error("'replicated', 'maximal', 'devices=', 'manual', 'unknown' or 'unreduced'"));
        };
        let mut sharding = sharding;
        loop {
            if self.eat("shard_as") {
                sharding = HloSharding::Grouped {
                    inner: Box::new(sharding),
                    shard_as: true,
                    group: self.number()?,
                };
            } else if self.eat("shard_like") {
                sharding = HloSharding::Grouped {
                    inner: Box::new(sharding),
                    shard_as: false,
                    group: self.number()?,
                };
            } else if !self.metadata()? {
                break;
            }
        }
        self.expect("}")?;
        Ok(sharding)
    }

    fn tuple(&mut self) -> Result<HloSharding, ShardingError> {
        let mut elements = Vec::new();
        if !self.eat("}") {
            elements.push(self.sharding()?);
            while self.eat(",") {
                elements.push(self.sharding()?);
            }
            self.expect("}")?;
        }
        Ok(HloSharding::Tuple(elements))
    }

    fn tiled(&mut self) -> Result<HloSharding, ShardingError> {
        let dims_at = self.pos;
        let dims = self.bracketed_numbers()?;
        let tiles: usize = dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| {
                ShardingError::Invalid(format!("the tile grid {dims:?} is too large"))
            })?;
        let order_at = self.pos;
        let order = if self.eat("<=") {
            let reshape = self.bracketed_numbers()?;
            // As in XLA: a reshape of several dims needs a transpose, and one dim takes none.
            let perm = if reshape.len() > 1 {
                self.expect("T(")?;
                let perm = self.numbers()?;
                self.expect(")")?;
                perm
            } else {
                Vec::new()
            };
            let order = DeviceOrder::Iota { reshape, perm };
            order
                .validate()
                .map_err(|e| self.at(order_at, &e.to_string()))?;
            order.normalized()
        } else {
            DeviceOrder::Explicit(self.numbers()?)
        };
        if order.len() != tiles {
            self.pos = order_at;
            return Err(self.error(&format!(
                "{tiles} devices for the tile grid {dims:?}, not {}",
                order.len()
            )));
        }
        let subgroups = if self.eat("last_tile_dim_replicate") {
            vec![SubgroupType::Replicated]
        } else if self.eat("last_tile_dims") {
            self.expect("=")?;
            self.subgroup_types()?
        } else {
            Vec::new()
        };
        if subgroups.len() > dims.len() {
            self.pos = dims_at;
            return Err(self.error(&format!(
                "a tile grid with at least {} dims for its subgroups",
                subgroups.len()
            )));
        }
        Ok(HloSharding::Tiled {
            dims,
            order,
            subgroups,
        })
    }

    fn at(&self, pos: usize, expected: &str) -> ShardingError {
        Parser {
            text: self.text,
            pos,
        }
        .error(expected)
    }

    fn subgroup_types(&mut self) -> Result<Vec<SubgroupType>, ShardingError> {
        self.expect("{")?;
        let mut out = Vec::new();
        if self.eat("}") {
            return Ok(out);
        }
        loop {
            let t = if self.eat("replicated") {
                SubgroupType::Replicated
            } else if self.eat("manual") {
                SubgroupType::Manual
            } else if self.eat("unreduced") {
                SubgroupType::Unreduced
            } else {
                return Err(self.error("'replicated', 'manual' or 'unreduced'"));
            };
            out.push(t);
            if !self.eat(",") {
                break;
            }
        }
        self.expect("}")?;
        Ok(out)
    }

    /// Skips ` metadata={...}`, which says where a sharding came from and not what it is;
    /// returns whether there was one.
    fn metadata(&mut self) -> Result<bool, ShardingError> {
        if !self.eat("metadata") {
            return Ok(false);
        }
        self.expect("=")?;
        self.skip_space();
        if !self.rest().starts_with('{') {
            return Err(self.error("'{'"));
        }
        let mut depth = 0usize;
        let mut in_string = false;
        let mut escaped = false;
        for (offset, c) in self.rest().char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if in_string => escaped = true,
                '"' => in_string = !in_string,
                '{' if !in_string => depth += 1,
                '}' if !in_string => {
                    depth -= 1;
                    if depth == 0 {
                        self.pos += offset + 1;
                        return Ok(true);
                    }
                }
                _ => {}
            }
        }
        self.pos = self.text.len();
        Err(self.error("'}' closing the metadata"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index_map::IndexMap;

    fn roundtrip(text: &str) -> HloSharding {
        let parsed = HloSharding::parse(text).unwrap();
        assert_eq!(
            HloSharding::parse(&parsed.to_string()).unwrap(),
            parsed,
            "{text}"
        );
        parsed
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
        assert_eq!(
            roundtrip("{devices=[8,1]<=[2,4]T(1,0)}").to_string(),
            "{devices=[8,1]<=[2,4]T(1,0)}"
        );
        assert_eq!(
            roundtrip("{devices=[2,1,4]<=[8] last_tile_dim_replicate}").to_string(),
            "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"
        );
        assert_eq!(
            roundtrip("{devices=[2,1,4]<=[8] last_tile_dims={replicated}}")
                .to_layout()
                .unwrap(),
            roundtrip("{devices=[2,1,4]<=[8] last_tile_dim_replicate}")
                .to_layout()
                .unwrap()
        );
        assert_eq!(
            roundtrip("{ devices = [2,2] <= [4] metadata={op_name=\"a}b\"} }").to_string(),
            "{devices=[2,2]<=[4]}"
        );
        assert_eq!(
            roundtrip("{{replicated}, {maximal device=0}}"),
            HloSharding::Tuple(vec![
                HloSharding::Replicated,
                HloSharding::Maximal { device: 0 }
            ])
        );
    }

    #[test]
    fn errors_name_the_column() {
        let cases = [
            ("{garbage}", 2),
            ("{devices=[2,2}", 14),
            ("{devices=[2,2]0,1,2}", 15),
            ("{devices=[2,2]<=[2,2]T(0,0)}", 15),
            ("{devices=[2,2]<=[4]T(0,0)}", 20),
            ("{replicated", 12),
            ("{replicated} x", 14),
            ("{devices=[2]<=[2] last_tile_dims={foo}}", 35),
            ("", 1),
        ];
        for (text, column) in cases {
            match HloSharding::parse(text) {
                Err(ShardingError::Parse { column: got, .. }) => assert_eq!(got, column, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn manual_and_tuples_have_no_index_map() {
        for text in [
            "{manual}",
            "{devices=[2,2,2]<=[8] last_tile_dims={manual}}",
            "{{replicated}}",
        ] {
            assert!(matches!(
                HloSharding::parse(text).unwrap().to_layout(),
                Err(ShardingError::Unsupported(_))
            ));
        }
    }

    #[test]
    fn tiled_index_map_follows_the_tile_order() {
        let layout = HloSharding::parse("{devices=[8,1]<=[2,4]T(1,0)}")
            .unwrap()
            .to_layout()
            .unwrap();
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
            grouped.to_layout().unwrap(),
            roundtrip("{devices=[2,4]<=[8]}").to_layout().unwrap()
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
        assert!(parse("{{replicated}, {}}").check_for_array(8).is_err());
        assert!(matches!(
            HloSharding::parse("{devices=[8]<=[3,6148914691236517208]T(1,0)}"),
            Err(ShardingError::Parse { .. })
        ));
    }
}
