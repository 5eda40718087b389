//! Criterion benchmarks of the pure core: index maps of large meshes, and shard copies.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::convert::Infallible;
use std::hint::black_box;

use fastpjit_core::dispatch::EntryCache;
use fastpjit_core::strided::{copy, StridedView};
use fastpjit_core::BoundedMap;
use fastpjit_core::{IndexMap, MeshAxes, NamedSpec};

fn index_maps(c: &mut Criterion) {
    let mut group = c.benchmark_group("index_map");
    // One tile per device (`P('x', 'y')`); tiles copied along `x` (`P('y')`), whose device
    // order is a transposed iota; one tile per device out of order (`P('y', 'x')`).
    let specs = [
        (
            "xy",
            NamedSpec::new(vec![vec!["x".into()], vec!["y".into()]]),
        ),
        ("y", NamedSpec::new(vec![vec!["y".into()]])),
        (
            "yx",
            NamedSpec::new(vec![vec!["y".into()], vec!["x".into()]]),
        ),
    ];
    for (sizes, shape) in [
        ([2usize, 4], [64usize, 64]),
        ([64, 64], [4096, 4096]),
        ([128, 256], [8192, 8192]),
    ] {
        let devices: usize = sizes.iter().product();
        let mesh = MeshAxes::new(vec!["x".into(), "y".into()], sizes.to_vec()).unwrap();
        group.throughput(Throughput::Elements(devices as u64));
        for (name, spec) in &specs {
            group.bench_with_input(BenchmarkId::new(*name, devices), &devices, |b, &n| {
                b.iter(|| {
                    let layout = spec.to_layout(&mesh, 2, None).unwrap();
                    let map = IndexMap::new(&layout, &shape, n).unwrap();
                    let mut out = vec![0i64; n * 4];
                    map.write_bounds(&mut out);
                    out
                });
            });
        }
    }
    group.finish();
}

fn shard_copies(c: &mut Criterion) {
    let mut group = c.benchmark_group("copy_rows_of_8192x1024_f32");
    let shape = [8192usize, 1024];
    let src = vec![1u8; shape[0] * shape[1] * 4];
    let full = StridedView::contiguous(&shape, 4);
    let block = full.block(&[(0, 1024), (0, 1024)]).unwrap();
    let mut dst = vec![0u8; 1024 * 1024 * 4];
    let out = StridedView::contiguous(&[1024, 1024], 4);
    group.throughput(Throughput::Bytes(dst.len() as u64));
    for threads in [1usize, 2] {
        group.bench_with_input(BenchmarkId::new("threads", threads), &threads, |b, &t| {
            b.iter(|| copy(&src, &block, &mut dst, &out, 4, t).unwrap());
        });
    }
    group.finish();
}

/// The dispatcher's lookups of a call: the latest entry (a repeated call), a recent one (calls
/// that alternate), an entry by hash among many, and a memo hit.
fn cache_lookups(c: &mut Criterion) {
    let mut group = c.benchmark_group("dispatch_cache");
    let cache: EntryCache<u64, ()> = EntryCache::new(4096);
    for signature in 0..1024u64 {
        let miss = cache.begin_miss(signature, signature);
        miss.entry.set_outcome(());
        cache.end_miss(&miss, true);
    }
    let matches = |wanted: u64| move |s: &u64| Ok::<_, Infallible>(*s == wanted);
    group.bench_function("latest", |b| {
        b.iter(|| {
            let latest = cache.latest();
            let found = cache.probe_recent(latest.as_ref(), matches(black_box(1023)));
            cache.hit(found.unwrap().as_ref().unwrap(), latest.as_ref());
        });
    });
    group.bench_function("recent", |b| {
        b.iter(|| {
            let latest = cache.latest();
            let found = cache.probe_recent(latest.as_ref(), matches(black_box(1020)));
            black_box(found.unwrap().is_some())
        });
    });
    group.bench_function("by_hash", |b| {
        b.iter(|| black_box(cache.lookup(black_box(17), matches(17)).unwrap().is_some()));
    });
    let mut memo = BoundedMap::<usize, usize>::new(8192);
    for address in 0..4096usize {
        let _ = memo.insert(address * 64, address);
    }
    group.bench_function("memo", |b| {
        b.iter(|| black_box(memo.get(&black_box(64 * 1000))));
    });
    group.finish();
}

criterion_group!(benches, index_maps, shard_copies, cache_lookups);
criterion_main!(benches);
