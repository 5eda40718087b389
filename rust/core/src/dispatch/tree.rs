//! The structure of a call's dynamic arguments, as JAX's `PyTreeDef` has it: the nodes of each
//! argument in preorder. Builtin containers (tuples, lists, dicts, None) are plain data here;
//! what only Python can compare (dict keys, node types, node data) is a handle, compared and
//! hashed through [`Objects`]. The bindings read values into trees and build values from them.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use rustc_hash::FxHasher;

/// The handles a tree holds: Python objects, types and attribute names in the bindings.
pub trait Handles {
    type Object;
    type Type;
    type Name;
}

/// What comparing and hashing trees asks of their handles.
pub trait Objects<H: Handles> {
    type Error;
    /// The object's hash, as Python's `hash()`.
    fn hash(&self, object: &H::Object) -> Result<isize, Self::Error>;
    /// Whether two objects are equal: the same object, or `==`.
    fn eq(&self, a: &H::Object, b: &H::Object) -> Result<bool, Self::Error>;
    /// The identity of a type.
    fn type_id(&self, kind: &H::Type) -> usize;
}

pub enum Node<H: Handles> {
    Leaf,
    Nothing,
    Tuple(usize),
    List(usize),
    /// A dict's keys in JAX's order (sorted), and where each key of the dict that the tree was
    /// read from, in that dict's own order, comes among them: a dict whose keys come in the
    /// same order (as the same objects) is flattened without looking a key up.
    Dict {
        keys: Vec<H::Object>,
        order: Vec<u32>,
    },
    /// An instance of a class registered with `jax.tree_util.register_dataclass`, taken apart
    /// as JAX's registry does: its data fields are its children, and the values of its meta
    /// fields (compared by `==`) are its node data.
    Dataclass {
        kind: H::Type,
        fields: Arc<DataclassFields<H>>,
        meta: Vec<H::Object>,
    },
    /// A node that JAX's registry takes apart: its type, its node data (JAX's treedefs
    /// compare it by `==`), and how many children it has.
    Registered {
        kind: H::Type,
        data: H::Object,
        data_hash: isize,
        arity: usize,
    },
}

impl<H: Handles> Node<H> {
    /// How many children the node has.
    pub fn arity(&self) -> usize {
        match self {
            Self::Leaf | Self::Nothing => 0,
            Self::Tuple(n) | Self::List(n) | Self::Registered { arity: n, .. } => *n,
            Self::Dict { keys, .. } => keys.len(),
            Self::Dataclass { fields, .. } => fields.data.len(),
        }
    }
}

/// A node with its children nested, each leaf by its index among the tree's flat leaves: the
/// tree as a record writes it.
pub enum Nested<'a, H: Handles> {
    Leaf(usize),
    Node(&'a Node<H>, Vec<Nested<'a, H>>),
}

/// The attribute names of a registered dataclass.
pub struct DataclassFields<H: Handles> {
    pub data: Vec<H::Name>,
    pub meta: Vec<H::Name>,
}

/// The nodes of each dynamic argument in turn, in preorder.
pub struct Tree<H: Handles> {
    pub nodes: Vec<Node<H>>,
    pub hash: u64,
    pub num_leaves: usize,
    /// Whether every dynamic argument is a leaf: the leaves are the arguments.
    pub flat: bool,
}

impl<H: Handles> Tree<H> {
    /// The tree of no arguments.
    pub const fn empty() -> Self {
        Self {
            nodes: Vec::new(),
            hash: 0,
            num_leaves: 0,
            flat: true,
        }
    }

    /// The tree of these nodes, with `num_leaves` leaves, hashed by its structure, its dict
    /// keys, node types and node data.
    pub fn new<O: Objects<H>>(
        nodes: Vec<Node<H>>,
        num_leaves: usize,
        objects: &O,
    ) -> Result<Self, O::Error> {
        let mut hasher = FxHasher::default();
        for node in &nodes {
            match node {
                Node::Leaf => 0u8.hash(&mut hasher),
                Node::Nothing => 1u8.hash(&mut hasher),
                Node::Tuple(n) => (2u8, n).hash(&mut hasher),
                Node::List(n) => (3u8, n).hash(&mut hasher),
                Node::Dict { keys, .. } => {
                    (4u8, keys.len()).hash(&mut hasher);
                    for key in keys {
                        objects.hash(key)?.hash(&mut hasher);
                    }
                }
                Node::Registered {
                    kind,
                    data_hash,
                    arity,
                    ..
                } => (5u8, objects.type_id(kind), data_hash, arity).hash(&mut hasher),
                Node::Dataclass { kind, meta, .. } => {
                    (6u8, objects.type_id(kind), meta.len()).hash(&mut hasher);
                    for value in meta {
                        objects.hash(value)?.hash(&mut hasher);
                    }
                }
            }
        }
        Ok(Self {
            flat: nodes.iter().all(|n| matches!(n, Node::Leaf)),
            nodes,
            hash: hasher.finish(),
            num_leaves,
        })
    }

    /// Whether two trees are the same: the same structure and node types, and dict keys and
    /// node data equal.
    pub fn same<O: Objects<H>>(&self, other: &Self, objects: &O) -> Result<bool, O::Error> {
        if self.hash != other.hash || self.nodes.len() != other.nodes.len() {
            return Ok(false);
        }
        let all_equal = |a: &[H::Object], b: &[H::Object]| -> Result<bool, O::Error> {
            if a.len() != b.len() {
                return Ok(false);
            }
            for (a, b) in a.iter().zip(b) {
                if !objects.eq(a, b)? {
                    return Ok(false);
                }
            }
            Ok(true)
        };
        for (a, b) in self.nodes.iter().zip(&other.nodes) {
            let same = match (a, b) {
                (Node::Leaf, Node::Leaf) | (Node::Nothing, Node::Nothing) => true,
                (Node::Tuple(m), Node::Tuple(n)) | (Node::List(m), Node::List(n)) => m == n,
                (Node::Dict { keys: a, .. }, Node::Dict { keys: b, .. }) => all_equal(a, b)?,
                (
                    Node::Registered {
                        kind: a,
                        data: a_data,
                        arity: m,
                        ..
                    },
                    Node::Registered {
                        kind: b,
                        data: b_data,
                        arity: n,
                        ..
                    },
                ) => {
                    objects.type_id(a) == objects.type_id(b)
                        && m == n
                        && objects.eq(a_data, b_data)?
                }
                (
                    Node::Dataclass {
                        kind: a, meta: m, ..
                    },
                    Node::Dataclass {
                        kind: b, meta: n, ..
                    },
                ) => objects.type_id(a) == objects.type_id(b) && all_equal(m, n)?,
                _ => false,
            };
            if !same {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Each dynamic argument's node, its children nested.
    pub fn nested(&self) -> Vec<Nested<'_, H>> {
        fn nest<'a, H: Handles>(
            nodes: &mut std::slice::Iter<'a, Node<H>>,
            leaves: &mut usize,
        ) -> Option<Nested<'a, H>> {
            let node = nodes.next()?;
            if let Node::Leaf = node {
                *leaves += 1;
                return Some(Nested::Leaf(*leaves - 1));
            }
            let children = (0..node.arity())
                .map(|_| nest(nodes, leaves))
                .collect::<Option<_>>()?;
            Some(Nested::Node(node, children))
        }
        let (mut nodes, mut leaves) = (self.nodes.iter(), 0);
        std::iter::from_fn(|| nest(&mut nodes, &mut leaves)).collect()
    }

    /// Calls `object` on every object and `kind` on every type the tree holds (for the
    /// garbage collector's traversal).
    pub fn try_for_each_handle<E>(
        &self,
        mut object: impl FnMut(&H::Object) -> Result<(), E>,
        mut kind: impl FnMut(&H::Type) -> Result<(), E>,
    ) -> Result<(), E> {
        for node in &self.nodes {
            match node {
                Node::Leaf | Node::Nothing | Node::Tuple(_) | Node::List(_) => {}
                Node::Dict { keys, .. } => keys.iter().try_for_each(&mut object)?,
                Node::Dataclass {
                    kind: node_kind,
                    meta,
                    ..
                } => {
                    kind(node_kind)?;
                    meta.iter().try_for_each(&mut object)?;
                }
                Node::Registered {
                    kind: node_kind,
                    data,
                    ..
                } => {
                    kind(node_kind)?;
                    object(data)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::convert::Infallible;

    use super::*;

    /// Handles as plain strings: objects compare by value, types by name.
    pub(crate) struct Plain;

    impl Handles for Plain {
        type Object = String;
        type Type = &'static str;
        type Name = &'static str;
    }

    impl Objects<Plain> for Plain {
        type Error = Infallible;

        fn hash(&self, object: &String) -> Result<isize, Infallible> {
            Ok(object.len() as isize)
        }

        fn eq(&self, a: &String, b: &String) -> Result<bool, Infallible> {
            Ok(a == b)
        }

        fn type_id(&self, kind: &&'static str) -> usize {
            kind.as_ptr() as usize
        }
    }

    fn tree(nodes: Vec<Node<Plain>>, num_leaves: usize) -> Tree<Plain> {
        let Ok(tree) = Tree::new(nodes, num_leaves, &Plain);
        tree
    }

    fn dict(keys: &[&str]) -> Node<Plain> {
        Node::Dict {
            keys: keys.iter().map(|&k| k.to_owned()).collect(),
            order: (0..keys.len() as u32).collect(),
        }
    }

    fn same(a: &Tree<Plain>, b: &Tree<Plain>) -> bool {
        let Ok(same) = a.same(b, &Plain);
        same
    }

    #[test]
    fn trees_of_leaves_are_flat_and_containers_are_not() {
        assert!(tree(vec![Node::Leaf, Node::Leaf], 2).flat);
        assert!(!tree(vec![Node::Tuple(1), Node::Leaf], 1).flat);
        assert!(!tree(vec![Node::Nothing], 0).flat);
        assert!(Tree::<Plain>::empty().flat);
    }

    /// A nested tree in brackets, leaves by index: `(0, {1})`.
    fn text(nested: &Nested<'_, Plain>) -> String {
        match nested {
            Nested::Leaf(i) => i.to_string(),
            Nested::Node(node, children) => {
                let inner: Vec<String> = children.iter().map(text).collect();
                let (open, close) = match node {
                    Node::Dict { .. } => ("{", "}"),
                    Node::List(_) => ("[", "]"),
                    Node::Nothing => return "None".into(),
                    _ => ("(", ")"),
                };
                format!("{open}{}{close}", inner.join(", "))
            }
        }
    }

    #[test]
    fn a_tree_nests_each_argument_and_numbers_its_leaves() {
        let t = tree(
            vec![
                Node::Tuple(2),
                Node::Leaf,
                dict(&["b", "w"]),
                Node::Leaf,
                Node::List(0),
                Node::Nothing,
                Node::Leaf,
            ],
            3,
        );
        let roots: Vec<String> = t.nested().iter().map(text).collect();
        assert_eq!(roots, ["(0, {1, []})", "None", "2"]);
        assert!(tree(vec![], 0).nested().is_empty());
    }

    #[test]
    fn structure_and_keys_tell_trees_apart() {
        let a = tree(
            vec![Node::Tuple(2), Node::Leaf, dict(&["w"]), Node::Leaf],
            2,
        );
        let b = tree(
            vec![Node::Tuple(2), Node::Leaf, dict(&["w"]), Node::Leaf],
            2,
        );
        assert_eq!(a.hash, b.hash);
        assert!(same(&a, &b));
        for other in [
            vec![Node::List(2), Node::Leaf, dict(&["w"]), Node::Leaf],
            vec![Node::Tuple(2), Node::Leaf, dict(&["b"]), Node::Leaf],
            vec![Node::Tuple(2), Node::Leaf, Node::Tuple(1), Node::Leaf],
        ] {
            assert!(!same(&a, &tree(other, 2)));
        }
    }

    #[test]
    fn registered_nodes_compare_their_type_and_data() {
        let node = |kind: &'static str, data: &str, arity| Node::Registered {
            kind,
            data: data.to_owned(),
            data_hash: data.len() as isize,
            arity,
        };
        let a = tree(vec![node("Point", "xy", 2), Node::Leaf, Node::Leaf], 2);
        let b = tree(vec![node("Point", "xy", 2), Node::Leaf, Node::Leaf], 2);
        assert!(same(&a, &b));
        // Data of the same hash but another value; another type of the same data.
        let c = tree(vec![node("Point", "yx", 2), Node::Leaf, Node::Leaf], 2);
        assert_eq!(a.hash, c.hash);
        assert!(!same(&a, &c));
        let d = tree(vec![node("Pair", "xy", 2), Node::Leaf, Node::Leaf], 2);
        assert!(!same(&a, &d));
    }

    #[test]
    fn every_handle_is_visited() {
        let fields = Arc::new(DataclassFields::<Plain> {
            data: vec!["x"],
            meta: vec!["name"],
        });
        let t = tree(
            vec![
                Node::Tuple(2),
                dict(&["a", "b"]),
                Node::Leaf,
                Node::Leaf,
                Node::Dataclass {
                    kind: "Params",
                    fields,
                    meta: vec!["m".to_owned()],
                },
                Node::Leaf,
            ],
            3,
        );
        let (mut objects, mut kinds) = (Vec::new(), Vec::new());
        let Ok(()) = t.try_for_each_handle::<Infallible>(
            |o| {
                objects.push(o.clone());
                Ok(())
            },
            |k| {
                kinds.push(*k);
                Ok(())
            },
        );
        assert_eq!(objects, ["a", "b", "m"]);
        assert_eq!(kinds, ["Params"]);
    }
}
