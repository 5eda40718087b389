//! A call signature described item by item, as `jax_jit.h`'s `CallSignature::DebugString`:
//! each leaf by its path (`args[0]['w']`), each static argument, the tree, the keyword names
//! and every item of the jit key. `explain` and `no_recompiles` show its rows and compare its
//! items with those of the cached signatures, so that a miss names what differs, whatever
//! keyed it. The bindings give the texts that only Python has (a repr, a dtype's name); what
//! the items are, how they read and what differs are decided here.

use std::collections::{HashMap, HashSet};

use crate::dispatch::route::is_static_position;
use crate::dispatch::signature::{ArgSignature, HostKind};
use crate::dispatch::tree::{Handles, Node, Tree};

/// What an item of a description says of a call, and so what a difference in it is called.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Aspect {
    /// What a leaf is: `jax.Array`, `numpy array`, `numpy scalar`, `python float`.
    Kind,
    Dtype,
    Shape,
    WeakType,
    Committed,
    Sharding,
    /// A static argument's value and type.
    Static,
    /// The tree of the dynamic arguments.
    Tree,
    /// The names of the arguments passed by keyword, static ones included.
    Keywords,
    /// An item of JAX's jit key; its path names it.
    JitKey,
}

impl Aspect {
    /// A difference in this aspect, in words.
    pub fn words(self) -> &'static str {
        match self {
            Self::Kind => "kind",
            Self::Dtype => "dtype",
            Self::Shape => "shape",
            Self::WeakType => "weak type",
            Self::Committed => "committed",
            Self::Sharding => "sharding",
            Self::Static => "static value",
            Self::Tree => "tree structure",
            Self::Keywords => "keyword arguments",
            Self::JitKey => "jit key",
        }
    }
}

/// One thing a description compares: where it is (a leaf's path, `tree`, `jit key:
/// jax_enable_x64`), which aspect, and its value in words.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Item {
    pub path: String,
    pub aspect: Aspect,
    pub text: String,
}

/// The prefix of a jit-key item's path, before the item's name.
pub const JIT_KEY: &str = "jit key: ";

/// Where a difference in a jit-key item is.
pub const JIT_KEY_PATH: &str = "jit key";

/// A call signature described: rows to show, one per path (the flat leaves first, in JAX's
/// order), and the items to compare. The jit key's items have no row: all but a few hold
/// their defaults, and dozens of rows would bury the call's own; a difference names them.
#[derive(Default, Debug)]
pub struct Description {
    pub rows: Vec<(String, String)>,
    pub items: Vec<Item>,
}

impl Description {
    /// Adds a row that is one item.
    pub fn push(&mut self, path: String, aspect: Aspect, text: String) {
        match aspect {
            Aspect::JitKey => {}
            Aspect::Static => self.rows.push((path.clone(), format!("static {text}"))),
            _ => self.rows.push((path.clone(), text.clone())),
        }
        self.items.push(Item { path, aspect, text });
    }

    /// Adds a leaf: its row, and an item per aspect that keys it.
    pub fn push_leaf<H>(&mut self, path: String, leaf: &ArgSignature<H>, texts: &LeafTexts) {
        let (row, items) = leaf.describe(texts);
        for (aspect, text) in items {
            self.items.push(Item {
                path: path.clone(),
                aspect,
                text,
            });
        }
        self.rows.push((path, row));
    }
}

/// One way a call's signature differs from a cached one: `what` names the cause (an aspect's
/// words, or a jit-key item's name), `path` where it is.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Difference {
    pub what: String,
    pub path: String,
    pub call: String,
    pub cached: String,
}

impl Difference {
    fn new(what: &str, path: &str, call: &str, cached: &str) -> Self {
        Self {
            what: what.to_owned(),
            path: path.to_owned(),
            call: call.to_owned(),
            cached: cached.to_owned(),
        }
    }
}

/// What differs between a call's items and a cached signature's. A leaf of another kind is
/// one difference, not one per aspect; where nothing else says why the items of some paths
/// are on one side only (a tree or keyword names), those paths are the difference.
pub fn differences(call: &[Item], cached: &[Item]) -> Vec<Difference> {
    let (ours, theirs) = (by_place(call), by_place(cached));
    let (our_paths, their_paths) = (paths(call), paths(cached));
    let kind_differs = |path: &str| {
        matches!(
            (ours.get(&(path, Aspect::Kind)), theirs.get(&(path, Aspect::Kind))),
            (Some(a), Some(b)) if a != b
        )
    };
    let mut out = Vec::new();
    for item in call {
        let (path, aspect) = (item.path.as_str(), item.aspect);
        match theirs.get(&(path, aspect)) {
            Some(&text) if text == item.text => {}
            Some(_) if aspect != Aspect::Kind && kind_differs(path) => {}
            Some(&text) => {
                // A jit-key item is named by what differs, under the jit key's path.
                let (what, path) = match path.strip_prefix(JIT_KEY) {
                    Some(name) if aspect == Aspect::JitKey => (name, JIT_KEY_PATH),
                    _ => (aspect.words(), path),
                };
                out.push(Difference::new(what, path, &item.text, text));
            }
            None if aspect == Aspect::Keywords => {
                out.push(Difference::new(aspect.words(), path, &item.text, "none"));
            }
            None => {}
        }
    }
    for item in cached {
        if item.aspect == Aspect::Keywords && !ours.contains_key(&(item.path.as_str(), item.aspect))
        {
            out.push(Difference::new(
                item.aspect.words(),
                &item.path,
                "none",
                &item.text,
            ));
        }
    }
    let explained = out
        .iter()
        .any(|d| d.what == Aspect::Tree.words() || d.what == Aspect::Keywords.words());
    let mut one_side: Vec<&str> = Vec::new();
    for path in call.iter().chain(cached).map(|i| i.path.as_str()) {
        if our_paths.contains(path) != their_paths.contains(path) && !one_side.contains(&path) {
            one_side.push(path);
        }
    }
    if !one_side.is_empty() && !explained {
        let count = |paths: &HashSet<&str>| format!("{} items", paths.len());
        let shown: Vec<&str> = one_side.iter().take(4).copied().collect();
        out.push(Difference::new(
            Aspect::Tree.words(),
            &shown.join(", "),
            &count(&our_paths),
            &count(&their_paths),
        ));
    }
    out
}

fn by_place(items: &[Item]) -> HashMap<(&str, Aspect), &str> {
    items
        .iter()
        .map(|i| ((i.path.as_str(), i.aspect), i.text.as_str()))
        .collect()
}

fn paths(items: &[Item]) -> HashSet<&str> {
    items.iter().map(|i| i.path.as_str()).collect()
}

/// What differs between a call's items and the cached signature nearest to them: the one
/// with the fewest differences, the first among equals; None when nothing is cached.
pub fn nearest<'a>(
    call: &[Item],
    cached: impl IntoIterator<Item = &'a [Item]>,
) -> Option<Vec<Difference>> {
    cached
        .into_iter()
        .map(|theirs| differences(call, theirs))
        .reduce(|best, found| {
            if found.len() < best.len() {
                found
            } else {
                best
            }
        })
}

/// What describing a tree asks of its handles: their text.
pub trait Texts<H: Handles> {
    type Error;
    /// An object's `repr()`.
    fn repr(&self, object: &H::Object) -> Result<String, Self::Error>;
    /// A type's qualified name.
    fn type_name(&self, kind: &H::Type) -> Result<String, Self::Error>;
    /// An attribute name.
    fn name(&self, name: &H::Name) -> Result<String, Self::Error>;
    /// The field names of a registered node whose children are its fields, in order (a
    /// `NamedTuple`'s, which JAX takes apart field by field); None for any other node.
    fn fields(
        &self,
        kind: &H::Type,
        data: &H::Object,
        arity: usize,
    ) -> Result<Option<Vec<String>>, Self::Error>;
}

impl<H: Handles> Tree<H> {
    /// How the tree reads, as JAX prints a treedef (`*` a leaf), and the path of each leaf from
    /// its argument's (`roots`, one per dynamic argument).
    pub fn describe<X: Texts<H>>(
        &self,
        roots: &[String],
        texts: &X,
    ) -> Result<(String, Vec<String>), X::Error> {
        let mut nodes = self.nodes.iter();
        let (mut text, mut paths) = (Vec::with_capacity(roots.len()), Vec::new());
        for root in roots {
            let mut out = String::new();
            describe_node(&mut nodes, root, texts, &mut out, &mut paths)?;
            text.push(out);
        }
        Ok((format!("({})", text.join(", ")), paths))
    }
}

/// Writes the node that `nodes` comes to next, at `path`, and its leaves' paths.
fn describe_node<H: Handles, X: Texts<H>>(
    nodes: &mut std::slice::Iter<'_, Node<H>>,
    path: &str,
    texts: &X,
    out: &mut String,
    paths: &mut Vec<String>,
) -> Result<(), X::Error> {
    let Some(node) = nodes.next() else {
        return Ok(());
    };
    // The children's paths below this node, their labels where they have one, and the
    // brackets around them.
    let (children, labels, open, close): (Vec<String>, Vec<String>, String, &str) = match node {
        Node::Leaf => {
            out.push('*');
            paths.push(path.to_owned());
            return Ok(());
        }
        Node::Nothing => {
            out.push_str("None");
            return Ok(());
        }
        Node::Tuple(n) => (
            indices(*n),
            Vec::new(),
            "(".into(),
            if *n == 1 { ",)" } else { ")" },
        ),
        Node::List(n) => (indices(*n), Vec::new(), "[".into(), "]"),
        Node::Dict { keys, .. } => {
            let keys: Vec<String> = keys
                .iter()
                .map(|k| texts.repr(k))
                .collect::<Result<_, _>>()?;
            let children = keys.iter().map(|k| format!("[{k}]")).collect();
            let labels = keys.into_iter().map(|k| format!("{k}: ")).collect();
            (children, labels, "{".into(), "}")
        }
        Node::Dataclass {
            kind, fields, meta, ..
        } => {
            let meta: Vec<String> = meta
                .iter()
                .map(|v| texts.repr(v))
                .collect::<Result<_, _>>()?;
            let children = fields
                .data
                .iter()
                .map(|field| Ok(format!(".{}", texts.name(field)?)))
                .collect::<Result<_, _>>()?;
            let name = texts.type_name(kind)?;
            (
                children,
                Vec::new(),
                format!("{name}[{}](", meta.join(", ")),
                ")",
            )
        }
        Node::Registered {
            kind, data, arity, ..
        } => {
            let name = texts.type_name(kind)?;
            if let Some(fields) = texts.fields(kind, data, *arity)? {
                let children = fields.iter().map(|f| format!(".{f}")).collect();
                let labels = fields.iter().map(|f| format!("{f}=")).collect();
                (children, labels, format!("{name}("), ")")
            } else {
                let open = format!("{name}[{}](", texts.repr(data)?);
                (indices(*arity), Vec::new(), open, ")")
            }
        }
    };
    out.push_str(&open);
    for (i, child) in children.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        if let Some(label) = labels.get(i) {
            out.push_str(label);
        }
        describe_node(nodes, &format!("{path}{child}"), texts, out, paths)?;
    }
    out.push_str(close);
    Ok(())
}

fn indices(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("[{i}]")).collect()
}

/// The paths of a call's dynamic arguments, in the tree's order: the positional ones that
/// `argnums` leaves dynamic, then the keyword arguments (`kwnames`, as their reprs).
pub fn roots(num_args: usize, argnums: &[isize], kwnames: &[String]) -> Vec<String> {
    (0..num_args)
        .filter(|&i| !is_static_position(argnums, i, num_args))
        .map(|i| format!("args[{i}]"))
        .chain(kwnames.iter().map(|name| format!("kwargs[{name}]")))
        .collect()
}

/// The paths of a call's static arguments, in the signature's order: the positional ones,
/// then the named ones (`static_names`, as their reprs).
pub fn static_paths(num_args: usize, argnums: &[isize], static_names: &[String]) -> Vec<String> {
    (0..num_args)
        .filter(|&i| is_static_position(argnums, i, num_args))
        .map(|i| format!("args[{i}]"))
        .chain(static_names.iter().map(|name| format!("kwargs[{name}]")))
        .collect()
}

/// The texts of a leaf that only Python has.
#[derive(Default)]
pub struct LeafTexts {
    /// An array's or host value's dtype, by name.
    pub dtype: String,
    /// An array's sharding's repr.
    pub sharding: String,
}

impl<H> ArgSignature<H> {
    /// The leaf in words (`jax.Array float32[4] (weak type), committed, on NamedSharding(...)`,
    /// `numpy array float32[2,3]`, `python float (weak type)`), and each aspect that keys it.
    pub fn describe(&self, texts: &LeafTexts) -> (String, Vec<(Aspect, String)>) {
        let weak = |weak_type: bool| if weak_type { " (weak type)" } else { "" };
        let dtype = texts.dtype.clone();
        match self {
            Self::Array {
                value, committed, ..
            } => {
                let shape = shape_text(&value.shape);
                let committed = if *committed {
                    "committed"
                } else {
                    "uncommitted"
                };
                let row = format!(
                    "jax.Array {dtype}{shape}{}, {committed}, on {}",
                    weak(value.weak_type),
                    texts.sharding
                );
                let weak_type = if value.weak_type { "weak" } else { "not weak" };
                let aspects = vec![
                    (Aspect::Kind, "jax.Array".to_owned()),
                    (Aspect::Dtype, dtype),
                    (Aspect::Shape, shape),
                    (Aspect::WeakType, weak_type.to_owned()),
                    (Aspect::Committed, committed.to_owned()),
                    (Aspect::Sharding, texts.sharding.clone()),
                ];
                (row, aspects)
            }
            Self::Host {
                kind: HostKind::Array,
                shape,
                ..
            } => {
                let shape = shape_text(shape);
                let aspects = vec![
                    (Aspect::Kind, "numpy array".to_owned()),
                    (Aspect::Dtype, dtype.clone()),
                    (Aspect::Shape, shape.clone()),
                ];
                (format!("numpy array {dtype}{shape}"), aspects)
            }
            Self::Host {
                kind: HostKind::Scalar,
                ..
            } => {
                let aspects = vec![
                    (Aspect::Kind, "numpy scalar".to_owned()),
                    (Aspect::Dtype, dtype.clone()),
                ];
                (format!("numpy scalar {dtype}"), aspects)
            }
            Self::Scalar(kind) => {
                let name = format!("python {}", kind.name());
                let row = format!("{name}{}", weak(kind.weak_type()));
                (row, vec![(Aspect::Kind, name)])
            }
        }
    }
}

/// A shape as JAX writes it in an aval's short form: `[8,4]`.
fn shape_text<D: std::fmt::Display>(shape: &[D]) -> String {
    let dims: Vec<String> = shape.iter().map(ToString::to_string).collect();
    format!("[{}]", dims.join(","))
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::Arc;

    use super::*;
    use crate::dispatch::tree::tests::Plain;
    use crate::dispatch::tree::DataclassFields;
    use crate::dispatch::{AvalValue, DtypeKey, ScalarKind};

    impl Texts<Plain> for Plain {
        type Error = Infallible;

        fn repr(&self, object: &String) -> Result<String, Infallible> {
            Ok(format!("'{object}'"))
        }

        fn type_name(&self, kind: &&'static str) -> Result<String, Infallible> {
            Ok((*kind).to_owned())
        }

        fn name(&self, name: &&'static str) -> Result<String, Infallible> {
            Ok((*name).to_owned())
        }

        /// A node whose data is `fields:a,b` has the fields a and b.
        fn fields(
            &self,
            _: &&'static str,
            data: &String,
            arity: usize,
        ) -> Result<Option<Vec<String>>, Infallible> {
            let fields = data
                .strip_prefix("fields:")
                .map(|f| f.split(',').map(str::to_owned).collect::<Vec<_>>());
            Ok(fields.filter(|f| f.len() == arity))
        }
    }

    #[test]
    fn a_tree_reads_as_a_treedef_and_names_each_leaf_by_its_path() {
        let fields = Arc::new(DataclassFields::<Plain> {
            data: vec!["w"],
            meta: vec![],
        });
        let nodes = vec![
            Node::Dict {
                keys: vec!["b".to_owned(), "w".to_owned()],
                order: vec![0, 1],
            },
            Node::Tuple(1),
            Node::Leaf,
            Node::List(2),
            Node::Leaf,
            Node::Nothing,
            Node::Dataclass {
                kind: "Params",
                fields,
                meta: vec!["m".to_owned()],
            },
            Node::Leaf,
        ];
        let Ok(tree) = Tree::new(nodes, 3, &Plain);
        let dynamic = roots(3, &[1], &[]);
        assert_eq!(dynamic, ["args[0]", "args[2]"]);
        // A registered node: by its fields where it has them, else by child index.
        let registered = |data: &str| Node::Registered {
            kind: "State",
            data: data.to_owned(),
            data_hash: 0,
            arity: 2,
        };
        for (data, text, paths) in [
            (
                "fields:mu,nu",
                "(State(mu=*, nu=*))",
                ["args[0].mu", "args[0].nu"],
            ),
            (
                "other",
                "(State['other'](*, *))",
                ["args[0][0]", "args[0][1]"],
            ),
        ] {
            let nodes = vec![registered(data), Node::Leaf, Node::Leaf];
            let Ok(tree) = Tree::new(nodes, 1, &Plain);
            let Ok(described) = tree.describe(&roots(1, &[], &[]), &Plain);
            assert_eq!(
                described,
                (text.to_owned(), paths.map(str::to_owned).to_vec())
            );
        }
        assert_eq!(dynamic, ["args[0]", "args[2]"]);
        let Ok((text, paths)) = tree.describe(&dynamic, &Plain);
        assert_eq!(text, "({'b': (*,), 'w': [*, None]}, Params['m'](*))");
        assert_eq!(paths, ["args[0]['b'][0]", "args[0]['w'][0]", "args[2].w"]);
        assert_eq!(
            roots(1, &[], &["'x'".to_owned()]),
            ["args[0]", "kwargs['x']"]
        );
    }

    #[test]
    fn static_arguments_are_named_where_the_call_passed_them() {
        assert_eq!(
            static_paths(3, &[-1, 0], &["'n'".to_owned()]),
            ["args[0]", "args[2]", "kwargs['n']"]
        );
        assert_eq!(roots(3, &[-1, 0], &[]), ["args[1]"]);
    }

    #[test]
    fn leaves_say_what_keys_them() {
        let f32 = DtypeKey {
            num: 11,
            itemsize: 4,
        };
        let array: ArgSignature<()> = ArgSignature::Array {
            aval: (),
            value: Arc::new(AvalValue::new(f32, [8, 4].into(), true)),
            sharding: (),
            sharding_id: 1,
            committed: false,
        };
        let texts = LeafTexts {
            dtype: "float32".into(),
            sharding: "SingleDeviceSharding(0)".into(),
        };
        let (row, aspects) = array.describe(&texts);
        assert_eq!(
            row,
            "jax.Array float32[8,4] (weak type), uncommitted, on SingleDeviceSharding(0)"
        );
        let named: Vec<Aspect> = aspects.iter().map(|(a, _)| *a).collect();
        assert_eq!(
            named,
            [
                Aspect::Kind,
                Aspect::Dtype,
                Aspect::Shape,
                Aspect::WeakType,
                Aspect::Committed,
                Aspect::Sharding
            ]
        );
        let host: ArgSignature<()> = ArgSignature::Host {
            dtype: f32,
            kind: HostKind::Array,
            shape: [2, 3].into(),
        };
        assert_eq!(host.describe(&texts).0, "numpy array float32[2,3]");
        let scalar: ArgSignature<()> = ArgSignature::Scalar(ScalarKind::Int);
        assert_eq!(
            scalar.describe(&texts),
            (
                "python int (weak type)".into(),
                vec![(Aspect::Kind, "python int".into())]
            )
        );
        let flag: ArgSignature<()> = ArgSignature::Scalar(ScalarKind::Bool);
        assert_eq!(flag.describe(&texts).0, "python bool");
    }

    fn array(shape: &[i64], weak: bool, committed: bool) -> ArgSignature<()> {
        let f32 = DtypeKey {
            num: 11,
            itemsize: 4,
        };
        ArgSignature::Array {
            aval: (),
            value: Arc::new(AvalValue::new(f32, shape.into(), weak)),
            sharding: (),
            sharding_id: 1,
            committed,
        }
    }

    /// A description of leaves at `paths`, a static argument and an x64 item.
    fn described(leaves: &[(&str, ArgSignature<()>)], n: &str, x64: &str) -> Description {
        let texts = LeafTexts {
            dtype: "float32".into(),
            sharding: "S".into(),
        };
        let mut out = Description::default();
        for (path, leaf) in leaves {
            out.push_leaf((*path).to_owned(), leaf, &texts);
        }
        out.push("kwargs['n']".into(), Aspect::Static, format!("{n} (int)"));
        out.push("tree".into(), Aspect::Tree, "(*)".repeat(leaves.len()));
        out.push(
            format!("{JIT_KEY}jax_enable_x64"),
            Aspect::JitKey,
            x64.into(),
        );
        out
    }

    fn whats(found: &[Difference]) -> Vec<(&str, &str)> {
        found
            .iter()
            .map(|d| (d.what.as_str(), d.path.as_str()))
            .collect()
    }

    #[test]
    fn a_difference_names_its_aspect_and_path() {
        let cached = described(&[("args[0]", array(&[4], false, false))], "3", "False");
        let rows: Vec<&str> = cached.rows.iter().map(|(p, _)| p.as_str()).collect();
        // The jit key's items are compared, not shown.
        assert_eq!(rows, ["args[0]", "kwargs['n']", "tree"]);
        assert_eq!(cached.items.len(), 6 + 3);
        assert_eq!(cached.rows[1].1, "static 3 (int)");
        // Each aspect of a leaf apart, with both texts.
        let call = described(&[("args[0]", array(&[8], true, false))], "3", "False");
        let found = differences(&call.items, &cached.items);
        assert_eq!(
            whats(&found),
            [("shape", "args[0]"), ("weak type", "args[0]")]
        );
        assert_eq!(
            (found[0].call.as_str(), found[0].cached.as_str()),
            ("[8]", "[4]")
        );
        // A static value, and a jit-key item by its name.
        let call = described(&[("args[0]", array(&[4], false, false))], "4", "True");
        let found = differences(&call.items, &cached.items);
        assert_eq!(
            whats(&found),
            [
                ("static value", "kwargs['n']"),
                ("jax_enable_x64", "jit key")
            ]
        );
        assert_eq!(
            (found[0].call.as_str(), found[0].cached.as_str()),
            ("4 (int)", "3 (int)")
        );
        assert!(differences(&cached.items, &cached.items).is_empty());
    }

    #[test]
    fn a_leaf_of_another_kind_is_one_difference() {
        let cached = described(&[("args[0]", array(&[4], false, false))], "3", "False");
        let call = described(
            &[("args[0]", ArgSignature::Scalar(ScalarKind::Float))],
            "3",
            "False",
        );
        let found = differences(&call.items, &cached.items);
        assert_eq!(whats(&found), [("kind", "args[0]")]);
        assert_eq!(
            (found[0].call.as_str(), found[0].cached.as_str()),
            ("python float", "jax.Array")
        );
    }

    #[test]
    fn leaves_on_one_side_are_the_tree_s_difference() {
        let one = described(&[("args[0]", array(&[4], false, false))], "3", "False");
        let two = described(
            &[
                ("args[0]", array(&[4], false, false)),
                ("args[1]", array(&[4], false, false)),
            ],
            "3",
            "False",
        );
        // The tree's item says it; the leaf only on one side adds nothing.
        assert_eq!(
            whats(&differences(&two.items, &one.items)),
            [("tree structure", "tree")]
        );
        // Where no item says why, the paths on one side are the difference.
        let without_tree = |d: &Description| -> Vec<Item> {
            d.items
                .iter()
                .filter(|i| i.aspect != Aspect::Tree)
                .cloned()
                .collect()
        };
        let found = differences(&without_tree(&two), &without_tree(&one));
        assert_eq!(whats(&found), [("tree structure", "args[1]")]);
        assert_eq!(
            (found[0].call.as_str(), found[0].cached.as_str()),
            ("4 items", "3 items")
        );
        // Keyword names on one side only.
        let mut named = described(&[("args[0]", array(&[4], false, false))], "3", "False");
        named.push("keywords".into(), Aspect::Keywords, "'n'".into());
        assert_eq!(
            whats(&differences(&named.items, &one.items)),
            [("keyword arguments", "keywords")]
        );
        assert_eq!(differences(&one.items, &named.items)[0].call, "none");
    }

    #[test]
    fn the_nearest_signature_has_the_fewest_differences() {
        let call = described(&[("args[0]", array(&[4], false, true))], "3", "False");
        let far = described(&[("args[0]", array(&[8], true, false))], "4", "False");
        let near = described(&[("args[0]", array(&[4], false, false))], "3", "False");
        let found = nearest(&call.items, [far.items.as_slice(), near.items.as_slice()]);
        assert_eq!(whats(&found.unwrap()), [("committed", "args[0]")]);
        assert_eq!(nearest(&call.items, []), None);
    }
}
