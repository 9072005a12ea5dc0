//! The safe API against real daemons (see tests/common for the fixture).

mod common;

use std::sync::Arc;

use common::Cluster;
use devcoord::{Client, Code, Device, Group, GroupOptions, OpKind, OpRequest, Options, ReduceOp};

const A: &str = "node-a/cuda:0";
const B: &str = "node-b/cuda:0";
const DEVICES: &[&str] = &["cuda:0", "cuda:1"];

fn two_nodes() -> Cluster {
    Cluster::start(&[("node-a", DEVICES), ("node-b", DEVICES)])
}

fn pair() -> Vec<devcoord::DeviceRef> {
    vec![Device::Cuda(0).on("node-a"), Device::Cuda(0).on("node-b")]
}

#[test]
fn registry_tensors_and_all_reduce() {
    let cluster = two_nodes();
    let c = cluster.client();
    let mut names: Vec<String> = c.workers().unwrap().into_iter().map(|w| w.name).collect();
    names.sort();
    assert_eq!(names, vec!["node-a", "node-b"]);
    let devices = c.devices().unwrap();
    assert_eq!(
        devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
        vec!["node-a/cuda:0", "node-a/cuda:1", "node-b/cuda:0", "node-b/cuda:1"]
    );
    assert_eq!(devices[1].device, Some(Device::Cuda(1)));
    assert_eq!(c.device("node-b/cuda:1").unwrap().worker, "node-b");
    let status = c.cluster_status().unwrap();
    assert_eq!(status.workers_alive, 2);
    assert!(status.devices_by_backend.contains(&("cuda".to_string(), 4)));

    // every dtype round trips
    c.put(A, "f32", &[1.5f32, -2.25]).unwrap();
    c.put(A, "f64", &[1.0f64 / 3.0, -1e300]).unwrap();
    c.put(A, "i32", &[i32::MIN, i32::MAX]).unwrap();
    c.put_shaped(A, "i64", &[2, 2], &[i64::MIN, i64::MAX, 0, 7]).unwrap();
    assert_eq!(c.get::<f32>(A, "f32").unwrap().data, vec![1.5, -2.25]);
    assert_eq!(c.get::<f64>(A, "f64").unwrap().data, vec![1.0 / 3.0, -1e300]);
    assert_eq!(c.get::<i32>(A, "i32").unwrap().data, vec![i32::MIN, i32::MAX]);
    let t = c.get::<i64>(A, "i64").unwrap();
    assert_eq!((t.shape, t.data), (vec![2, 2], vec![i64::MIN, i64::MAX, 0, 7]));
    assert_eq!(c.get::<f32>(A, "i64").unwrap_err().code, Code::InvalidArgument);
    let listed = c.tensors(A).unwrap();
    let i64_info = listed.iter().find(|t| t.name == "i64").unwrap();
    assert_eq!((i64_info.dtype.as_str(), i64_info.size_bytes), ("i64", 32));

    // all-reduce across the two workers
    c.put(A, "g", &[1.0f32, 2.0, 3.0]).unwrap();
    c.put(B, "g", &[10.0f32, 20.0, 30.0]).unwrap();
    let op = c.submit(&OpRequest::all_reduce(pair(), "g", ReduceOp::Sum)).unwrap();
    assert_eq!((op.kind.as_str(), op.state.as_str(), op.error.clone()), ("all-reduce", "done", None));
    assert_eq!(op.devices, vec![A, B]);
    for d in [A, B] {
        assert_eq!(c.get::<f32>(d, "g").unwrap().data, vec![11.0, 22.0, 33.0]);
    }
    assert_eq!(c.get_op(&op.op_id).unwrap().state, "done");
    assert!(c.list_ops(0).unwrap().iter().any(|o| o.op_id == op.op_id));

    // broadcast from rank 1
    c.submit(&OpRequest::broadcast(pair(), "f32", 0)).unwrap_err(); // not on node-b
    c.put(B, "f32", &[7.0f32, 8.0]).unwrap();
    c.submit(&OpRequest::broadcast(pair(), "f32", 1)).unwrap();
    assert_eq!(c.get::<f32>(A, "f32").unwrap().data, vec![7.0, 8.0]);

    c.delete(A, "f32").unwrap();
    let e = c.get::<f32>(A, "f32").unwrap_err();
    assert_eq!(e.code, Code::NotFound);
    assert!(e.to_string().starts_with("NOT_FOUND: "), "{}", e);

    // operator steering
    assert_eq!(c.cordon("node-b").unwrap().state, "cordoned");
    let e = c.submit(&OpRequest::all_reduce(pair(), "g", ReduceOp::Sum)).unwrap_err();
    assert!(e.message.contains("cordoned"), "{}", e);
    assert_eq!(c.drain("node-b").unwrap().state, "draining");
    assert_eq!(c.cluster_status().unwrap().workers_draining, 1);
    assert_eq!(c.uncordon("node-b").unwrap().state, "alive");
    c.submit(&OpRequest::all_reduce(pair(), "g", ReduceOp::Sum)).unwrap();
    assert_eq!(c.get::<f32>(B, "g").unwrap().data, vec![22.0, 44.0, 66.0]);
    assert_eq!(c.cordon("node-q").unwrap_err().code, Code::NotFound);

    // Three ops done (two all-reduces and a broadcast), one failed (the broadcast of a
    // tensor node-b lacks); the refusal while node-b was cordoned was never an op. list_ops
    // gives the newest first, as many as asked.
    let s = c.cluster_status().unwrap();
    assert_eq!((s.ops_in_flight, s.ops_done, s.ops_failed), (0, 3, 1));
    let newest = c.list_ops(1).unwrap();
    assert_eq!(newest.len(), 1);
    assert_eq!((newest[0].kind.as_str(), newest[0].state.as_str()), ("all-reduce", "done"));
    assert_eq!(c.list_ops(0).unwrap().len(), 4);
}

#[test]
fn nested_autodiff_is_an_err_with_the_servers_message() {
    let cluster = two_nodes();
    let c = cluster.client();
    let once = vec![Device::Cuda(0).autodiff().on("node-a"), Device::Cuda(0).autodiff().on("node-b")];
    let plan = c.plan(&OpRequest::all_reduce(once, "g", ReduceOp::Sum)).unwrap();
    assert_eq!(plan.devices, vec![A, B]);
    let twice = vec![Device::Autodiff(Box::new(Device::Autodiff(Box::new(Device::Cuda(0))))).on("node-a")];
    for req in [OpRequest::all_reduce(twice.clone(), "g", ReduceOp::Sum), OpRequest::new(OpKind::Barrier, twice, "g")] {
        for result in [c.plan(&req), c.submit(&req)] {
            let e = result.unwrap_err();
            assert_eq!(e.code, Code::InvalidArgument);
            assert_eq!(e.device_index, Some(0));
            let text = e.to_string();
            assert!(
                text.starts_with("INVALID_ARGUMENT: autodiff should not wrap an autodiff device: "),
                "{}",
                text
            );
            assert!(text.contains("node-a/autodiff(autodiff(cuda:0))"), "{}", text);
        }
    }
    let unknown = vec![Device::Cuda(0).on("node-z")];
    assert_eq!(c.plan(&OpRequest::all_reduce(unknown, "g", ReduceOp::Sum)).unwrap_err().code, Code::NotFound);
}

#[test]
fn one_client_many_threads() {
    let cluster = two_nodes();
    let c = Arc::new(cluster.client());
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let c = Arc::clone(&c);
            std::thread::spawn(move || {
                let name = format!("t{}", t);
                for i in 0..5 {
                    let v: Vec<f64> = (0..100).map(|k| (t * 1000 + i * 100 + k) as f64).collect();
                    c.put(A, &name, &v).unwrap();
                    assert_eq!(c.get::<f64>(A, &name).unwrap().data, v);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(c.tensors(A).unwrap().len(), 4);
}

#[test]
fn tokens() {
    let cluster = Cluster::start_with(&[("node-a", DEVICES), ("node-b", DEVICES)], true);
    let c = cluster.client(); // the trainer token
    c.put(A, "t", &[1i32, 2]).unwrap();
    c.put(B, "t", &[3i32, 4]).unwrap();
    c.submit(&OpRequest::all_reduce(pair(), "t", ReduceOp::Prod)).unwrap();
    assert_eq!(c.get::<i32>(B, "t").unwrap().data, vec![3, 8]);
    for token in [None, Some("dc-trainer-not-a-token".to_string())] {
        let c = Client::connect_with(&cluster.addr, &Options { token, ..Options::default() }).unwrap();
        let e = c.workers().unwrap_err();
        assert_eq!(e.code, Code::Unauthenticated, "{}", e);
        assert!(!e.transport);
    }
}

#[test]
fn dead_address() {
    let dead = common::DeadAddress::new();
    let addr = dead.addr.clone();
    let e = Client::connect_with(&addr, &Options { fail_fast: true, ..Options::default() }).err().unwrap();
    assert_eq!(e.code, Code::Unavailable);
    assert!(e.transport);
    let c = Client::connect_with(&addr, &Options { timeout_ms: 300, ..Options::default() }).unwrap();
    let e = c.workers().unwrap_err();
    assert!(matches!(e.code, Code::Unavailable | Code::DeadlineExceeded), "{}", e);
    assert_eq!(Client::connect("tcp://").err().unwrap().code, Code::InvalidArgument);
}

/// The n-th (from 1) ```rust block under "## Rust" in the README.
fn readme_block_n(n: usize) -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../README.md")).unwrap();
    let section = readme.split("\n## Rust\n").nth(1).expect("README has a '## Rust' section");
    let section = section.split("\n## ").next().unwrap();
    let block = section.split("```rust\n").nth(n).expect("a ```rust block under '## Rust'");
    block.split("```").next().unwrap().to_string()
}

/// Checks that the README's n-th rust block is in examples/NAME.rs, runs the example against
/// a fresh two-node cluster and returns its standard output.
fn run_readme_example(name: &str, n: usize) -> String {
    let path = format!("{}/examples/{}.rs", env!("CARGO_MANIFEST_DIR"), name);
    let source = std::fs::read_to_string(&path).unwrap();
    let block = readme_block_n(n);
    assert!(block.lines().count() >= 10 && source.contains(&block), "README block not in {}.rs:\n{}", name, block);
    // cargo builds the examples next to the test binaries: target/debug/{deps,examples}
    let exe = std::env::current_exe().unwrap();
    let example = exe.parent().unwrap().parent().unwrap().join("examples").join(name);
    let cluster = two_nodes();
    let out = std::process::Command::new(&example).env("DEVCOORD_ADDR", &cluster.addr).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{:?}: {}{}", example, stdout, String::from_utf8_lossy(&out.stderr));
    stdout
}

#[test]
fn example_all_reduce_is_the_readmes_and_runs() {
    let stdout = run_readme_example("all_reduce", 1);
    assert!(stdout.contains("node-a/cuda:0 grad = [11.0, 22.0, 33.0]\n"), "{}", stdout);
    assert!(stdout.contains("node-b/cuda:0 grad = [11.0, 22.0, 33.0]\n"), "{}", stdout);
    assert!(stdout.contains(": done\n"), "{}", stdout);
    assert!(
        stdout.contains("INVALID_ARGUMENT: autodiff should not wrap an autodiff device: devices[0] = node-a/autodiff(autodiff(cuda:0))"),
        "{}",
        stdout
    );
}

#[test]
fn example_group_train_is_the_readmes_and_runs() {
    let stdout = run_readme_example("group_train", 2);
    // step 0 from w = 0: rank 0's gradient is [-4, -4], rank 1's [-20, -10]; both get the mean
    assert!(stdout.contains("rank 0 step 0 grad [-12.0, -7.0]\n"), "{}", stdout);
    assert!(stdout.contains("rank 1 step 0 grad [-12.0, -7.0]\n"), "{}", stdout);
    for step in 0..5 {
        let line = |r: u32| {
            let prefix = format!("rank {} step {} grad ", r, step);
            stdout.lines().find(|l| l.starts_with(&prefix)).map(|l| l[prefix.len()..].to_string())
        };
        assert_eq!(line(0).expect("rank 0 line"), line(1).expect("rank 1 line"), "{}", stdout);
    }
    assert!(stdout.contains("agree: true\n"), "{}", stdout);
}

/// Runs f(group) on two ranks (threads, one client each) of node-a/cuda:0 and node-b/cuda:0.
fn two_ranks<T: Send>(cluster: &Cluster, f: impl Fn(&mut Group) -> T + Sync) -> Vec<T> {
    let ranks = pair();
    let clients = vec![cluster.client(), cluster.client()];
    std::thread::scope(|s| {
        let threads: Vec<_> = ranks
            .iter()
            .zip(&clients)
            .map(|(me, c)| {
                let (ranks, f) = (&ranks, &f);
                s.spawn(move || {
                    let opts = GroupOptions { timeout_ms: 20000, call_timeout_ms: 10000 };
                    let mut g = Group::join_with(c, ranks, me, &opts).unwrap();
                    f(&mut g)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

#[test]
fn group_every_call_and_a_mismatch() {
    let cluster = two_nodes();
    let out = two_ranks(&cluster, |g| {
        let r = g.rank() as i64;
        assert_eq!((g.size(), g.id().len(), g.devices()), (2, 16, vec![A.to_string(), B.to_string()]));
        assert!(g.generation() >= 1);
        let mut sum = vec![r + 1, 10 * r, -r];
        g.all_reduce(&mut sum, ReduceOp::Sum).unwrap();
        let mut red = vec![r as f64 + 1.5, -2.0];
        g.reduce(&mut red, ReduceOp::Prod, 1).unwrap();
        let mut bc = vec![r as i32 * 7, 1];
        g.broadcast(&mut bc, 1).unwrap();
        let mut gathered = vec![0f32; 4];
        g.all_gather(&[r as f32, 0.5], &mut gathered).unwrap();
        let mut mine = vec![0f64; 2];
        let send: Vec<f64> = (0..4).map(|i| (r + i) as f64).collect();
        g.reduce_scatter(&send, &mut mine, ReduceOp::Max).unwrap();
        g.barrier().unwrap();
        let mut a = vec![r as f32; 3];
        g.scope(|s| s.all_reduce_async(&mut a, ReduceOp::Max).unwrap().wait()).unwrap();
        let local = g.all_gather(&[1.0f32], &mut [0.0f32; 3]).unwrap_err();
        let mut bad = vec![1.0f32; 2 + r as usize];
        let mismatch = g.all_reduce(&mut bad, ReduceOp::Sum).unwrap_err();
        (r, sum, red, bc, gathered, mine, a, local, mismatch)
    });
    for (r, sum, red, bc, gathered, mine, a, local, mismatch) in out {
        assert_eq!(sum, vec![3, 10, -1]);
        assert_eq!(red, if r == 1 { vec![1.5 * 2.5, 4.0] } else { vec![1.5, -2.0] });
        assert_eq!(bc, vec![7, 1]);
        assert_eq!(gathered, vec![0.0, 0.5, 1.0, 0.5]);
        // max over ranks of r + i is 1 + i; rank r gets elements [2r, 2r + 2)
        assert_eq!(mine, vec![1.0 + 2.0 * r as f64, 2.0 + 2.0 * r as f64]);
        assert_eq!(a, vec![1.0; 3]);
        assert_eq!(local.code, Code::InvalidArgument);
        assert!(local.message.contains("recv has 3 elements, expected 2"), "{}", local);
        assert_eq!(mismatch.code, Code::InvalidArgument);
        assert!(mismatch.message.contains("rank 1"), "{}", mismatch);
    }
}

#[test]
fn group_alloc_is_shared_with_the_worker() {
    let cluster = two_nodes();
    let out = two_ranks(&cluster, |g| {
        let r = g.rank() as f32;
        // 5M f32 (20 MiB, more than one message: one call on shared memory, the ring in the
        // rank's block), then a range of it, then i64 of one message.
        let mut big = g.alloc::<f32>(5 << 20).unwrap();
        let zeroed = big.iter().all(|&x| x == 0.0);
        big.iter_mut().enumerate().for_each(|(i, x)| *x = r + (i % 7) as f32);
        g.all_reduce(&mut big, ReduceOp::Sum).unwrap();
        let big_ok = big.iter().enumerate().all(|(i, &x)| x == 1.0 + 2.0 * (i % 7) as f32);
        g.all_reduce(&mut big[1000..3000], ReduceOp::Sum).unwrap();
        // the range doubled (both ranks hold the same values), the rest untouched
        let range_ok = big.iter().enumerate().all(|(i, &x)| {
            x == (1.0 + 2.0 * (i % 7) as f32) * if (1000..3000).contains(&i) { 2.0 } else { 1.0 }
        });
        let mut small = g.alloc::<i64>(3).unwrap();
        small.copy_from_slice(&[r as i64, 5, -(r as i64)]);
        g.broadcast(&mut small, 1).unwrap();
        let shared = (big.is_shared(), small.is_shared());
        (zeroed, big_ok, range_ok, small.to_vec(), shared)
    });
    for (zeroed, big_ok, range_ok, small, shared) in out {
        assert!(zeroed);
        assert!(big_ok);
        assert!(range_ok);
        assert_eq!(small, vec![1, 5, -1]);
        assert_eq!(shared, (true, true));
    }
}

#[test]
fn group_every_async_call_in_flight_at_once() {
    let cluster = two_nodes();
    let out = two_ranks(&cluster, |g| {
        let r = g.rank() as i64;
        let mut sum = vec![r + 1, -r];
        let mut red = vec![r as f64 + 2.0];
        let mut bc = vec![r as i32 * 7; 3];
        let send = [r as f32, 0.5];
        let mut gathered = vec![0f32; 4];
        let rs_send: Vec<f64> = (0..4).map(|i| (r * 10 + i) as f64).collect();
        let mut mine = vec![0f64; 2];
        // Started in this order on every rank, waited for in the reverse one.
        let mut short = [0f32; 3];
        let refused = g.scope(|s| {
            let reqs = vec![
                s.all_reduce_async(&mut sum, ReduceOp::Sum).unwrap(),
                s.reduce_async(&mut red, ReduceOp::Prod, 0).unwrap(),
                s.broadcast_async(&mut bc, 1).unwrap(),
                s.all_gather_async(&send, &mut gathered).unwrap(),
                s.reduce_scatter_async(&rs_send, &mut mine, ReduceOp::Sum).unwrap(),
                s.barrier_async().unwrap(),
            ];
            for req in reqs.into_iter().rev() {
                req.wait().unwrap();
            }
            s.all_gather_async(&send, &mut short).err().map(|e| e.code)
        });
        (r, sum, red, bc, gathered, mine, refused)
    });
    for (r, sum, red, bc, gathered, mine, refused) in out {
        assert_eq!(sum, vec![3, -1]);
        assert_eq!(red, if r == 0 { vec![6.0] } else { vec![3.0] });
        assert_eq!(bc, vec![7; 3]);
        assert_eq!(gathered, vec![0.0, 0.5, 1.0, 0.5]);
        // sum over ranks of r * 10 + i is 10 + 2i; rank r gets elements [2r, 2r + 2)
        assert_eq!(mine, vec![10.0 + 4.0 * r as f64, 12.0 + 4.0 * r as f64]);
        assert_eq!(refused, Some(Code::InvalidArgument));
    }
}

#[test]
fn group_f16_and_bf16() {
    use devcoord::{BF16, F16};
    let cluster = two_nodes();
    let out = two_ranks(&cluster, |g| {
        let r = g.rank() as f32;
        let xs = [1.5 + 0.75 * r, -2.0 * (r + 1.0), 0.1 + 0.1 * r, 60000.0];
        let mut h: Vec<F16> = xs.iter().map(|&x| F16::from_f32(x)).collect();
        g.all_reduce(&mut h, ReduceOp::Sum).unwrap();
        let mut b: Vec<BF16> = xs.iter().map(|&x| BF16::from_f32(x)).collect();
        g.all_reduce(&mut b, ReduceOp::Max).unwrap();
        let mut shared = g.alloc::<F16>(3).unwrap();
        shared.copy_from_slice(&[F16::from(r), F16::from(1.0), F16::from(-r)]);
        g.all_reduce(&mut shared, ReduceOp::Min).unwrap();
        (h, b, shared.to_vec())
    });
    // Reduced in f32, rounded once: the sum of the two ranks' f16 values, rounded.
    let sum = |a: f32, b: f32| F16::from_f32(F16::from_f32(a).to_f32() + F16::from_f32(b).to_f32());
    for (h, b, shared) in out {
        assert_eq!(h, vec![F16::from(3.75), F16::from(-6.0), sum(0.1, 0.2), F16(0x7c00)]);
        assert_eq!(b, vec![BF16::from(2.25), BF16::from(-2.0), BF16::from(0.2), BF16::from(60000.0)]);
        assert_eq!(shared, vec![F16::from(0.0), F16::from(1.0), F16::from(-1.0)]);
    }
}

#[test]
fn group_scope_ends_its_calls_and_test_reports_a_refusal() {
    let cluster = two_nodes();
    let out = two_ranks(&cluster, |g| {
        let r = g.rank() as i64;
        // Rank 1 makes its calls 300 ms late, so rank 0's are in flight when its scopes end:
        // a request leaked with mem::forget, one dropped (which waits), and one left in
        // flight by a panic; each has its result in place once the scope is over.
        if r == 1 {
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        let mut sum = vec![r + 1; 4];
        let mut dropped = vec![10 * (r + 1); 2];
        g.scope(|s| {
            drop(s.all_reduce_async(&mut dropped, ReduceOp::Sum).unwrap());
            std::mem::forget(s.all_reduce_async(&mut sum, ReduceOp::Sum).unwrap());
        });
        let (sum, dropped) = (sum.clone(), dropped.clone()); // as the scope left them
        let mut max = vec![r; 3];
        if r == 1 {
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            g.scope(|s| {
                std::mem::forget(s.all_reduce_async(&mut max, ReduceOp::Max).unwrap());
                if r == 0 {
                    panic!("a rank's step fails with a call in flight");
                }
            })
        }))
        .is_err();
        let max = max.clone(); // as the unwound scope left it
        // Calls that do not match (rank 1 one element longer): test() reports the refusal.
        let mut bad = vec![1.0f32; 2 + r as usize];
        let (polled, waited) = g.scope(|s| {
            let req = s.all_reduce_async(&mut bad, ReduceOp::Sum).unwrap();
            let polled = loop {
                match req.test() {
                    Ok(false) => std::thread::sleep(std::time::Duration::from_millis(5)),
                    Ok(true) => break None,
                    Err(e) => break Some(e),
                }
            };
            (polled, req.wait().err().map(|e| e.code))
        });
        (r, sum, dropped, max, panicked, polled.map(|e| (e.code, e.message.contains("rank 1"))), waited)
    });
    for (r, sum, dropped, max, panicked, polled, waited) in out {
        assert_eq!((sum, dropped, max), (vec![3; 4], vec![30; 2], vec![1; 3]));
        assert_eq!(panicked, r == 0);
        assert_eq!(polled, Some((Code::InvalidArgument, true)));
        assert_eq!(waited, Some(Code::InvalidArgument));
    }
}
