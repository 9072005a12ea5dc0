//! Two ranks as threads of one process, as burn runs one per device: each computes the
//! gradient of a linear model on its own data and averages it with the other through a
//! devcoord group, for a few steps; both end with the same weights. Against the quickstart's
//! cluster ($DEVCOORD_ADDR or tcp://127.0.0.1:7400); tests/cluster.rs runs it.
//!
//!     cargo run --offline --example group_train

use devcoord::{Client, Device, Group, ReduceOp};

/// The gradient of the mean squared error of w on rank `rank`'s data (y = 2x + rank).
fn gradient(w: &[f32], rank: u32, step: usize) -> Vec<f32> {
    let x = 1.0 + (step % 3) as f32 + rank as f32;
    let err = w[0] * x + w[1] - (2.0 * x + rank as f32);
    vec![2.0 * err * x, 2.0 * err]
}

fn main() -> Result<(), devcoord::Error> {
    let address = std::env::var("DEVCOORD_ADDR").unwrap_or_else(|_| "tcp://127.0.0.1:7400".into());
    let client = Client::connect(&address)?;
    let ranks = vec![Device::Cuda(0).on("node-a"), Device::Cuda(0).on("node-b")];
    let weights = std::thread::scope(|s| {
        let threads: Vec<_> = ranks.iter().map(|me| s.spawn(|| {
            let group = Group::join(&client, &ranks, me)?;
            let mut w = vec![0.0f32; 2];
            for step in 0..5 {
                let mut grad = gradient(&w, group.rank(), step);
                group.all_reduce(&mut grad, ReduceOp::Mean)?; // in place, every rank
                w.iter_mut().zip(&grad).for_each(|(w, g)| *w -= 0.05 * g);
                println!("rank {} step {} grad {:?}", group.rank(), step, grad);
            }
            Ok::<_, devcoord::Error>(w)
        })).collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect::<Result<Vec<_>, _>>()
    })?;
    println!("weights {:?} {:?} agree: {}", weights[0], weights[1], weights[0] == weights[1]);
    Ok(())
}
