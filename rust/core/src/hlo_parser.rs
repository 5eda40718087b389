//! Reads XLA's sharding text with XLA's grammar (`ParseSharding` in XLA's HLO parser): a single
//! sharding is a brace of clauses in any order, a tuple is a brace of single shardings.
//!
//! Where XLA's parser takes text that describes no sharding, or aborts on it, this one returns
//! an error naming the column: numbers below zero or past `i64`, tile dimensions of zero,
//! explicit device lists longer than the tile grid (XLA copies past its array), iota
//! transposes that are not permutations, and clauses that XLA only checks with a crash. The
//! named form (`{mesh[...], ...}`) is not read.

use crate::error::ShardingError;
use crate::hlo_lexer::{Lexer, Token};
use crate::hlo_sharding::{HloSharding, SubgroupType};
use crate::tile::DeviceOrder;

pub(crate) fn parse(text: &str) -> Result<HloSharding, ShardingError> {
    let mut parser = Parser::new(text);
    parser.expect(&Token::LBrace, "'{'")?;
    let sharding = if matches!(parser.token, Token::LBrace | Token::RBrace) {
        parser.tuple()?
    } else {
        parser.single_body()?
    };
    if parser.token != Token::Eof {
        return Err(parser.error("the end of the text"));
    }
    Ok(sharding)
}

/// Metadata attributes that XLA's `OpMetadata` reader knows, by value type.
const METADATA_STRINGS: [&str; 6] = [
    "deduplicated_name",
    "metadata_payload",
    "op_name",
    "op_type",
    "scheduling_name",
    "source_file",
];
const METADATA_INT32S: [&str; 5] = [
    "source_column",
    "source_end_column",
    "source_end_line",
    "source_line",
    "stack_frame_id",
];
const METADATA_INT_LISTS: [&str; 1] = ["profile_type"];

struct Parser<'a> {
    text: &'a str,
    lexer: Lexer<'a>,
    token: Token<'a>,
    /// Where `token` starts.
    at: usize,
}

/// The clauses of one single sharding as XLA collects them: later `device=` replaces the
/// device list, `devices=` and `last_tile_dims=` append.
// The flags are XLA's, kept as XLA keeps them so that its precedence reads the same in `build`.
#[allow(clippy::struct_excessive_bools)]
#[derive(Default)]
struct Clauses {
    replicated: bool,
    maximal: bool,
    manual: bool,
    unknown: bool,
    unreduced: bool,
    last_tile_dim_replicate: bool,
    devices: Vec<usize>,
    dims: Vec<usize>,
    dims_at: Option<usize>,
    /// Where the first device ids or iota order start.
    order_at: Option<usize>,
    reshape: Vec<usize>,
    perm: Vec<usize>,
    subgroups: Vec<SubgroupType>,
    subgroups_at: Option<usize>,
    /// Whether `shard_as` was seen, and the group id of the last `shard_as`/`shard_like`: as
    /// in XLA, one `shard_as` makes the group a `shard_as` one.
    shard_as: bool,
    group: Option<usize>,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Self {
        let mut lexer = Lexer::new(text);
        let (token, at) = lexer.next();
        Self {
            text,
            lexer,
            token,
            at,
        }
    }

    fn advance(&mut self) {
        (self.token, self.at) = self.lexer.next();
    }

    fn error_at(&self, at: usize, expected: &str) -> ShardingError {
        ShardingError::Parse {
            column: self.text[..at].chars().count() + 1,
            expected: expected.to_owned(),
            text: self.text.to_owned(),
        }
    }

    /// An error at the current token; a malformed token says what it lacks.
    fn error(&self, expected: &str) -> ShardingError {
        match self.token {
            Token::Error(what) => self.error_at(self.at, what),
            _ => self.error_at(self.at, expected),
        }
    }

    fn eat(&mut self, token: &Token<'_>) -> bool {
        if self.token == *token {
            self.advance();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, token: &Token<'_>, expected: &str) -> Result<(), ShardingError> {
        if self.eat(token) {
            Ok(())
        } else {
            Err(self.error(expected))
        }
    }

    /// An integer in `lo..=hi`, which must be the current token.
    fn int_in(&mut self, lo: i64, hi: i64, expected: &str) -> Result<i64, ShardingError> {
        let Token::Int(digits) = self.token else {
            return Err(self.error(expected));
        };
        // Leading zeros are allowed; `-0` is 0.
        let value = digits
            .parse::<i64>()
            .ok()
            .filter(|v| (lo..=hi).contains(v))
            .ok_or_else(|| self.error(expected))?;
        self.advance();
        Ok(value)
    }

    fn count(&mut self) -> Result<usize, ShardingError> {
        let value = self.int_in(0, i64::MAX, "a non-negative integer below 2**63")?;
        Ok(value as usize)
    }

    /// `n (',' n)*`, appended to `out`; returns where the list starts.
    fn counts(&mut self, out: &mut Vec<usize>) -> Result<usize, ShardingError> {
        let at = self.at;
        out.push(self.count()?);
        while self.eat(&Token::Comma) {
            out.push(self.count()?);
        }
        Ok(at)
    }

    fn tuple(&mut self) -> Result<HloSharding, ShardingError> {
        let mut elements = Vec::new();
        if self.token != Token::RBrace {
            loop {
                self.expect(&Token::LBrace, "'{' opening a tuple element")?;
                elements.push(self.single_body()?);
                if !self.eat(&Token::Comma) {
                    break;
                }
            }
        }
        self.expect(&Token::RBrace, "'}' closing the tuple")?;
        Ok(HloSharding::Tuple(elements))
    }

    /// The clauses and closing brace of a single sharding whose `{` is read.
    fn single_body(&mut self) -> Result<HloSharding, ShardingError> {
        let start = self.at;
        if matches!(self.token, Token::Ident("mesh" | "maximal_mesh")) {
            return Err(
                self.error("the tiled form ('devices=...'); the named mesh form is not read")
            );
        }
        let mut clauses = Clauses::default();
        while self.token != Token::RBrace {
            self.clause(&mut clauses)?;
        }
        let sharding = self.build(clauses, start)?;
        self.advance();
        Ok(sharding)
    }

    fn clause(&mut self, c: &mut Clauses) -> Result<(), ShardingError> {
        match self.token {
            Token::Ident(word) => {
                let flag = match word {
                    "maximal" => &mut c.maximal,
                    "replicated" => &mut c.replicated,
                    "manual" => &mut c.manual,
                    "unknown" => &mut c.unknown,
                    "unreduced" => &mut c.unreduced,
                    "last_tile_dim_replicate" => &mut c.last_tile_dim_replicate,
                    "shard_as" | "shard_like" => {
                        self.advance();
                        c.shard_as |= word == "shard_as";
                        c.group = Some(self.count()?);
                        return Ok(());
                    }
                    _ => return Err(self.error("a sharding clause")),
                };
                *flag = true;
                self.advance();
            }
            Token::Attr("device") => {
                self.advance();
                c.devices = vec![self.count()?];
            }
            Token::Attr("devices") => {
                self.advance();
                self.tile_assignment(c)?;
            }
            Token::Attr("metadata") => {
                self.advance();
                self.metadata()?;
            }
            Token::Attr("last_tile_dims") => {
                c.subgroups_at.get_or_insert(self.at);
                self.advance();
                self.subgroup_types(&mut c.subgroups)?;
            }
            Token::Attr(_) => {
                return Err(self.error("'device=', 'devices=', 'metadata=' or 'last_tile_dims='"))
            }
            _ => return Err(self.error("a sharding clause or '}'")),
        }
        Ok(())
    }

    /// `[dims]` then `<=[reshape]` (with `T(perm)` for a reshape of several dims) or device ids.
    fn tile_assignment(&mut self, c: &mut Clauses) -> Result<(), ShardingError> {
        self.expect(&Token::LSquare, "'['")?;
        let at = self.counts(&mut c.dims)?;
        c.dims_at.get_or_insert(at);
        self.expect(&Token::RSquare, "']'")?;
        c.order_at.get_or_insert(self.at);
        if !self.eat(&Token::Leq) {
            self.counts(&mut c.devices)?;
            return Ok(());
        }
        self.expect(&Token::LSquare, "'['")?;
        self.counts(&mut c.reshape)?;
        self.expect(&Token::RSquare, "']'")?;
        // As in XLA, the reshape's length so far decides whether a transpose must follow.
        if c.reshape.len() == 1 {
            c.perm.push(0);
            return Ok(());
        }
        if self.token != Token::Ident("T") {
            return Err(self.error("'T(' (a reshape of several dims needs a transpose)"));
        }
        self.advance();
        self.expect(&Token::LParen, "'('")?;
        loop {
            let rank = c.reshape.len();
            let axis = self.int_in(0, rank as i64 - 1, &format!("an axis below {rank}"))?;
            c.perm.push(axis as usize);
            if !self.eat(&Token::Comma) {
                break;
            }
        }
        self.expect(&Token::RParen, "')'")
    }

    fn subgroup_types(&mut self, out: &mut Vec<SubgroupType>) -> Result<(), ShardingError> {
        self.expect(&Token::LBrace, "'{'")?;
        if self.eat(&Token::RBrace) {
            return Ok(());
        }
        loop {
            let t = match self.token {
                Token::Ident("replicated") => SubgroupType::Replicated,
                Token::Ident("manual") => SubgroupType::Manual,
                Token::Ident("maximal") => SubgroupType::Maximal,
                Token::Ident("unreduced") => SubgroupType::Unreduced,
                _ => return Err(self.error("'replicated', 'manual', 'maximal' or 'unreduced'")),
            };
            out.push(t);
            self.advance();
            if !self.eat(&Token::Comma) {
                break;
            }
        }
        self.expect(&Token::RBrace, "'}' closing the subgroup types")
    }

    /// One metadata brace, or a brace of them. Metadata says where a sharding came from, not
    /// what it is, so it is checked and dropped.
    fn metadata(&mut self) -> Result<(), ShardingError> {
        if self.token != Token::LBrace {
            return Err(self.error("'{' opening the metadata"));
        }
        // A list is told from a single metadata by the brace after the first.
        let after = Lexer::new(&self.text[self.at + 1..]).next().0;
        if after != Token::LBrace {
            return self.metadata_attributes();
        }
        self.advance();
        loop {
            self.metadata_attributes()?;
            if !self.eat(&Token::Comma) {
                break;
            }
        }
        self.expect(&Token::RBrace, "'}' closing the metadata list")
    }

    /// `{ [','] name=value ... }`, each name known and given once.
    fn metadata_attributes(&mut self) -> Result<(), ShardingError> {
        self.expect(&Token::LBrace, "'{' opening the metadata")?;
        let mut seen: Vec<&str> = Vec::new();
        while self.token != Token::RBrace {
            self.eat(&Token::Comma);
            let Token::Attr(name) = self.token else {
                return Err(self.error("a metadata attribute ('name=')"));
            };
            let known = [&METADATA_STRINGS[..], &METADATA_INT32S, &METADATA_INT_LISTS];
            if !known.iter().any(|names| names.contains(&name)) {
                return Err(self.error("a known metadata attribute"));
            }
            if seen.contains(&name) {
                return Err(self.error("each metadata attribute once"));
            }
            seen.push(name);
            self.advance();
            if METADATA_STRINGS.contains(&name) {
                self.expect(&Token::Str, "a string")?;
            } else if METADATA_INT32S.contains(&name) {
                self.int_in(i32::MIN.into(), i32::MAX.into(), "a 32-bit integer")?;
            } else {
                self.profile_types()?;
            }
        }
        self.advance();
        Ok(())
    }

    /// `{` values of XLA's `ProfileType` enum (0 to 3) `}`.
    fn profile_types(&mut self) -> Result<(), ShardingError> {
        self.expect(&Token::LBrace, "'{'")?;
        if self.token != Token::RBrace {
            loop {
                self.int_in(0, 3, "a profile type (0 to 3)")?;
                if !self.eat(&Token::Comma) {
                    break;
                }
            }
        }
        self.expect(&Token::RBrace, "'}'")
    }

    /// The sharding that the clauses describe, checked as XLA checks it and where XLA would
    /// crash or read nonsense; `start` is where the clauses begin.
    fn build(&self, c: Clauses, start: usize) -> Result<HloSharding, ShardingError> {
        let (shard_as, group) = (c.shard_as, c.group);
        let none_assigned = |kind: &str| {
            if c.devices.is_empty() {
                Ok(())
            } else {
                Err(self.error_at(start, &format!("no devices for a {kind} sharding")))
            }
        };
        let sharding = if c.replicated {
            none_assigned("replicated")?;
            HloSharding::Replicated
        } else if c.maximal {
            let [device] = c.devices[..] else {
                return Err(self.error_at(start, "exactly one device for a maximal sharding"));
            };
            HloSharding::Maximal { device }
        } else if c.manual {
            none_assigned("manual")?;
            HloSharding::Manual
        } else if c.unknown {
            none_assigned("unknown")?;
            HloSharding::Unknown
        } else if c.unreduced {
            none_assigned("unreduced")?;
            HloSharding::Unreduced
        } else {
            self.tiled(c, start)?
        };
        Ok(match group {
            Some(group) => HloSharding::Grouped {
                inner: Box::new(sharding),
                shard_as,
                group,
            },
            None => sharding,
        })
    }

    fn tiled(&self, c: Clauses, start: usize) -> Result<HloSharding, ShardingError> {
        let (Some(dims_at), Some(order_at)) = (c.dims_at, c.order_at) else {
            return Err(self.error_at(start, "'devices=[...]' for a tiled sharding"));
        };
        if c.dims.contains(&0) {
            return Err(self.error_at(dims_at, "tile dimensions of at least 1"));
        }
        let tiles = c
            .dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| self.error_at(dims_at, "a tile grid of fewer than 2**64 tiles"))?;
        let mut subgroups = c.subgroups;
        if c.last_tile_dim_replicate {
            if let Some(at) = c.subgroups_at.filter(|_| !subgroups.is_empty()) {
                return Err(self.error_at(
                    at,
                    "either 'last_tile_dim_replicate' or 'last_tile_dims=', not both",
                ));
            }
            subgroups.push(SubgroupType::Replicated);
        }
        if subgroups.len() > c.dims.len() {
            return Err(self.error_at(
                dims_at,
                &format!(
                    "a tile grid with a dim for each of its {} subgroups",
                    subgroups.len()
                ),
            ));
        }
        let order = if c.reshape.is_empty() {
            if c.devices.len() <= 1 {
                return Err(self.error_at(start, "more than one device for a tiled sharding"));
            }
            // jaxlib 0.10's XLA fills a short list with device 0s; from 0.11 XLA refuses it, as
            // the check below does on every line.
            DeviceOrder::Explicit(c.devices)
        } else {
            if !c.devices.is_empty() {
                return Err(self.error_at(start, "either device ids or an iota order, not both"));
            }
            let order = DeviceOrder::Iota {
                reshape: c.reshape,
                perm: c.perm,
            };
            order
                .validate()
                .map_err(|e| self.error_at(order_at, &format!("a valid iota order ({e})")))?;
            order.normalized()
        };
        if order.len() != tiles {
            return Err(self.error_at(
                order_at,
                &format!(
                    "{tiles} devices for the tile grid {:?}, not {}",
                    c.dims,
                    order.len()
                ),
            ));
        }
        Ok(HloSharding::Tiled {
            dims: c.dims,
            order,
            subgroups,
        })
    }
}
