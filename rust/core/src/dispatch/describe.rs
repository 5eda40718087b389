//! A call signature described item by item, as `jax_jit.h`'s `CallSignature::DebugString`:
//! each leaf by its path (`args[0]['w']`), each static argument, the tree, and every item of
//! the jit key. `explain`, `no_recompiles` and warm starts compare descriptions, so that a miss
//! names what differs from a cached signature, whatever keyed it. The bindings give the texts
//! that only Python has (a repr, an aval's short form); the items are decided here.

use crate::dispatch::route::is_static_position;
use crate::dispatch::signature::{ArgSignature, HostKind};
use crate::dispatch::tree::{Handles, Node, Tree};

/// One item of a description: what it is (a leaf's path, `tree`, `jit key: jax_enable_x64`),
/// and its value in words.
pub type Item = (String, String);

/// What describing a tree asks of its handles: their text.
pub trait Texts<H: Handles> {
    type Error;
    /// An object's `repr()`.
    fn repr(&self, object: &H::Object) -> Result<String, Self::Error>;
    /// A type's qualified name.
    fn type_name(&self, kind: &H::Type) -> Result<String, Self::Error>;
    /// An attribute name.
    fn name(&self, name: &H::Name) -> Result<String, Self::Error>;
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
            let open = format!("{}[{}](", texts.type_name(kind)?, texts.repr(data)?);
            (indices(*arity), Vec::new(), open, ")")
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
pub struct LeafTexts {
    /// An array's aval in short (`float32[4]`) and its sharding's repr.
    pub array: Option<(String, String)>,
    /// A host value's dtype.
    pub dtype: Option<String>,
}

impl<H> ArgSignature<H> {
    /// The leaf in words: `jax.Array float32[4] (weak type), committed, on NamedSharding(...)`,
    /// `numpy array float32[2, 3]`, `python float (weak type)`.
    pub fn describe(&self, texts: &LeafTexts) -> String {
        let weak = |weak_type: bool| if weak_type { " (weak type)" } else { "" };
        match self {
            Self::Array {
                value, committed, ..
            } => {
                let (aval, sharding) = texts.array.clone().unwrap_or_default();
                let committed = if *committed {
                    "committed"
                } else {
                    "uncommitted"
                };
                format!(
                    "jax.Array {aval}{}, {committed}, on {sharding}",
                    weak(value.weak_type)
                )
            }
            Self::Host { kind, shape, .. } => {
                let dtype = texts.dtype.as_deref().unwrap_or("?");
                match kind {
                    HostKind::Array => format!("numpy array {dtype}{shape:?}"),
                    HostKind::Scalar => format!("numpy scalar {dtype}"),
                }
            }
            Self::Scalar(kind) => {
                format!("python {kind:?}{}", weak(kind.weak_type())).to_lowercase()
            }
        }
    }
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
            value: Arc::new(AvalValue::new(f32, [4].into(), true)),
            sharding: (),
            sharding_id: 1,
            committed: false,
        };
        let texts = LeafTexts {
            array: Some(("float32[4]".into(), "SingleDeviceSharding(0)".into())),
            dtype: None,
        };
        assert_eq!(
            array.describe(&texts),
            "jax.Array float32[4] (weak type), uncommitted, on SingleDeviceSharding(0)"
        );
        let host: ArgSignature<()> = ArgSignature::Host {
            dtype: f32,
            kind: HostKind::Array,
            shape: [2, 3].into(),
        };
        let texts = LeafTexts {
            array: None,
            dtype: Some("float32".into()),
        };
        assert_eq!(host.describe(&texts), "numpy array float32[2, 3]");
        let scalar: ArgSignature<()> = ArgSignature::Scalar(ScalarKind::Int);
        assert_eq!(scalar.describe(&texts), "python int (weak type)");
    }
}
