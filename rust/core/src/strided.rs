//! Copies between strided views of host memory: the byte-moving half of shard and unshard.
//!
//! A view is an element offset into a byte buffer plus a shape and byte strides, as numpy
//! describes arrays. Copies coalesce dimensions into the longest contiguous runs, move each run
//! with one `memcpy`, and split large copies over threads.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A strided view of a byte buffer: element `[i, j, ..]` starts at
/// `offset + i * strides[0] + j * strides[1] + ..`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StridedView {
    pub offset: usize,
    pub shape: Vec<usize>,
    pub strides: Vec<isize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyError(pub String);

impl fmt::Display for CopyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CopyError {}

impl StridedView {
    /// The C-ordered view of a whole array of `shape` with elements of `itemsize` bytes.
    pub fn contiguous(shape: &[usize], itemsize: usize) -> Self {
        let mut strides = vec![0isize; shape.len()];
        let mut step = itemsize as isize;
        for axis in (0..shape.len()).rev() {
            strides[axis] = step;
            step *= shape[axis].max(1) as isize;
        }
        Self {
            offset: 0,
            shape: shape.to_vec(),
            strides,
        }
    }

    /// The sub-block `[start, stop)` of each dimension.
    pub fn block(&self, bounds: &[(usize, usize)]) -> Result<Self, CopyError> {
        let mut block = Self {
            offset: 0,
            shape: Vec::with_capacity(bounds.len()),
            strides: Vec::new(),
        };
        self.block_into(bounds, &mut block)?;
        Ok(block)
    }

    /// `block`, written over `out` so that its vectors are reused.
    fn block_into(&self, bounds: &[(usize, usize)], out: &mut Self) -> Result<(), CopyError> {
        if bounds.len() != self.shape.len() {
            return Err(CopyError(format!(
                "a block of rank {} taken from a view of rank {}",
                bounds.len(),
                self.shape.len()
            )));
        }
        let mut offset = self.offset as isize;
        out.shape.clear();
        for ((&(start, stop), &size), &stride) in bounds.iter().zip(&self.shape).zip(&self.strides)
        {
            if start > stop || stop > size {
                return Err(CopyError(format!(
                    "block bounds {start}..{stop} fall outside a dimension of size {size}"
                )));
            }
            offset += start as isize * stride;
            out.shape.push(stop - start);
        }
        out.offset = usize::try_from(offset)
            .map_err(|_| CopyError("a block starts before its buffer".to_owned()))?;
        out.strides.clone_from(&self.strides);
        Ok(())
    }

    pub fn num_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// The byte range `[lo, hi)` that the view touches, or `None` if it is empty.
    fn extent(&self, itemsize: usize) -> Result<Option<(usize, usize)>, CopyError> {
        if self.num_elements() == 0 {
            return Ok(None);
        }
        let (below, above) = self.reach();
        let lo = usize::try_from(self.offset as isize + below)
            .map_err(|_| CopyError("a view reaches before its buffer".to_owned()))?;
        Ok(Some((lo, self.offset + above + itemsize)))
    }

    /// How far the elements reach before and after the first one, in bytes (negative strides
    /// reach before it).
    fn reach(&self) -> (isize, usize) {
        let (mut below, mut above) = (0isize, 0usize);
        for (&size, &stride) in self.shape.iter().zip(&self.strides) {
            let reach = (size as isize - 1) * stride;
            if reach < 0 {
                below += reach;
            } else {
                above += reach as usize;
            }
        }
        (below, above)
    }

    /// The view of an array of `shape` and byte `strides` within the bytes it spans, and their
    /// number: the array's first element sits `offset` bytes into them (past the elements that
    /// negative strides put before it).
    pub fn spanning(shape: Vec<usize>, strides: Vec<isize>, itemsize: usize) -> (Self, usize) {
        let mut view = Self {
            offset: 0,
            shape,
            strides,
        };
        if view.num_elements() == 0 {
            return (view, 0);
        }
        let (below, above) = view.reach();
        view.offset = below.unsigned_abs();
        let len = view.offset + above + itemsize;
        (view, len)
    }

    fn check_within(&self, len: usize, itemsize: usize, what: &str) -> Result<(), CopyError> {
        match self.extent(itemsize)? {
            Some((_, hi)) if hi > len => Err(CopyError(format!(
                "the {what} view reaches byte {hi} of a buffer of {len} bytes"
            ))),
            _ => Ok(()),
        }
    }
}

/// Dimensions merged where both views step through them contiguously; size-1 dims dropped.
/// Written into `shape`, `s` and `d` (the source's and destination's strides).
fn coalesce(
    src: &StridedView,
    dst: &StridedView,
    shape: &mut Vec<usize>,
    s: &mut Vec<isize>,
    d: &mut Vec<isize>,
) {
    shape.clear();
    s.clear();
    d.clear();
    for axis in 0..src.shape.len() {
        let (size, ss, ds) = (src.shape[axis], src.strides[axis], dst.strides[axis]);
        if size == 1 {
            continue;
        }
        if let (Some(last_size), Some(last_s), Some(last_d)) =
            (shape.last_mut(), s.last_mut(), d.last_mut())
        {
            if *last_s == ss * size as isize && *last_d == ds * size as isize {
                *last_size *= size;
                *last_s = ss;
                *last_d = ds;
                continue;
            }
        }
        shape.push(size);
        s.push(ss);
        d.push(ds);
    }
}

/// Bytes above which a copy is split over threads.
const PARALLEL_BYTES: usize = 8 << 20;

/// Checks that two views of equal shape lie inside buffers of `src_len` and `dst_len` bytes,
/// that the destination writes no byte twice, and plans the copy.
fn plan(
    src_len: usize,
    src_view: &StridedView,
    dst_len: usize,
    dst_view: &StridedView,
    itemsize: usize,
) -> Result<Plan, CopyError> {
    let mut plan = Plan::default();
    plan_into(
        &mut plan,
        &mut Vec::new(),
        (src_len, src_view),
        (dst_len, dst_view),
        itemsize,
    )?;
    Ok(plan)
}

/// `plan`, written over `out` (and `scratch`) so that their vectors are reused.
fn plan_into(
    out: &mut Plan,
    scratch: &mut Vec<(usize, usize)>,
    (src_len, src_view): (usize, &StridedView),
    (dst_len, dst_view): (usize, &StridedView),
    itemsize: usize,
) -> Result<(), CopyError> {
    if src_view.shape != dst_view.shape {
        return Err(CopyError(format!(
            "cannot copy a view of shape {:?} into one of shape {:?}",
            src_view.shape, dst_view.shape
        )));
    }
    src_view.check_within(src_len, itemsize, "source")?;
    dst_view.check_within(dst_len, itemsize, "destination")?;
    coalesce(
        src_view,
        dst_view,
        &mut out.shape,
        &mut out.src_strides,
        &mut out.dst_strides,
    );
    out.elements = src_view.num_elements();
    if out.elements > 0 {
        check_no_self_overlap(&out.shape, &out.dst_strides, itemsize, scratch)?;
    }
    out.itemsize = itemsize;
    out.src_offset = src_view.offset;
    out.dst_offset = dst_view.offset;
    Ok(())
}

/// Copies the elements of `src_view` over `src` into `dst_view` over `dst`.
///
/// Both views must have the same shape and lie inside their buffers, and `dst_view` must not
/// write any byte twice (no zero or overlapping strides); all of this is checked.
pub fn copy(
    src: &[u8],
    src_view: &StridedView,
    dst: &mut [u8],
    dst_view: &StridedView,
    itemsize: usize,
    max_threads: usize,
) -> Result<(), CopyError> {
    let plan = plan(src.len(), src_view, dst.len(), dst_view, itemsize)?;
    let threads = if plan.bytes() >= PARALLEL_BYTES {
        max_threads
    } else {
        1
    };
    // SAFETY: `plan` checked the extents of both views against their buffers.
    unsafe {
        run_shared(
            std::slice::from_ref(&plan),
            &[(SendPtr(src.as_ptr().cast_mut()), SendPtr(dst.as_mut_ptr()))],
            threads,
        );
    }
    Ok(())
}

/// Bytes of one unit of shared work. Threads claim units in turn, so that one slowed down (by
/// another process on its core, say) holds the others up by one unit at most, where fixed
/// shares would leave them waiting for all of its share.
const UNIT_BYTES: usize = 2 << 20;

/// Runs `plans` (each from its source into its destination, paired in `buffers`) on up to
/// `max_threads` threads (at most 16), the calling thread one of them, in units of about
/// `UNIT_BYTES` claimed in turn.
///
/// # Safety
/// Each plan was checked against its buffers, and no two write the same byte.
unsafe fn run_shared(plans: &[Plan], buffers: &[(SendPtr, SendPtr)], max_threads: usize) {
    let mut units: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
    for (i, plan) in plans.iter().enumerate() {
        let outer = plan.shape.first().copied().unwrap_or(1);
        let step = (UNIT_BYTES / (plan.bytes() / outer.max(1)).max(1)).max(1);
        units.extend(
            (0..outer)
                .step_by(step)
                .map(|start| (i, start..(start + step).min(outer))),
        );
    }
    let threads = max_threads.clamp(1, 16).min(units.len());
    let next = AtomicUsize::new(0);
    let work = || {
        while let Some((i, outer)) = units.get(next.fetch_add(1, Ordering::Relaxed)) {
            // SAFETY: per this function's contract; units are disjoint outer slices of plans
            // that write disjoint bytes.
            let (src, dst) = buffers[*i];
            unsafe { plans[*i].run(src.get(), dst.get(), outer.clone()) };
        }
    };
    if threads <= 1 {
        work();
        return;
    }
    std::thread::scope(|scope| {
        for _ in 1..threads {
            scope.spawn(work);
        }
        work();
    });
}

/// One shard to place into a whole array: its bytes, the view of them, and the block of the
/// array (`[start, stop)` per dimension) that it fills.
pub struct Placement<'a> {
    pub src: &'a [u8],
    pub view: StridedView,
    pub bounds: Vec<(usize, usize)>,
}

/// Copies every placement into its block of `dst`, a C-ordered array of `shape`.
///
/// Blocks must not overlap (checked). Large work is shared by up to `max_threads` threads, in
/// units of rows of the shards. On an error, `dst` may be partly written.
pub fn assemble(
    dst: &mut [u8],
    shape: &[usize],
    itemsize: usize,
    placements: &[Placement<'_>],
    max_threads: usize,
) -> Result<(), CopyError> {
    let whole = StridedView::contiguous(shape, itemsize);
    let needed = whole.num_elements() * itemsize;
    if dst.len() != needed {
        return Err(CopyError(format!(
            "the destination has {} bytes, but an array of shape {shape:?} needs {needed}",
            dst.len()
        )));
    }
    check_disjoint(placements)?;
    let total: usize = placements
        .iter()
        .map(|p| p.view.num_elements() * itemsize)
        .sum();
    if total < PARALLEL_BYTES {
        // One thread: each shard is checked and copied in turn, reusing one plan's memory
        // (small arrays of many shards would otherwise spend longer allocating than copying).
        let mut block = StridedView::contiguous(&[], itemsize);
        let mut plan = Plan::default();
        let mut scratch = Vec::new();
        for p in placements {
            whole.block_into(&p.bounds, &mut block)?;
            plan_into(
                &mut plan,
                &mut scratch,
                (p.src.len(), &p.view),
                (dst.len(), &block),
                itemsize,
            )?;
            let outer = plan.shape.first().copied().unwrap_or(1);
            // SAFETY: the plan was checked against both buffers, and the blocks are disjoint.
            unsafe { plan.run(p.src.as_ptr(), dst.as_mut_ptr(), 0..outer) };
        }
        return Ok(());
    }
    let plans = placements
        .iter()
        .map(|p| {
            plan(
                p.src.len(),
                &p.view,
                dst.len(),
                &whole.block(&p.bounds)?,
                itemsize,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let buffers: Vec<(SendPtr, SendPtr)> = placements
        .iter()
        .map(|p| {
            (
                SendPtr(p.src.as_ptr().cast_mut()),
                SendPtr(dst.as_mut_ptr()),
            )
        })
        .collect();
    // SAFETY: each plan was checked against its buffers, and the blocks are disjoint.
    unsafe {
        run_shared(&plans, &buffers, max_threads);
    }
    Ok(())
}

/// Copies block `blocks[i]` of `src_view` over `src` into `dsts[i]`, C-ordered: the inverse of
/// `assemble`. Large work is shared by up to `max_threads` threads, in units of rows.
pub fn scatter(
    src: &[u8],
    src_view: &StridedView,
    itemsize: usize,
    blocks: &[Vec<(usize, usize)>],
    dsts: &mut [&mut [u8]],
    max_threads: usize,
) -> Result<(), CopyError> {
    if blocks.len() != dsts.len() {
        return Err(CopyError(format!(
            "{} blocks scattered into {} destinations",
            blocks.len(),
            dsts.len()
        )));
    }
    let plans = blocks
        .iter()
        .zip(dsts.iter())
        .map(|(bounds, dst)| {
            let block = src_view.block(bounds)?;
            let into = StridedView::contiguous(&block.shape, itemsize);
            plan(src.len(), &block, dst.len(), &into, itemsize)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let total: usize = plans.iter().map(Plan::bytes).sum();
    let threads = if total >= PARALLEL_BYTES {
        max_threads
    } else {
        1
    };
    let buffers: Vec<(SendPtr, SendPtr)> = dsts
        .iter_mut()
        .map(|dst| (SendPtr(src.as_ptr().cast_mut()), SendPtr(dst.as_mut_ptr())))
        .collect();
    // SAFETY: each plan was checked against its buffers; the destinations are distinct
    // mutable slices, so no two plans write the same byte.
    unsafe {
        run_shared(&plans, &buffers, threads);
    }
    Ok(())
}

/// Errors if any two placements' blocks share an element.
fn check_disjoint(placements: &[Placement<'_>]) -> Result<(), CopyError> {
    for (i, a) in placements.iter().enumerate() {
        for b in &placements[..i] {
            let overlap = a
                .bounds
                .iter()
                .zip(&b.bounds)
                .all(|(&(a0, a1), &(b0, b1))| a0.max(b0) < a1.min(b1));
            if overlap && !a.bounds.is_empty() {
                return Err(CopyError(format!(
                    "shards for blocks {:?} and {:?} overlap",
                    b.bounds, a.bounds
                )));
            }
        }
    }
    Ok(())
}

/// Errors unless distinct elements of the (coalesced) destination land on distinct bytes.
fn check_no_self_overlap(
    shape: &[usize],
    strides: &[isize],
    itemsize: usize,
    dims: &mut Vec<(usize, usize)>,
) -> Result<(), CopyError> {
    // Sorted by stride magnitude, each stride must clear the whole extent of the smaller ones.
    dims.clear();
    dims.extend(
        shape
            .iter()
            .zip(strides)
            .map(|(&n, &s)| (s.unsigned_abs(), n)),
    );
    dims.sort_unstable();
    let mut reach = itemsize;
    for &(stride, size) in dims.iter() {
        if stride < reach {
            return Err(CopyError(
                "the destination view writes some bytes more than once".to_owned(),
            ));
        }
        reach += stride * (size - 1);
    }
    Ok(())
}

#[derive(Clone, Copy)]
struct SendPtr(*mut u8);
// SAFETY: only used to hand disjoint regions of one buffer to scoped threads.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// Read through a method so that closures capture the `Send` wrapper, not the raw field.
    fn get(self) -> *mut u8 {
        self.0
    }
}

/// A checked copy between two coalesced views, relative to their buffers' starts.
#[derive(Default)]
struct Plan {
    shape: Vec<usize>,
    src_strides: Vec<isize>,
    dst_strides: Vec<isize>,
    itemsize: usize,
    src_offset: usize,
    dst_offset: usize,
    elements: usize,
}

impl Plan {
    fn bytes(&self) -> usize {
        self.elements * self.itemsize
    }

    /// Copies outer indices `outer` of the views over the buffers starting at `src` and `dst`.
    ///
    /// # Safety
    /// The buffers must be those the plan was checked against, valid to read (src) and write
    /// (dst), not overlapping each other, and no other thread may write the same bytes.
    unsafe fn run(&self, src: *const u8, dst: *mut u8, outer: std::ops::Range<usize>) {
        if self.elements == 0 {
            return;
        }
        let (src, dst) = (src.add(self.src_offset), dst.add(self.dst_offset));
        let ndim = self.shape.len();
        if ndim == 0 {
            std::ptr::copy_nonoverlapping(src, dst, self.itemsize);
            return;
        }
        let inner_contiguous = self.src_strides[ndim - 1] == self.itemsize as isize
            && self.dst_strides[ndim - 1] == self.itemsize as isize;
        // The innermost dim is one memcpy when both sides are contiguous in it.
        let (loop_dims, run_bytes) = if inner_contiguous {
            (ndim - 1, self.shape[ndim - 1] * self.itemsize)
        } else {
            (ndim, self.itemsize)
        };
        if loop_dims == 0 {
            // One contiguous dimension: the outer range is a range of its items.
            let start = outer.start * self.itemsize;
            let len = (outer.end.min(self.shape[0]) - outer.start) * self.itemsize;
            std::ptr::copy_nonoverlapping(src.add(start), dst.add(start), len);
            return;
        }
        // Most arrays have few dimensions: their odometer lives on the stack.
        let mut on_stack = [0usize; 8];
        let mut on_heap = Vec::new();
        let counter: &mut [usize] = if loop_dims <= on_stack.len() {
            &mut on_stack[..loop_dims]
        } else {
            on_heap.resize(loop_dims, 0);
            &mut on_heap
        };
        counter[0] = outer.start;
        let mut s = src.offset(outer.start as isize * self.src_strides[0]);
        let mut d = dst.offset(outer.start as isize * self.dst_strides[0]);
        loop {
            std::ptr::copy_nonoverlapping(s, d, run_bytes);
            // Odometer increment; dimension 0 stops at `outer.end`.
            let mut axis = loop_dims;
            loop {
                if axis == 0 {
                    return;
                }
                axis -= 1;
                counter[axis] += 1;
                s = s.offset(self.src_strides[axis]);
                d = d.offset(self.dst_strides[axis]);
                let limit = if axis == 0 {
                    outer.end
                } else {
                    self.shape[axis]
                };
                if counter[axis] < limit {
                    break;
                }
                if axis == 0 {
                    return;
                }
                s = s.offset(-(self.src_strides[axis] * counter[axis] as isize));
                d = d.offset(-(self.dst_strides[axis] * counter[axis] as isize));
                counter[axis] = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(values: &[u32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_ne_bytes()).collect()
    }

    fn words(bytes: &[u8]) -> Vec<u32> {
        bytes
            .chunks_exact(4)
            .map(|c| u32::from_ne_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn a_run_copies_only_its_outer_range() {
        // Units of shared work are outer ranges, down to one contiguous dimension.
        let src = bytes(&(0..16).collect::<Vec<u32>>());
        for shape in [vec![16], vec![4, 4], vec![2, 8]] {
            let view = StridedView::contiguous(&shape, 4);
            let plan = plan(src.len(), &view, src.len(), &view, 4).unwrap();
            let outer = plan.shape[0];
            let mut dst = vec![0xffu8; src.len()];
            // SAFETY: the plan was checked against both buffers.
            unsafe { plan.run(src.as_ptr(), dst.as_mut_ptr(), 1..outer / 2) };
            let per_outer = 16 / u32::try_from(outer).unwrap();
            let half = u32::try_from(outer / 2).unwrap();
            let expected: Vec<u32> = (0..16u32)
                .map(|i| {
                    if (per_outer..half * per_outer).contains(&i) {
                        i
                    } else {
                        u32::MAX
                    }
                })
                .collect();
            assert_eq!(words(&dst), expected, "{shape:?}");
        }
    }

    #[test]
    fn block_of_a_matrix_is_copied_out() {
        // 4x6 matrix of 0..24; take rows 1..3, cols 2..5.
        let src = bytes(&(0..24).collect::<Vec<_>>());
        let view = StridedView::contiguous(&[4, 6], 4)
            .block(&[(1, 3), (2, 5)])
            .unwrap();
        let mut dst = vec![0u8; 6 * 4];
        copy(
            &src,
            &view,
            &mut dst,
            &StridedView::contiguous(&[2, 3], 4),
            4,
            1,
        )
        .unwrap();
        assert_eq!(words(&dst), vec![8, 9, 10, 14, 15, 16]);
    }

    #[test]
    fn block_is_copied_back_in() {
        let shard = bytes(&[1, 2, 3, 4]);
        let mut full = vec![0u8; 16 * 4];
        let place = StridedView::contiguous(&[4, 4], 4)
            .block(&[(2, 4), (0, 2)])
            .unwrap();
        copy(
            &shard,
            &StridedView::contiguous(&[2, 2], 4),
            &mut full,
            &place,
            4,
            1,
        )
        .unwrap();
        let out = words(&full);
        assert_eq!((out[8], out[9], out[12], out[13]), (1, 2, 3, 4));
        assert_eq!(out.iter().filter(|&&v| v != 0).count(), 4);
    }

    #[test]
    fn transposed_and_reversed_sources() {
        // A 3x2 Fortran-ordered view of a 2x3 buffer [[0,1,2],[3,4,5]] (its transpose).
        let src = bytes(&[0, 1, 2, 3, 4, 5]);
        let transposed = StridedView {
            offset: 0,
            shape: vec![3, 2],
            strides: vec![4, 12],
        };
        let mut dst = vec![0u8; 24];
        copy(
            &src,
            &transposed,
            &mut dst,
            &StridedView::contiguous(&[3, 2], 4),
            4,
            1,
        )
        .unwrap();
        assert_eq!(words(&dst), vec![0, 3, 1, 4, 2, 5]);
        let reversed = StridedView {
            offset: 20,
            shape: vec![6],
            strides: vec![-4],
        };
        copy(
            &src,
            &reversed,
            &mut dst,
            &StridedView::contiguous(&[6], 4),
            4,
            1,
        )
        .unwrap();
        assert_eq!(words(&dst), vec![5, 4, 3, 2, 1, 0]);
    }

    #[test]
    fn threads_give_the_same_bytes() {
        let n = (PARALLEL_BYTES / 4) * 2 + 7;
        let src = bytes(&(0..n as u32).collect::<Vec<_>>());
        let rows = n / 7;
        let view = StridedView::contiguous(&[rows, 7], 4);
        let mut one = vec![0u8; rows * 7 * 4];
        let mut many = vec![0u8; rows * 7 * 4];
        let strided = StridedView {
            offset: 0,
            shape: vec![rows, 7],
            strides: vec![28, 4],
        };
        copy(&src, &strided, &mut one, &view, 4, 1).unwrap();
        copy(&src, &strided, &mut many, &view, 4, 4).unwrap();
        assert_eq!(one, many);
        assert_eq!(&words(&one)[..3], &[0, 1, 2]);
    }

    #[test]
    fn scalars_and_empty_views() {
        let src = bytes(&[42]);
        let mut dst = vec![0u8; 4];
        copy(
            &src,
            &StridedView::contiguous(&[], 4),
            &mut dst,
            &StridedView::contiguous(&[], 4),
            4,
            1,
        )
        .unwrap();
        assert_eq!(words(&dst), vec![42]);
        let empty = StridedView::contiguous(&[0, 3], 4);
        copy(&[], &empty, &mut [], &empty, 4, 1).unwrap();
    }

    #[test]
    fn out_of_bounds_and_overlapping_views_are_rejected() {
        let src = bytes(&[0, 1, 2, 3]);
        let mut dst = vec![0u8; 16];
        let too_long = StridedView::contiguous(&[5], 4);
        assert!(copy(&src, &too_long, &mut [0u8; 20], &too_long, 4, 1).is_err());
        let broadcast = StridedView {
            offset: 0,
            shape: vec![4],
            strides: vec![0],
        };
        assert!(copy(
            &src,
            &StridedView::contiguous(&[4], 4),
            &mut dst,
            &broadcast,
            4,
            1
        )
        .is_err());
        // A broadcast source is fine: reading a byte twice is harmless.
        copy(
            &src,
            &broadcast,
            &mut dst,
            &StridedView::contiguous(&[4], 4),
            4,
            1,
        )
        .unwrap();
        assert_eq!(words(&dst), vec![0, 0, 0, 0]);
        assert!(StridedView::contiguous(&[4], 4).block(&[(2, 5)]).is_err());
    }

    #[test]
    fn assemble_places_every_shard() {
        // A 4x4 array from four 2x2 shards, one of them Fortran-ordered.
        let shards: Vec<Vec<u8>> = (0..4u32)
            .map(|k| bytes(&[k * 10, k * 10 + 1, k * 10 + 2, k * 10 + 3]))
            .collect();
        let c = StridedView::contiguous(&[2, 2], 4);
        let f = StridedView {
            offset: 0,
            shape: vec![2, 2],
            strides: vec![4, 8],
        };
        let placements: Vec<Placement> = shards
            .iter()
            .enumerate()
            .map(|(k, src)| Placement {
                src,
                view: if k == 3 { f.clone() } else { c.clone() },
                bounds: vec![
                    ((k / 2) * 2, (k / 2) * 2 + 2),
                    ((k % 2) * 2, (k % 2) * 2 + 2),
                ],
            })
            .collect();
        for threads in [1, 4] {
            let mut dst = vec![0u8; 64];
            assemble(&mut dst, &[4, 4], 4, &placements, threads).unwrap();
            assert_eq!(
                words(&dst),
                vec![0, 1, 10, 11, 2, 3, 12, 13, 20, 21, 30, 32, 22, 23, 31, 33]
            );
        }
    }

    #[test]
    fn assemble_rejects_overlaps_and_bad_sizes() {
        let src = bytes(&[1, 2]);
        let view = StridedView::contiguous(&[2], 4);
        let same = |bounds: Vec<(usize, usize)>| Placement {
            src: &src,
            view: view.clone(),
            bounds,
        };
        let mut dst = vec![0u8; 12];
        assert!(assemble(
            &mut dst,
            &[3],
            4,
            &[same(vec![(0, 2)]), same(vec![(1, 3)])],
            1
        )
        .is_err());
        assert!(assemble(&mut dst, &[4], 4, &[same(vec![(0, 2)])], 1).is_err());
        assert!(assemble(&mut dst, &[3], 4, &[same(vec![(0, 3)])], 1).is_err());
    }

    #[test]
    fn large_assembly_uses_threads_and_matches() {
        let rows = PARALLEL_BYTES / (64 * 4) + 8;
        let half = rows / 2;
        let top = bytes(&(0..(half * 64) as u32).collect::<Vec<_>>());
        let bottom = bytes(
            &(0..((rows - half) * 64) as u32)
                .map(|v| v + 7)
                .collect::<Vec<_>>(),
        );
        let placements = [
            Placement {
                src: &top,
                view: StridedView::contiguous(&[half, 64], 4),
                bounds: vec![(0, half), (0, 64)],
            },
            Placement {
                src: &bottom,
                view: StridedView::contiguous(&[rows - half, 64], 4),
                bounds: vec![(half, rows), (0, 64)],
            },
        ];
        let mut one = vec![0u8; rows * 64 * 4];
        let mut two = vec![0u8; rows * 64 * 4];
        assemble(&mut one, &[rows, 64], 4, &placements, 1).unwrap();
        assemble(&mut two, &[rows, 64], 4, &placements, 2).unwrap();
        assert_eq!(one, two);
        assert_eq!(words(&one)[half * 64], 7);
    }
}
