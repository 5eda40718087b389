//! A cache entry's input plan: what each flat argument of a call becomes as an executable
//! input (JAX's `shard_args` decisions, made once per entry rather than per call), and the
//! checks that follow from it, over plain data. The payloads (`C`opy, `M`ove, `H`ost,
//! `L`ocal) are the caller's: jaxlib objects that carry out each decision.

/// How one flat argument becomes an executable input.
#[derive(Debug)]
pub enum Input<C, M, H, L> {
    /// The executable does not take it.
    Dropped,
    /// An array on the executable's input sharding.
    Pass,
    /// An array whose shards jaxlib copies to the executable's devices as they are.
    Copy(C),
    /// An array elsewhere, which JAX moves to this sharding.
    Move(M),
    /// A numpy array or a Python or numpy scalar, placed from the host (or a kept copy).
    Host(H),
    /// A host-local array of a pmap across processes, viewed as this process's part of a
    /// global array.
    Rewrap(L),
    /// A host-local value of a pmap across processes, placed as this process's part.
    ProcessLocal(L),
}

impl<C, M, H, L> Input<C, M, H, L> {
    /// The kind of decision, without its payload (for reports and tests).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Dropped => "dropped",
            Self::Pass => "pass",
            Self::Copy(_) => "copy",
            Self::Move(_) => "move",
            Self::Host(_) => "host",
            Self::Rewrap(_) => "rewrap",
            Self::ProcessLocal(_) => "process_local",
        }
    }
}

/// An entry's inputs: its kept constants first, then each argument's `Input`.
#[derive(Debug)]
pub struct InputPlan<C, M, H, L> {
    pub inputs: Vec<Input<C, M, H, L>>,
    num_consts: usize,
    /// The arguments whose buffers the executable consumes (arrays only).
    pub donated: Vec<usize>,
    /// Whether a call's leaves are the executable's inputs as they are: every one an array on
    /// its input sharding, no constants, none dropped.
    pub passthrough: bool,
    /// Whether the executable spans devices.
    pub multi_device: bool,
}

/// Why jaxlib would refuse a call's inputs: a donated buffer used twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DonationClash {
    /// The input (numbered among the executable's inputs) whose buffer an earlier one had.
    pub input: usize,
    pub first: usize,
    /// Whether the earlier use was the donation (else this one is).
    pub previously_donated: bool,
}

impl<C, M, H, L> InputPlan<C, M, H, L> {
    /// The plan of an executable that keeps `num_consts` constants, then the arguments for
    /// which `kept` holds; `donated` and `is_array` say which arguments it consumes and which
    /// are arrays. `input(j, position)` says what kept argument `j` becomes, `position` its
    /// place among the executable's inputs.
    pub fn new<E>(
        num_consts: usize,
        kept: &[bool],
        donated: &[bool],
        is_array: impl Fn(usize) -> bool,
        multi_device: bool,
        mut input: impl FnMut(usize, usize) -> Result<Input<C, M, H, L>, E>,
    ) -> Result<Self, E> {
        let mut inputs = Vec::with_capacity(kept.len());
        let mut donations = Vec::new();
        let mut position = num_consts;
        for (j, &kept) in kept.iter().enumerate() {
            if !kept {
                inputs.push(Input::Dropped);
                continue;
            }
            if donated[j] && is_array(j) {
                donations.push(j);
            }
            inputs.push(input(j, position)?);
            position += 1;
        }
        Ok(Self {
            passthrough: num_consts == 0 && inputs.iter().all(|i| matches!(i, Input::Pass)),
            inputs,
            num_consts,
            donated: donations,
            multi_device,
        })
    }

    /// Whether JAX's C++ dispatch takes this plan's calls as they come: one device, and every
    /// argument an array on the input sharding or on another device (which it copies), or a
    /// host value.
    pub fn delegable(&self) -> bool {
        !self.multi_device
            && self.inputs.iter().all(|input| {
                matches!(
                    input,
                    Input::Dropped | Input::Pass | Input::Copy(_) | Input::Host(_)
                )
            })
    }

    /// Which leaves of a call the executable takes as they are, where it takes every leaf so or
    /// not at all (an unused argument, which JAX prunes) and no constants: a bound function's
    /// path (see `bound.rs`). None for any other plan.
    pub fn taken_as_is(&self) -> Option<Vec<bool>> {
        if self.num_consts != 0 {
            return None;
        }
        self.inputs
            .iter()
            .map(|input| match input {
                Input::Pass => Some(true),
                Input::Dropped => Some(false),
                _ => None,
            })
            .collect()
    }

    /// The leaves passed to the executable as they are, each with its place among the
    /// executable's inputs: `(input, leaf)`.
    pub fn passed_as_is(&self, num_leaves: usize) -> Vec<(usize, usize)> {
        if self.passthrough {
            return (0..num_leaves).map(|j| (j, j)).collect();
        }
        let mut input = self.num_consts;
        let mut passed = Vec::new();
        for (j, how) in self.inputs.iter().enumerate() {
            match how {
                Input::Dropped => continue,
                Input::Pass => passed.push((input, j)),
                _ => {}
            }
            input += 1;
        }
        passed
    }

    /// The clash, as jaxlib reports it, of a call of `num_leaves` leaves where a donated
    /// argument is passed as it is and is also another argument (`same(k, j)`: whether leaves
    /// `k` and `j` are one object): the first input whose buffer an earlier input had.
    pub fn donation_clash(
        &self,
        num_leaves: usize,
        same: impl Fn(usize, usize) -> bool,
    ) -> Option<DonationClash> {
        let as_is = |j: usize| self.passthrough || matches!(self.inputs[j], Input::Pass);
        let clash = self
            .donated
            .iter()
            .any(|&d| as_is(d) && (0..num_leaves).any(|k| k != d && as_is(k) && same(k, d)));
        if !clash {
            return None;
        }
        let passed = self.passed_as_is(num_leaves);
        let donated = |j: usize| self.donated.contains(&j);
        for (at, &(input, j)) in passed.iter().enumerate() {
            let Some(&(first, k)) = passed[..at].iter().find(|&&(_, k)| same(k, j)) else {
                continue;
            };
            if donated(k) || donated(j) {
                return Some(DonationClash {
                    input,
                    first,
                    previously_donated: donated(k),
                });
            }
        }
        None
    }
}

/// How an array argument becomes an executable input, as JAX's `array_input` says (`how`:
/// `"pass"`, `"copy"` where it gave copy targets, else a move by JAX).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArrayInput {
    Pass,
    /// Copied by jaxlib; the copy of the latest array is kept where `keep_latest`.
    Copy {
        keep_latest: bool,
    },
    Move,
}

/// The largest array whose latest copy is kept: the copy is held until another array is
/// copied, and the time that keeping saves (about 4 µs) matters for small arrays only.
pub const KEPT_COPY_BYTES: usize = 1 << 20;

impl ArrayInput {
    /// The input of an array of `nbytes` bytes, `donated` if the executable consumes it (its
    /// copy too, which is then never kept).
    pub fn of(how: &str, has_copy_targets: bool, nbytes: usize, donated: bool) -> Self {
        match how {
            "pass" => Self::Pass,
            "copy" if has_copy_targets => Self::Copy {
                keep_latest: !donated && nbytes <= KEPT_COPY_BYTES,
            },
            _ => Self::Move,
        }
    }
}

/// How an entry's outputs, as the executable gives them (a flat list), become the call's
/// result: `T` is a tree of builtin containers, `U` a treedef's `unflatten`.
#[derive(Debug, PartialEq, Eq)]
pub enum OutputForm<T, U> {
    /// One bare leaf.
    Leaf,
    /// Built by the dispatcher: a tree of builtin containers.
    Builtin(T),
    /// Built by the output treedef's `unflatten`.
    Unflatten(U),
}

impl<T, U> OutputForm<T, U> {
    /// The form of an output treedef of `leaves` leaves and `nodes` nodes: a bare leaf, else
    /// the tree of builtin containers that `builtin` reads where it is one, else `unflatten`.
    pub fn choose<E>(
        leaves: usize,
        nodes: usize,
        builtin: impl FnOnce() -> Result<Option<T>, E>,
        unflatten: impl FnOnce() -> Result<U, E>,
    ) -> Result<Self, E> {
        if leaves == 1 && nodes == 1 {
            return Ok(Self::Leaf);
        }
        Ok(match builtin()? {
            Some(tree) => Self::Builtin(tree),
            None => Self::Unflatten(unflatten()?),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use proptest::prelude::*;

    use super::*;

    type Plan = InputPlan<(), (), (), ()>;

    /// A plan whose kept arguments become `kinds` ("pass", "copy", "move", "host").
    fn plan(num_consts: usize, kept: &[bool], donated: &[bool], kinds: &[&str]) -> Plan {
        let plan: Result<Plan, Infallible> = InputPlan::new(
            num_consts,
            kept,
            donated,
            |j| kinds[j] != "host",
            false,
            |j, _| {
                Ok(match kinds[j] {
                    "pass" => Input::Pass,
                    "copy" => Input::Copy(()),
                    "move" => Input::Move(()),
                    _ => Input::Host(()),
                })
            },
        );
        plan.unwrap()
    }

    #[test]
    fn arrays_on_their_shardings_alone_pass_through() {
        let all = plan(0, &[true, true], &[false, false], &["pass", "pass"]);
        assert!(all.passthrough && all.delegable());
        assert_eq!(all.passed_as_is(2), [(0, 0), (1, 1)]);
        assert!(
            !plan(1, &[true], &[false], &["pass"]).passthrough,
            "a constant"
        );
        assert!(!plan(0, &[true, false], &[false, false], &["pass", "pass"]).passthrough);
        let host = plan(0, &[true, true], &[false, false], &["pass", "host"]);
        assert!(!host.passthrough && host.delegable());
        assert!(plan(0, &[true], &[false], &["copy"]).delegable());
        assert!(!plan(0, &[true, true], &[false, false], &["pass", "move"]).delegable());
    }

    #[test]
    fn a_plan_of_arrays_as_they_are_and_unused_leaves_says_which_it_takes() {
        let pruned = plan(0, &[true, false, true], &[false; 3], &["pass"; 3]);
        assert_eq!(pruned.taken_as_is(), Some(vec![true, false, true]));
        let all = plan(0, &[true, true], &[false, false], &["pass", "pass"]);
        assert_eq!(all.taken_as_is(), Some(vec![true, true]));
        assert_eq!(plan(1, &[true], &[false], &["pass"]).taken_as_is(), None);
        let host = plan(0, &[true, false], &[false, false], &["host", "pass"]);
        assert_eq!(host.taken_as_is(), None);
    }

    #[test]
    fn positions_count_constants_and_skip_dropped_arguments() {
        let mut positions = Vec::new();
        let _: Result<Plan, Infallible> = InputPlan::new(
            2,
            &[true, false, true],
            &[false; 3],
            |_| true,
            false,
            |j, position| {
                positions.push((j, position));
                Ok(Input::Pass)
            },
        );
        assert_eq!(positions, [(0, 2), (2, 3)]);
        let p = plan(
            1,
            &[true, false, true],
            &[false; 3],
            &["pass", "pass", "copy"],
        );
        assert_eq!(p.passed_as_is(3), [(1, 0)]);
        let kinds: Vec<_> = p.inputs.iter().map(Input::kind).collect();
        assert_eq!(kinds, ["pass", "dropped", "copy"]);
    }

    #[test]
    fn only_kept_arrays_are_donated() {
        let p = plan(
            0,
            &[true, false, true],
            &[true, true, true],
            &["pass", "pass", "host"],
        );
        assert_eq!(p.donated, [0]);
    }

    #[test]
    fn a_donated_array_passed_twice_clashes_as_jaxlib_reports_it() {
        let p = plan(0, &[true, true], &[true, false], &["pass", "pass"]);
        let one_object = |_: usize, _: usize| true;
        assert_eq!(
            p.donation_clash(2, one_object),
            Some(DonationClash {
                input: 1,
                first: 0,
                previously_donated: true
            })
        );
        let p = plan(0, &[true, true], &[false, true], &["pass", "pass"]);
        assert_eq!(
            p.donation_clash(2, one_object)
                .map(|c| c.previously_donated),
            Some(false)
        );
        assert_eq!(p.donation_clash(2, |k, j| k == j), None);
    }

    proptest! {
        /// A clash is reported only where a donated leaf passed as it is shares its object with
        /// another leaf passed as it is, and always then.
        #[test]
        fn clashes_need_a_shared_donated_buffer(
            objects in prop::collection::vec(0u8..3, 1..6),
            donated in prop::collection::vec(any::<bool>(), 6),
            copied in prop::collection::vec(any::<bool>(), 6),
        ) {
            let n = objects.len();
            let kinds: Vec<&str> = copied[..n].iter().map(|&c| if c { "copy" } else { "pass" }).collect();
            let p = plan(0, &vec![true; n], &donated[..n], &kinds);
            let same = |k: usize, j: usize| objects[k] == objects[j];
            let expected = (0..n).any(|d| {
                donated[d] && !copied[d]
                    && (0..n).any(|k| k != d && !copied[k] && objects[k] == objects[d])
            });
            let clash = p.donation_clash(n, same);
            prop_assert_eq!(clash.is_some(), expected);
            if let Some(clash) = clash {
                prop_assert!(clash.first < clash.input);
            }
        }
    }

    #[test]
    fn outputs_take_the_cheapest_form_that_builds_them() {
        type Form = OutputForm<&'static str, &'static str>;
        let never = || -> Result<Option<&str>, ()> { Err(()) };
        assert_eq!(Form::choose(1, 1, never, || Err(())), Ok(Form::Leaf));
        let builtin = || Ok::<_, ()>(Some("tuple"));
        assert_eq!(
            Form::choose(2, 3, builtin, || Err(())),
            Ok(Form::Builtin("tuple"))
        );
        let custom = || Ok::<_, ()>(None);
        assert_eq!(
            Form::choose(2, 3, custom, || Ok("unflatten")),
            Ok(Form::Unflatten("unflatten"))
        );
        // A one-leaf tree in a container is no bare leaf.
        assert_eq!(
            Form::choose(1, 2, builtin, || Err(())),
            Ok(Form::Builtin("tuple"))
        );
    }

    #[test]
    fn arrays_pass_copy_or_move_as_jax_says() {
        assert_eq!(ArrayInput::of("pass", false, 8, true), ArrayInput::Pass);
        let small = ArrayInput::of("copy", true, 8, false);
        assert_eq!(small, ArrayInput::Copy { keep_latest: true });
        let large = ArrayInput::of("copy", true, KEPT_COPY_BYTES + 1, false);
        assert_eq!(large, ArrayInput::Copy { keep_latest: false });
        let donated = ArrayInput::of("copy", true, 8, true);
        assert_eq!(donated, ArrayInput::Copy { keep_latest: false });
        // A copy without targets, or anything else, is JAX's move.
        assert_eq!(ArrayInput::of("copy", false, 8, false), ArrayInput::Move);
        assert_eq!(ArrayInput::of("move", false, 8, false), ArrayInput::Move);
    }
}
