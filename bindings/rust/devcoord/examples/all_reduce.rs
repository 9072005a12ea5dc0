//! The README's Rust example: puts a tensor on node-a/cuda:0 and node-b/cuda:0 (the
//! quickstart's cluster, at $DEVCOORD_ADDR or tcp://127.0.0.1:7400), all-reduces them, prints
//! the result, and shows a refused device list coming back as an Err. tests/cluster.rs runs it.
//!
//!     cargo run --offline --example all_reduce

use devcoord::{Client, Device, OpRequest, ReduceOp};

fn main() -> Result<(), devcoord::Error> {
    let address = std::env::var("DEVCOORD_ADDR").unwrap_or_else(|_| "tcp://127.0.0.1:7400".into());
    let client = Client::connect(&address)?;
    let ranks = vec![Device::Cuda(0).on("node-a"), Device::Cuda(0).on("node-b")];
    client.put(&ranks[0].to_string(), "grad", &[1.0f32, 2.0, 3.0])?;
    client.put(&ranks[1].to_string(), "grad", &[10.0f32, 20.0, 30.0])?;
    let op = client.submit(&OpRequest::all_reduce(ranks.clone(), "grad", ReduceOp::Sum))?;
    for d in &ranks {
        println!("{} grad = {:?}", d, client.get::<f32>(&d.to_string(), "grad")?.data);
    }
    println!("op {}: {}", op.op_id, op.state);
    let nested = vec![Device::Cuda(0).autodiff().autodiff().on("node-a")]; // burn's bug
    let err = client.plan(&OpRequest::all_reduce(nested, "grad", ReduceOp::Sum)).unwrap_err();
    println!("{}", err); // INVALID_ARGUMENT: autodiff should not wrap an autodiff device: ...
    Ok(())
}
