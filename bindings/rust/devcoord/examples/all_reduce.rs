//! Puts a tensor on two devices, all-reduces them (sum) and prints the result.
//!
//!     cargo run --offline --example all_reduce -- tcp://127.0.0.1:7400 node-a/cuda:0 node-b/cuda:0

use devcoord::{Client, DeviceRef, OpRequest, ReduceOp};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let address = args.get(0).map_or("tcp://127.0.0.1:7400", |s| s.as_str());
    let a: DeviceRef = args.get(1).map_or("node-a/cuda:0", |s| s.as_str()).parse()?;
    let b: DeviceRef = args.get(2).map_or("node-b/cuda:0", |s| s.as_str()).parse()?;

    let client = Client::connect(address)?;
    client.put(&a.to_string(), "grad", &[1.0f32, 2.0, 3.0])?;
    client.put(&b.to_string(), "grad", &[10.0f32, 20.0, 30.0])?;
    let op = client.submit(&OpRequest::all_reduce(vec![a.clone(), b.clone()], "grad", ReduceOp::Sum))?;
    for d in [&a, &b] {
        let t = client.get::<f32>(&d.to_string(), "grad")?;
        println!("{} grad = {:?}", d, t.data);
    }
    println!("op {} {} in {} us", op.op_id, op.state, op.elapsed_us);
    Ok(())
}
